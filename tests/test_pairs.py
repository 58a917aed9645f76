"""``synth --pairs`` (issue 22, point 6): each sample also holds its original picture
(``orig.jpg``) and the mask (``mask.png``, 255 = removed), its json says how the mask was made
(rebuilt from the json alone, equal to the stored mask), the card declares both columns for
``datasets``; without the flag the samples and the fingerprint are as before; ``mix --unpair``
makes the original side of D ∪ D' from the pairs alone, which ``mix`` and ``train`` read as
original shards. Real runs of the local runner on a generated COCO-format set, read back with
the ``webdataset`` loader."""

import io
import json
import os

import numpy as np
import pytest
import webdataset as wds
from bad_coco import make_bad_coco, synth_args
from PIL import Image

from counterfactual.cli import main
from counterfactual.imageio import load_rgb
from counterfactual.shards.samples import SampleMeta, rebuild_mask, shard_paths
from counterfactual.synth.plan import fingerprint_of
from counterfactual.train.mix import plan_mix
from counterfactual.train.trainer import TrainConfig, plan_training

ARGS = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0",
        "--policy", "all", "--dilate", "2")  # fmt: skip


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"), n=16, size=(96, 72))


@pytest.fixture(scope="module")
def runs(coco, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    assert main(synth_args(coco, root / "pairs", *ARGS, "--pairs")) == 0
    assert main(synth_args(coco, root / "plain", *ARGS)) == 0
    return root / "pairs", root / "plain"


def _samples(out):
    urls = [str(p) for p in shard_paths(out)]
    return list(wds.WebDataset(urls, shardshuffle=False))


def _array(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im)


def test_each_pair_holds_its_original_and_a_mask_its_json_rebuilds(runs, coco):
    samples = _samples(runs[0])
    assert len(samples) == 48
    frames, inside = set(), []
    for s in samples:
        assert {"jpg", "json", "txt", "orig.jpg", "mask.png"} <= set(s)
        meta = SampleMeta.from_json(s["json"])
        assert meta.mask is not None
        assert (meta.mask.source, meta.mask.dilate, meta.mask.boxes) == ("box", 2, "dataset")
        frames.add(meta.mask.frame)  # the annotated size, which the boxes are in
        with Image.open(io.BytesIO(s["mask.png"])) as im:
            assert im.mode == "L" and im.size == (meta.width, meta.height)
        mask = _array(s["mask.png"])
        assert set(np.unique(mask)) <= {0, 255}
        assert np.count_nonzero(mask) == meta.mask_pixels > 0
        assert np.array_equal(rebuild_mask(meta), mask)
        orig, edited = _array(s["orig.jpg"]), _array(s["jpg"])
        assert orig.shape == edited.shape == (meta.height, meta.width, 3)
        source = load_rgb(coco.images / meta.file).astype(int)
        assert np.abs(orig.astype(int) - source).mean() < 4  # the same picture, JPEG again
        keep = mask == 0
        diff = np.abs(orig.astype(int) - edited.astype(int))
        assert diff[keep].mean() < 4  # outside the mask the edit is the original
        inside.append(diff[~keep].mean())
    assert np.mean(inside) > 10  # blurred inside the mask (a flat region stays as it was)
    assert (96, 72) in frames and len(frames) > 1  # one image is annotated at another size


def test_without_pairs_the_samples_and_fingerprint_are_as_before(runs):
    pairs, plain = (_samples(out) for out in runs)
    assert [s["__key__"] for s in pairs] == [s["__key__"] for s in plain]
    for p, q in zip(pairs, plain, strict=True):
        assert set(q) == {"__key__", "__url__", "__local_path__", "jpg", "json", "txt"} & set(q)
        assert "orig.jpg" not in q and "mask.png" not in q
        assert p["jpg"] == q["jpg"] and p["txt"] == q["txt"]
        p_meta, q_meta = json.loads(p["json"]), json.loads(q["json"])
        assert "mask" not in q_meta and p_meta.pop("mask")
        assert p_meta == q_meta
    pair_config = json.loads((runs[0] / "run.json").read_text())["config"]
    plain_config = json.loads((runs[1] / "run.json").read_text())["config"]
    assert pair_config.pop("pairs") is True and pair_config == plain_config
    assert "pairs" not in plain_config and "pairs" not in fingerprint_of({"pairs": False})


def test_a_plain_run_does_not_resume_as_pairs(runs, coco, capsys):
    assert main(synth_args(coco, runs[1], *ARGS, "--pairs")) == 2
    assert "different config" in capsys.readouterr().err


def test_hugging_face_datasets_reads_the_pair_columns(runs, tmp_path):
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset(str(runs[0]), split="train", cache_dir=str(tmp_path))
    assert isinstance(ds.features["orig.jpg"], datasets.Image)
    assert isinstance(ds.features["mask.png"], datasets.Image)
    row = ds[0]
    assert row["orig.jpg"].size == row["jpg"].size == row["mask.png"].size
    assert row["json"]["mask"]["dilate"] == 2


def test_mix_unpair_makes_the_original_side_from_the_pairs(runs, tmp_path, capsys):
    originals = tmp_path / "originals"
    argv = ["mix", "--unpair", str(originals), "--synthetic", str(runs[0]), "--ratio", "0.5"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    pairs = _samples(runs[0])
    metas = [json.loads(s["json"]) for s in pairs]
    distinct = {(m["image_id"], m["caption_id"]) for m in metas}
    assert len(distinct) == 10 < len(pairs)  # --policy all: several targets per picture
    assert printed.startswith(f"10 originals of 48 pair samples written to {originals} in 8")
    assert "--train-data" in printed
    by_image = {(m["image_id"], m["caption_id"]): (s, m) for s, m in zip(pairs, metas, strict=True)}
    got = list(wds.WebDataset(sorted(str(p) for p in originals.glob("orig-*.tar")),
                              shardshuffle=False))  # fmt: skip
    assert len(got) == 10
    for o in got:
        meta = json.loads(o["json"])
        pair, pair_meta = by_image[(meta["image_id"], meta["caption_id"])]
        assert o["jpg"] == pair["orig.jpg"]
        assert o["txt"].decode() == pair_meta["original_caption"]
    # 5 pair shards, fewer than the 8 loader workers: the 10 originals split over 8 shards
    assert json.loads((originals / "sizes.json").read_text()) == {
        f"orig-00000{i}.tar": n for i, n in enumerate((2, 2, 1, 1, 1, 1, 1, 1))}  # fmt: skip
    plan = plan_mix([str(originals)], [str(runs[0])], 0.5)
    assert (plan.original.samples, plan.synthetic.samples) == (10, 48)
    train = plan_training(TrainConfig(model="unused", original=(str(originals),),
                                      synthetic=(str(runs[0]),), mix="union"))  # fmt: skip
    assert (train.original_samples, train.synthetic_samples) == (10, 48)


def test_mix_unpair_refuses_shards_without_pairs(runs, tmp_path, capsys):
    argv = ["mix", "--unpair", str(tmp_path / "o"), "--synthetic", str(runs[1]), "--ratio", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds no orig.jpg; make the run with synth --pairs" in err


@pytest.mark.slow
def test_train_reads_the_unpaired_originals_and_the_pairs(runs, tmp_path, capsys):
    """``counterfactual train --mix union`` on the originals ``mix --unpair`` wrote and the pair
    shards (whose extra members it ignores): one epoch of a tiny CLIP over all 58 samples."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tiny_clip import build_tiny_clip

    originals = tmp_path / "originals"
    argv = ["mix", "--unpair", str(originals), "--synthetic", str(runs[0]), "--ratio", "1"]
    assert main(argv) == 0
    model = build_tiny_clip(tmp_path / "clip", seed=0)
    out = tmp_path / "train"
    argv = ["train", "--model", str(model), "--original", str(originals)]
    argv += ["--synthetic", str(runs[0]), "--mix", "union", "--out", str(out)]
    argv += ["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--device", "cpu"]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "10 original samples in 8 shards, 48 synthetic in 5 shards" in printed
    result = json.loads((out / "train.json").read_text())
    assert result["result"]["samples"] == 58 and result["result"]["synthetic"] == 48


@pytest.mark.parametrize("verify", ["off", "record"])
def test_the_original_travels_to_encode_only_with_pairs(verify):
    """Each step's declaration: with ``--pairs`` no step before ``Encode`` drops the original
    (verification or not), and ``Encode`` needs it; without, ``Edit`` or ``Verify`` drops it."""
    from counterfactual.method.verify import VerifyConfig
    from counterfactual.synth.job import planned_fields
    from counterfactual.synth.plan import SynthConfig
    from counterfactual.synth.staging import check_order, plan_steps

    for pairs in (False, True):
        config = SynthConfig(verify=VerifyConfig(mode=verify), pairs=pairs)
        specs = {s.name: s for s in plan_steps(config)}
        check_order(list(specs.values()), planned_fields(config))
        dropped_by = [n for n, s in specs.items() if "image" in s.drops]
        assert ("image" in specs["encode"].needs) is pairs
        expected = ["encode"] if pairs else ["verify" if verify != "off" else "edit", "encode"]
        assert dropped_by == expected
