"""`counterfactual train`: a tiny CLIP learns colour words from real shards, on CPU, offline."""

import io
import json
import math

import numpy as np
import pytest
import webdataset as wds
from PIL import Image
from tiny_clip import build_tiny_clip

from counterfactual.cli import main
from counterfactual.train.trainer import TrainConfig, plan_training, train_clip

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 190, 40),
    "blue": (30, 40, 220),
    "yellow": (235, 220, 30),
    "black": (10, 10, 10),
    "white": (245, 245, 245),
    "purple": (140, 30, 170),
    "orange": (245, 140, 20),
}


def _jpeg(rgb, rng):
    noise = rng.integers(-25, 26, size=(20, 20, 3))
    pixels = np.clip(np.array(rgb) + noise, 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    return buf.getvalue()


def write_shards(folder, prefix, shards, per_shard, seed, bad=None):
    """Shards of noisy solid-colour pictures captioned with their colour word. `bad` maps a
    sample index (within each shard) to replacement fields, e.g. a corrupt jpg."""
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
    root = tmp_path_factory.mktemp("train")
    return {
        "model": str(build_tiny_clip(root / "clip", seed=0)),
        "original": write_shards(root / "original", "orig", 2, 32, seed=1),
        "synthetic": write_shards(root / "synthetic", "synth", 1, 16, seed=2),
        "root": root,
    }


def config(data, **overrides):
    base = dict(
        model=data["model"],
        original=data["original"],
        synthetic=data["synthetic"],
        ratio=0.25,
        epochs=1,
        batch_size=4,
        lr=1e-3,
        samples_per_epoch=16,
        shuffle_buffer=16,
        device="cpu",
        log_every=1,
    )
    return TrainConfig(**{**base, **overrides})


def log_rows(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def state_dict(folder):
    return transformers.CLIPModel.from_pretrained(str(folder)).state_dict()


@pytest.fixture(scope="module")
def learned(data):
    """30 steps of batch 8 over two epochs, the lr halved after the first."""
    out = data["root"] / "run"
    cfg = config(data, epochs=2, batch_size=8, samples_per_epoch=120, lr_decay_every=1)
    seen = []
    result = train_clip(cfg, out, progress=seen.append)
    return cfg, out, result, seen


def test_the_loss_goes_down(learned):
    _, out, result, seen = learned
    losses = [row["loss"] for row in log_rows(out)]
    assert len(losses) == result.steps == 30
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    # 8 captions over batches of 8: chance is about ln 8 = 2.08; a model that reads the colour
    # only confuses pictures of the same colour within a batch.
    assert first > 1.6
    assert last < 0.6 * first, (first, last)
    assert result.first_loss == losses[0] and result.last_loss == losses[-1]
    assert [row.loss for row in seen] == losses


def test_log_schedule_and_output_folders(learned, data):
    cfg, out, result, _ = learned
    rows = log_rows(out)
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert {r["epoch"]: r["lr"] for r in rows} == {1: 1e-3, 2: 5e-4}
    assert all(r["samples_per_s"] > 0 for r in rows)
    assert rows[-1]["samples"] == result.samples == 240
    for name in ("epoch-01", "epoch-02", "final"):
        assert (out / name / "config.json").is_file(), name
        assert (out / name / "tokenizer_config.json").is_file() or (
            out / name / "processor_config.json"
        ).is_file(), name
    # only the newest epoch keeps the optimizer state a resume needs
    assert not (out / "epoch-01" / "optimizer.pt").exists()
    assert (out / "epoch-02" / "optimizer.pt").is_file()
    info = json.loads((out / "train.json").read_text())
    assert info["status"] == "done" and info["config"] == cfg.to_dict()
    assert info["plan"]["steps_per_epoch"] == 15 and info["plan"]["original_samples"] == 64
    assert {"torch", "transformers", "python"} <= info["versions"].keys()
    assert info["result"]["steps"] == 30


def test_final_folder_reloads_by_path_and_has_learned(learned, data):
    _, out, _, _ = learned
    before, after = state_dict(data["model"]), state_dict(out / "final")
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert "text_projection.weight" in changed and "visual_projection.weight" in changed
    assert all(torch.equal(after[k], v) for k, v in state_dict(out / "epoch-02").items())
    processor = transformers.AutoProcessor.from_pretrained(str(out / "final"))
    model = transformers.CLIPModel.from_pretrained(str(out / "final")).eval()
    images = [Image.open(io.BytesIO(_jpeg(COLOURS[w], np.random.default_rng(9)))) for w in COLOURS]
    inputs = processor(
        text=list(COLOURS), images=images, return_tensors="pt", padding=True, truncation=True
    )
    with torch.no_grad():
        logits = model(**inputs).logits_per_image
    # the fine-tuned model names most colours; the random one about 1 in 8
    assert (logits.argmax(1) == torch.arange(len(COLOURS))).sum() >= 6


def test_synthetic_samples_are_drawn_at_the_ratio(learned):
    cfg, out, result, _ = learned
    # ratio 0.25 synthetic per original: 20% of 240 draws, 48 expected (sd 6.2)
    assert result.synthetic == log_rows(out)[-1]["synthetic"]
    assert abs(result.synthetic / result.samples - 0.2) < 0.07, result.synthetic
    assert 0.15 < result.synthetic_per_original < 0.4
    assert result.skipped == {}


def test_plan_sizes_the_epoch_from_the_counts(data):
    plan = plan_training(config(data, samples_per_epoch=None))
    assert (plan.original_samples, plan.synthetic_samples) == (64, 16)
    assert plan.samples_per_epoch == 80 and plan.steps_per_epoch == 20  # 64 x 1.25, batch 4
    alone = plan_training(config(data, synthetic=(), samples_per_epoch=None, batch_size=5))
    assert (alone.samples_per_epoch, alone.steps_per_epoch, alone.synthetic_fraction) == (64, 13, 0)


def test_bad_samples_are_skipped_and_counted(data):
    bad = {
        1: {"jpg": b"not a jpeg"},
        2: {"txt": "  "},
        4: {"jpg": _jpeg((1, 2, 3), np.random.default_rng(0))[:40]},
    }
    shard = write_shards(data["root"] / "bad", "bad", 1, 8, seed=3, bad=bad)
    out = data["root"] / "bad-run"
    result = train_clip(config(data, original=shard, synthetic=(), shuffle_buffer=0), out)
    assert result.samples == 16 and result.synthetic == 0  # D only
    # 5 good samples per pass of the shard, 4 passes for 16: 4 x 2 corrupt, then 3-4 empty
    assert result.skipped["decode-error"] >= 6 and result.skipped["empty-caption"] >= 3
    assert set(result.skipped) == {"decode-error", "empty-caption"}
    assert log_rows(out)[-1]["skipped"] == sum(result.skipped.values())


def test_all_bad_samples_fail_loudly(data):
    with pytest.raises(ValueError, match="bad samples in a row"):
        train_clip(config(data, image_key="png"), data["root"] / "no-png")


def test_resume_gives_the_same_weights_as_one_run(data):
    straight, split = data["root"] / "straight", data["root"] / "split"
    two = config(data, epochs=2, lr_decay_every=1, shuffle_buffer=8)
    one = config(data, epochs=1, lr_decay_every=1, shuffle_buffer=8)
    a = train_clip(two, straight)
    assert train_clip(one, split).resumed_from == 0
    b = train_clip(two, split)
    assert b.resumed_from == 1 and b.steps == a.steps == 8 and b.synthetic == a.synthetic
    resumed = state_dict(split / "final")
    for k, v in state_dict(straight / "final").items():
        assert torch.equal(v, resumed[k]), k
    drop = "samples_per_s"
    assert [{k: v for k, v in r.items() if k != drop} for r in log_rows(split)] == [
        {k: v for k, v in r.items() if k != drop} for r in log_rows(straight)
    ]
    with pytest.raises(ValueError, match="another config.*lr"):
        train_clip(config(data, epochs=2, lr_decay_every=1, shuffle_buffer=8, lr=1e-4), split)
    with pytest.raises(ValueError, match="more than epochs"):
        train_clip(one, split)


def test_one_loader_worker_trains_the_weights_of_none(data):
    """What ``experiment --workers`` says: decoding in one DataLoader worker beside the step
    trains the same weights to the bit as decoding in the step; two workers shuffle each their
    own share of the samples, and train others."""
    weights = {}
    for workers in (0, 1, 2):
        out = data["root"] / f"workers-{workers}"
        assert train_clip(config(data, shuffle_buffer=8, num_workers=workers), out).steps == 4
        weights[workers] = state_dict(out / "final")
    for k, v in weights[0].items():
        assert torch.equal(v, weights[1][k]), k
    assert any(not torch.equal(v, weights[2][k]) for k, v in weights[0].items())


@pytest.mark.parametrize(
    "overrides",
    [
        {"ratio": 0},
        {"ratio": -0.1},
        {"ratio": math.nan},
        {"epochs": 0},
        {"batch_size": 0},
        {"batch_size": True},
        {"batch_size": 8.0},
        {"lr": 0},
        {"lr": math.inf},
        {"lr_decay": 0},
        {"lr_decay": 1.5},
        {"lr_decay_every": 0},
        {"optimizer": "sgd"},
        {"precision": "fp8"},
        {"betas": (0.9,)},
        {"betas": (0.9, 1.0)},
        {"weight_decay": -0.1},
        {"grad_clip_norm": 0},
        {"samples_per_epoch": 0},
        {"num_workers": -1},
        {"shuffle_buffer": -1},
        {"log_every": 0},
        {"original": ()},
        {"model": ""},
        {"image_key": ""},
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_bad_config_values_raise(data, overrides):
    name = next(iter(overrides))
    with pytest.raises(ValueError, match=name):
        config(data, **overrides)


def test_paper_defaults_and_lr_steps(data):
    cfg = TrainConfig(model=data["model"], original=data["original"])
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.optimizer, cfg.ratio) == (
        10,
        256,
        2e-6,
        "adam",
        0.1,
    )
    assert [cfg.lr_at(e) for e in range(10)] == [2e-6] * 2 + [1e-6] * 2 + [5e-7] * 2 + [
        2.5e-7
    ] * 2 + [1.25e-7] * 2
    assert cfg.original == (data["original"],) and cfg.synthetic == ()


def test_bad_runs_fail_before_training(data, tmp_path):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        train_clip(config(data, precision="bf16"), tmp_path / "a")
    with pytest.raises(ValueError, match="no such file"):
        train_clip(config(data, synthetic=str(tmp_path / "none.tar")), tmp_path / "b")
    with pytest.raises(ValueError, match="could not load CLIP"):
        train_clip(config(data, model=str(tmp_path)), tmp_path / "c")
    if not torch.cuda.is_available():
        # one line saying why (no driver, a CPU build, a driver too old, no GPU)
        with pytest.raises(
            ValueError, match="--device cuda: .*(no NVIDIA driver|CPU build|too old|no GPU)"
        ):
            train_clip(config(data, device="cuda"), tmp_path / "d")


def test_cli_trains_end_to_end(data, tmp_path, capsys):
    out = tmp_path / "cli"
    argv = ["train", "--model", data["model"], "--original", data["original"]]
    argv += ["--synthetic", data["synthetic"], "--ratio", "0.25", "--out", str(out)]
    argv += ["--epochs", "1", "--batch-size", "4", "--lr", "1e-3", "--samples-per-epoch", "12"]
    argv += ["--device", "cpu", "--log-every", "2"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "64 original samples in 2 shards, 16 synthetic" in printed
    assert "epoch 1 step 2 lr 0.001 loss" in printed
    last = printed.strip().splitlines()[-1]
    assert last.startswith("loss ") and " -> " in last and "over 3 steps" in last
    assert [r["step"] for r in log_rows(out)] == [2, 3]
    assert transformers.CLIPModel.from_pretrained(str(out / "final")) is not None
    with pytest.raises(SystemExit) as exit_:
        main(argv[:-4] + ["--ratio", "0"])
    assert exit_.value.code == 2
    assert "argument --ratio: 0 is not a number > 0" in capsys.readouterr().err


def test_a_run_from_before_recipes_resumes(data, tmp_path):
    """train.json of older runs: no recipe or mix, lr_decay_every an integer."""
    out = tmp_path / "old"
    train_clip(config(data, epochs=1, lr_decay_every=1), out)
    info = json.loads((out / "train.json").read_text())
    for key in ("recipe", "mix"):
        del info["config"][key]
    info["config"]["lr_decay_every"] = 1
    (out / "train.json").write_text(json.dumps(info))
    resumed = train_clip(config(data, epochs=2, lr_decay_every=1), out)
    assert resumed.resumed_from == 1 and resumed.steps == 8
    assert {r["epoch"]: r["lr"] for r in log_rows(out)} == {1: 1e-3, 2: 5e-4}
    with pytest.raises(ValueError, match="another config.*recipe: 'clip' -> 'blip'"):
        train_clip(config(data, epochs=3, lr_decay_every=1, recipe="blip"), out)
