"""`counterfactual train --recipe blip`: a tiny BLIP learns colour words on CPU, offline; the
fractional-epoch lr schedule; `--mix union` reads every sample of D ∪ D' once per epoch."""

import io
import json
import math
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import webdataset as wds
from PIL import Image
from tiny_blip_retrieval import build_tiny_blip_retrieval
from tiny_clip import build_tiny_clip

from counterfactual.cli import main
from counterfactual.models import load_embedder
from counterfactual.train.trainer import (
    BLIP_TEMPERATURE,
    RECIPES,
    TrainConfig,
    contrastive_loss,
    epoch_samples,
    fine_tune,
    plan_training,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# Caption words the tiny BLIP's WordPiece vocabulary holds, one per colour of picture.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 190, 40),
    "blue": (30, 40, 220),
    "dog": (235, 220, 30),
    "cat": (10, 10, 10),
    "bus": (245, 245, 245),
    "car": (140, 30, 170),
    "tree": (245, 140, 20),
}
N_ORIGINAL, N_SYNTHETIC = 2 * 64, 31  # 159 samples: 19 batches of 8 and one of 7 per epoch


def _jpeg(rgb, rng):
    noise = rng.integers(-25, 26, size=(20, 20, 3))
    pixels = np.clip(np.array(rgb) + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def write_shards(folder, prefix, shards, per_shard, seed, bad=None):
    """Shards of noisy solid-colour pictures captioned with their word; `bad` maps a sample
    index (within each shard) to replacement fields."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    for s in range(shards):
        with wds.TarWriter(str(folder / f"{prefix}-{s:06d}.tar")) as sink:
            for i in range(per_shard):
                word = names[rng.integers(len(names))]
                sample = {"__key__": f"{prefix}{s}_{i:04d}", "jpg": _jpeg(COLOURS[word], rng)}
                sample["txt"] = word
                sample.update((bad or {}).get(i, {}))
                sink.write(sample)
    return str(folder / f"{prefix}-{{000000..{shards - 1:06d}}}.tar")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-blip")
    return {
        "model": str(build_tiny_blip_retrieval(root / "blip", seed=3)),
        "original": write_shards(root / "original", "orig", 2, 64, seed=1),
        "synthetic": write_shards(root / "synthetic", "synth", 1, N_SYNTHETIC, seed=2),
        "root": root,
    }


def config(data, **overrides):
    base = dict(
        model=data["model"],
        original=data["original"],
        synthetic=data["synthetic"],
        recipe="blip",
        mix="union",
        batch_size=8,
        lr=1e-3,
        shuffle_buffer=16,
        device="cpu",
        log_every=1,
    )
    return TrainConfig(**{**base, **overrides})


def log_rows(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def state_dict(folder):
    return transformers.BlipForImageTextRetrieval.from_pretrained(str(folder)).state_dict()


@pytest.fixture(scope="module")
def learned(data):
    """The BLIP recipe (2 epochs, AdamW, weight decay 0.05, lr halved every half epoch) at a
    tiny model's lr and batch: 40 steps over D ∪ D', each sample once per epoch."""
    out = data["root"] / "run"
    cfg = config(data)
    seen = []
    result = fine_tune(cfg, out, progress=seen.append)
    return cfg, out, result, seen


def test_the_loss_goes_down(learned):
    _, out, result, seen = learned
    losses = [row["loss"] for row in log_rows(out)]
    assert len(losses) == result.steps == 40
    # Mean of 5 steps away from each epoch's last batch (7 pairs, an easier task than 8).
    first, last = np.mean(losses[:5]), np.mean(losses[-6:-1])
    # 8 captions over batches of 8: chance is about ln 8 = 2.08.
    assert first > 1.6
    assert last < 0.6 * first, (first, last)
    assert [row.loss for row in seen] == losses


def test_recipe_schedule_halves_the_lr_every_half_epoch(learned):
    cfg, out, result, _ = learned
    rows = log_rows(out)
    assert [r["step"] for r in rows] == list(range(1, 41))
    # 20 steps per epoch: the lr halves after steps 10, 20 and 30
    assert [r["lr"] for r in rows] == [1e-3] * 10 + [5e-4] * 10 + [2.5e-4] * 10 + [1.25e-4] * 10
    assert [r["epoch"] for r in rows] == [1] * 20 + [2] * 20
    info = json.loads((out / "train.json").read_text())
    assert info["config"] == cfg.to_dict() and info["recipe"] == RECIPES["blip"].to_dict()
    assert info["config"]["optimizer"] == "adamw" and info["config"]["weight_decay"] == 0.05
    assert info["plan"]["steps_per_epoch"] == 20 and info["plan"]["mix"] == "union"


def test_union_reads_each_sample_once_per_epoch(learned):
    _, out, result, _ = learned
    total = N_ORIGINAL + N_SYNTHETIC
    assert (result.samples, result.synthetic) == (2 * total, 2 * N_SYNTHETIC)
    assert result.skipped == {}
    rows = log_rows(out)
    assert [rows[i]["samples"] for i in (18, 19, 38, 39)] == [152, 159, 311, 318]
    assert rows[19]["synthetic"] == N_SYNTHETIC


def test_final_folder_loads_for_eval_and_has_learned(learned, data):
    _, out, _, _ = learned
    before, after = state_dict(data["model"]), state_dict(out / "final")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "vision_proj.weight" in changed and "text_proj.weight" in changed
    assert not any(k.startswith("itm_head.") for k in changed)  # ITC only
    assert all(torch.equal(after[k], v) for k, v in state_dict(out / "epoch-02").items())
    rng = np.random.default_rng(9)
    images = [Image.open(io.BytesIO(_jpeg(rgb, rng))) for rgb in COLOURS.values()]
    right = {}
    for name, folder in (("random", data["model"]), ("fine-tuned", out / "final")):
        embedder = load_embedder(f"blip:{folder}", device="cpu")  # what `counterfactual eval` does
        similarity = embedder.embed_images(images) @ embedder.embed_texts(list(COLOURS)).T
        right[name] = int((similarity.argmax(1) == np.arange(len(COLOURS))).sum())
    # the fine-tuned model names most colours (6 on the CPU we checked); chance is 1 in 8
    assert right["fine-tuned"] >= 5 and right["fine-tuned"] > right["random"], right


def test_union_epochs_are_shuffled_and_split_between_workers(data):
    cfg = config(data)
    plan = plan_training(cfg)
    assert (plan.samples_per_epoch, plan.steps_per_epoch) == (159, 20)
    assert plan.ratio == N_SYNTHETIC / N_ORIGINAL and plan.synthetic_fraction == 31 / 159

    def keys(epoch, workers=0):
        loader = torch.utils.data.DataLoader(
            epoch_samples(cfg, plan, epoch), batch_size=None, num_workers=workers
        )
        return [sample["__key__"] for sample in loader]

    first = keys(0)
    assert len(first) == 159 and set(Counter(first).values()) == {1}
    synthetic = [k.startswith("synth") for k in first]
    assert sum(synthetic) == N_SYNTHETIC
    # interleaved in proportion, not the synthetic shard read as one block
    assert sum(synthetic[:80]) > 8 and sum(synthetic[80:]) > 8
    assert keys(0) == first  # seeded
    orders = {tuple(first), tuple(keys(1)), tuple(keys(2))}
    assert len(orders) > 1 and all(sorted(o) == sorted(first) for o in orders)
    split = keys(0, workers=2)
    assert sorted(split) == sorted(first) and len(split) == 159


def test_union_with_workers_puts_the_last_samples_together(data, tmp_path):
    original = write_shards(tmp_path / "o", "o", 2, 11, seed=5)
    synthetic = write_shards(tmp_path / "s", "s", 1, 7, seed=6)
    cfg = config(data, original=original, synthetic=synthetic, epochs=1, batch_size=4)
    result = fine_tune(replace(cfg, num_workers=2, lr=1e-4), tmp_path / "workers")
    # 29 samples: each worker ends with fewer than a batch; their rest makes two batches, the
    # last of one sample
    assert (result.steps, result.samples, result.synthetic) == (8, 29, 7)


def test_union_counts_bad_samples_exactly(data, tmp_path):
    bad = {1: {"jpg": b"not a jpeg"}, 5: {"txt": " "}}
    shard = write_shards(tmp_path / "bad", "bad", 2, 10, seed=3, bad=bad)
    cfg = config(data, original=shard, synthetic=(), epochs=1, batch_size=4, lr=1e-4)
    result = fine_tune(cfg, tmp_path / "bad-run")
    assert result.skipped == {"decode-error": 2, "empty-caption": 2}
    assert (result.samples, result.synthetic, result.steps) == (16, 0, 4)
    assert log_rows(tmp_path / "bad-run")[-1]["skipped"] == 4


def test_resume_mid_schedule_gives_the_same_weights(data, tmp_path):
    small = write_shards(tmp_path / "small", "small", 2, 12, seed=4)
    two = config(data, original=small, synthetic=(), batch_size=5, lr=1e-4, epochs=2)
    one = config(data, original=small, synthetic=(), batch_size=5, lr=1e-4, epochs=1)
    straight, split = tmp_path / "straight", tmp_path / "split"
    fine_tune(two, straight)
    fine_tune(one, split)
    assert fine_tune(two, split).resumed_from == 1
    resumed = state_dict(split / "final")
    for k, v in state_dict(straight / "final").items():
        assert torch.equal(v, resumed[k]), k
    # 24 samples, 5 steps an epoch: halved at steps 2.5, 5 and 7.5
    assert [r["lr"] for r in log_rows(split)] == [1e-4] * 3 + [5e-5] * 2 + [2.5e-5] * 3 + [
        1.25e-5
    ] * 2


@pytest.mark.parametrize(
    ("every", "steps_per_epoch", "step", "halvings"),
    [
        (0.5, 20, 9, 0),
        (0.5, 20, 10, 1),
        (0.5, 20, 39, 3),
        (0.5, 15, 7, 0),  # the half epoch is step 7.5: the lr halves from step 8
        (0.5, 15, 8, 1),
        (0.5, 1, 1, 2),
        (0.3, 10, 2, 0),
        (0.3, 10, 3, 1),  # 3 / (10 x 0.3) is 1 exactly, though 10 * 0.3 > 3 in floats
        (0.1, 10, 7, 7),
        (2.0, 7, 13, 0),
        (2.0, 7, 14, 1),
        (1.5, 4, 6, 1),
        (1.5, 4, 11, 1),
        (1.5, 4, 12, 2),
    ],
)
def test_lr_at_step_is_exact(data, every, steps_per_epoch, step, halvings):
    cfg = config(data, lr=1.0, lr_decay_every=every)
    assert cfg.lr_at_step(step, steps_per_epoch) == 0.5**halvings
    assert cfg.lr_at(Fraction(step, steps_per_epoch)) == 0.5**halvings


def test_recipes_fill_what_is_not_given(data):
    blip = TrainConfig(model=data["model"], original=data["original"], recipe="blip")
    assert (blip.epochs, blip.batch_size, blip.optimizer, blip.lr) == (2, 16, "adamw", 1e-5)
    assert (blip.lr_decay, blip.lr_decay_every, blip.weight_decay) == (0.5, 0.5, 0.05)
    assert blip.max_text_length == 35 and blip.mix == "ratio"
    assert [blip.lr_at(e / 2) for e in range(4)] == [1e-5, 5e-6, 2.5e-6, 1.25e-6]
    clip = TrainConfig(model=data["model"], original=data["original"])
    assert (clip.recipe, clip.epochs, clip.batch_size, clip.optimizer, clip.lr) == (
        "clip",
        10,
        256,
        "adam",
        2e-6,
    )
    assert (clip.lr_decay_every, clip.weight_decay, clip.max_text_length) == (2.0, 0.0, 77)
    mine = TrainConfig(
        model=data["model"], original=data["original"], recipe="blip", epochs=5, weight_decay=0
    )
    assert (mine.epochs, mine.weight_decay, mine.batch_size) == (5, 0, 16)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"recipe": "vse"}, "recipe must be one of"),
        ({"mix": "natural"}, "mix must be one of"),
        ({"lr_decay_every": 0}, "lr_decay_every must be > 0"),
        ({"lr_decay_every": -0.5}, "lr_decay_every must be > 0"),
        ({"lr_decay_every": math.inf}, "lr_decay_every must be a finite number"),
        ({"samples_per_epoch": 100}, "samples_per_epoch=100 is for mix 'ratio'"),
        ({"max_text_length": 0}, "max_text_length must be an integer >= 1"),
    ],
)
def test_bad_config_values_raise(data, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(data, **overrides)


def test_contrastive_loss_is_symmetric_infonce():
    cosines = torch.tensor([[1.0, 0.0], [0.5, 1.0]])
    # image->text rows: log(1 + e^-1), log(1 + e^-0.5); text->image: log(1 + e^-0.5), log(1 + e^-1)
    expected = (math.log1p(math.exp(-1.0)) + math.log1p(math.exp(-0.5))) / 2
    assert contrastive_loss(cosines, 1.0).item() == pytest.approx(expected, rel=1e-6)
    assert contrastive_loss(torch.eye(3), BLIP_TEMPERATURE).item() < 1e-5


def test_a_model_of_another_family_is_refused(data, tmp_path):
    clip = build_tiny_clip(tmp_path / "clip")
    with pytest.raises(ValueError, match="'clip' model.*use recipe 'clip'"):
        fine_tune(config(data, model=str(clip)), tmp_path / "a")
    with pytest.raises(ValueError, match="'blip' model.*use recipe 'blip'"):
        fine_tune(config(data, recipe="clip"), tmp_path / "b")
    with pytest.raises(ValueError, match="could not load BLIP"):
        fine_tune(config(data, model=str(tmp_path)), tmp_path / "c")


def test_cli_trains_blip_on_the_union(data, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["train", "--recipe", "blip", "--model", data["model"], "--original", data["original"]]
    argv += ["--synthetic", data["synthetic"], "--mix", "union", "--out", str(out)]
    argv += ["--epochs", "1", "--batch-size", "40", "--lr", "1e-4", "--device", "cpu"]
    argv += ["--log-every", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "128 original samples in 2 shards, 31 synthetic in 1 shards, all once" in printed
    assert "natural ratio 0.2422 per original (19.5%)" in printed
    assert "blip: 1 epochs of 4 steps x 40, adamw lr 0.0001 x 0.5 every 0.5 epochs" in printed
    assert "epoch 1 step 2 lr 0.0001 loss" in printed and "epoch 1 step 3 lr 5e-05" in printed
    assert "159 samples, 31 synthetic" in printed.strip().splitlines()[-1]
    assert load_embedder(f"blip:{out / 'final'}", device="cpu").dim == 16
    info = json.loads((out / "train.json").read_text())
    assert info["config"]["weight_decay"] == 0.05 and info["config"]["max_text_length"] == 35


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--lr-decay-every", "0", "argument --lr-decay-every: 0 is not a number > 0"),
        ("--recipe", "vse", "argument --recipe: invalid choice"),
        ("--batch-size", "0.5", "argument --batch-size: '0.5' is not a whole number"),
    ],
)
def test_cli_refuses_bad_options(data, tmp_path, capsys, option, value, message):
    argv = ["train", "--model", data["model"], "--original", data["original"]]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--out", str(tmp_path / "x"), option, value])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_cli_help_shows_each_recipes_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: clip 10, blip 2" in text and "default: clip 2e-06, blip 1e-05" in text
    assert (
        "(default: clip 2, blip 0.5, scratch 0.4)" in text
        and "default: clip adam, blip adamw" in text
    )
