"""End to end through the command a user types, on a generated COCO-format dataset with bad
inputs; shards are read back with the webdataset loader."""

import json
import shutil

import numpy as np
import pytest
import webdataset as wds
from bad_coco import ODD_CAPTION, make_bad_coco, synth_args
from PIL import Image

from counterfactual.cli import main


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"))


def synth(files, out, *extra):
    return main(
        synth_args(
            files,
            out,
            "--images-per-shard",
            "3",
            "--max-pixels",
            "1000000",
            "--contact-sheet",
            "2",
            *extra,
        )
    )


def read_status(out):
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


def read_shards(out):
    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    return list(
        wds.WebDataset(urls, shardshuffle=False)
        .decode("pil")
        .to_tuple("__key__", "jpg", "txt", "json")
    )


@pytest.fixture(scope="module")
def run(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    assert synth(coco, out, "--image-method", "blur", "--policy", "all") == 0
    return out


def test_every_image_is_accounted_for(run):
    rows = read_status(run)
    assert {r["image_id"] for r in rows} == {str(i) for i in range(1, 15)}
    by_image = {}
    for r in rows:
        by_image.setdefault(r["image_id"], []).append(r)
    reason = {i: {(r["status"], r["reason"]) for r in rs} for i, rs in by_image.items()}
    assert reason["1"] == {("failed", "decode-error")}
    assert reason["2"] == {("failed", "missing-file")}
    assert reason["3"] == {("failed", "decode-error")}
    assert reason["7"] == {("failed", "image-too-large")}
    assert reason["8"] == {("failed", "unsafe-path")}
    assert reason["9"] == {("failed", "bad-annotation")}
    assert reason["12"] == {("failed", "size-mismatch")}
    for good in ("4", "5", "6", "11"):  # CMYK, grayscale, EXIF-rotated, odd Unicode
        assert ("written", None) in reason[good], (good, reason[good])
    assert all(r["reason"] for r in rows if r["status"] != "written")


def test_shards_read_back_with_webdataset(run):
    rows = read_status(run)
    written = {r["key"] for r in rows if r["status"] == "written"}
    samples = read_shards(run)
    assert {s[0] for s in samples} == written and len(samples) == len(written)
    tars = sorted(run.glob("shard-*.tar"))
    assert [p.name for p in tars][:2] == ["shard-000000.tar", "shard-000001.tar"]
    for tar in tars:
        stats = json.loads(tar.with_name(tar.stem + "_stats.json").read_text())
        assert stats["count"] == len(stats["keys"]) <= stats["items"]
        assert stats["images"] <= 3  # --images-per-shard 3: the shard holds what they yield
        image_ids = {s["image_id"] for s in stats["status"]}
        assert len(image_ids) <= 3 and {k.split("_")[0] for k in stats["keys"]} <= image_ids
    for key, image, text, meta in samples:
        assert "." not in key
        assert isinstance(image, Image.Image) and image.mode == "RGB"
        assert (image.width, image.height) == (meta["width"], meta["height"])
        assert text == meta["caption"]
        assert meta["plan"]["image_id"] == meta["image_id"]
        for field in (
            "original_caption",
            "caption_id",
            "file",
            "mask_boxes",
            "seed",
            "image_method",
            "text_method",
            "removed_phrases",
        ):
            assert field in meta
        assert meta["plan"]["evidence"]["removed_fraction"]["alpha3"] == 0.7
        assert meta["image_method"]["method"] == "blur"
        # the new caption does not keep a removed phrase
        for phrase in meta["removed_phrases"]:
            assert phrase in meta["original_caption"]
    odd = [m for *_, m in samples if m["image_id"] == "11"]
    # the reader removed the zero-width space and made the tab a space (text.clean)
    cleaned = ODD_CAPTION.replace("\u200b", "").replace("\t", " ")
    assert odd and all(m["original_caption"] == cleaned for m in odd)
    assert all(m["caption_cleaned"] == 2 for m in odd)
    assert (run / "contact_sheet.png").exists()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["samples"] == len(samples) and manifest["runner"] == "local"
    assert manifest["inputs"] == 14 and manifest["counts"]["failed:unsafe-path"] == 1
    assert manifest["versions"]["counterfactual"] and manifest["config"]["seed"] == 0
    assert set(manifest["stages"]) == {"decode", "edit", "rewrite", "encode"}


def test_pixels_outside_the_mask_survive_jpeg(run, coco):
    for _key, image, _text, meta in read_shards(run):
        if meta["image_id"] != "13":
            continue
        original = np.asarray(Image.open(coco.images / meta["file"]).convert("RGB"), dtype=int)
        edited = np.asarray(image, dtype=int)
        keep = np.ones(original.shape[:2], bool)
        for x, y, w, h in meta["mask_boxes"]:
            keep[int(y) : int(np.ceil(y + h)), int(x) : int(np.ceil(x + w))] = False
        # a re-encoded JPEG: equal up to compression noise
        assert np.abs(original - edited)[keep].mean() < 3


def test_same_config_same_output(coco, tmp_path, run):
    assert synth(coco, tmp_path, "--image-method", "blur", "--policy", "all") == 0
    first = [(k, t) for k, _, t, _ in read_shards(run)]
    assert [(k, t) for k, _, t, _ in read_shards(tmp_path)] == first


def test_seed_changes_the_choice(coco, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert synth(coco, a, "--image-method", "zero", "--seed", "1") == 0
    assert synth(coco, b, "--image-method", "zero", "--seed", "2") == 0
    ka = [k for k, *_ in read_shards(a)]
    kb = [k for k, *_ in read_shards(b)]
    assert ka != kb and len(ka) == len(kb)


@pytest.mark.slow
def test_opencv_inpaint_and_prompt(coco, tmp_path):
    assert synth(coco, tmp_path, "--image-method", "inpaint", "--text-method", "prompt") == 0
    samples = read_shards(tmp_path)
    assert samples and all(
        t.startswith(("a ", "an ", "the ", "itap", "graffiti", "art")) for _, _, t, _ in samples
    )


def test_bad_configuration_fails_loudly(coco, tmp_path, capsys):
    assert synth(coco, tmp_path, "--alpha1", "0.9") == 2
    assert "alpha1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        synth(coco, tmp_path, "--image-method", "paint")


def test_missing_annotation_file_is_a_clear_error(tmp_path, capsys):
    code = main(
        [
            "synth",
            "--dataset",
            "coco",
            "--instances",
            str(tmp_path / "nope.json"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert code == 2 and "nope.json" in capsys.readouterr().err
    shutil.rmtree(tmp_path / "o", ignore_errors=True)


def test_sample_keys_are_stable_and_dotless():
    from counterfactual.shards.shards import sample_key

    assert sample_key("123", "person", "45") == "123_person_45"
    odd = sample_key("a.b", "hot dog", "x_y")
    assert "." not in odd and " " not in odd and odd != sample_key("a-b", "hot dog", "x_y")


def test_shard_writer_commits_the_tar_then_its_stats(tmp_path):
    from counterfactual.records import Status
    from counterfactual.shards.shards import Sample, ShardStats, ShardWriter, read_stats

    def item(i):
        if i == 3:  # a failed item: a status row, no sample
            return None, Status(str(i), "failed", "decode-error", "", f"k{i}", "dog")
        return Sample(f"k{i}", b"\xff\xd8", f"t{i}", {"i": i}), Status(str(i), "written")

    for shard, items in enumerate([(0, 1), (2, 3), (4,)]):
        writer = ShardWriter(tmp_path, shard, input=f"in{shard}", node="n")
        writer.add(None, Status("skipped-image", "skipped", "no-removable-class"), item=False)
        for i in items:
            writer.add(*item(i), {"decode": 0.5})
        writer.images = len(items) + 1
        stats = writer.commit()
        assert stats.shard == f"shard-{shard:06d}.tar"
    assert not list(tmp_path.glob("*.tmp"))
    done = read_stats(tmp_path)
    assert sorted(done) == [0, 1, 2]
    assert (done[1].count, done[1].items, done[1].keys, done[1].images) == (1, 2, ("k2",), 3)
    assert [s.reason for s in done[1].status] == ["no-removable-class", None, "decode-error"]
    assert (done[1].input, done[1].node, done[1].seconds) == ("in1", "n", {"decode": 1.0})
    assert done[1].counts() == {
        "skipped:no-removable-class": 1,
        "written": 1,
        "failed:decode-error": 1,
    }
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    rows = list(wds.WebDataset(urls, shardshuffle=False))
    assert [r["__key__"] for r in rows] == ["k0", "k1", "k2", "k4"]
    with pytest.raises(ValueError, match="dot"):
        ShardWriter(tmp_path / "x", 0).add(Sample("a.b", b"", "", {}), Status("a", "written"))
    # a writer that stops half-way leaves nothing behind, and a tar without stats is not
    # committed
    (tmp_path / "half").mkdir()
    half = ShardWriter(tmp_path / "half", 0)
    half.add(*item(0))
    half.abort()
    assert not list((tmp_path / "half").iterdir())
    (tmp_path / "shard-000003.tar").write_bytes(b"")
    assert sorted(read_stats(tmp_path)) == [0, 1, 2]
    # the stats file reads back as written, and a bad one is named by its key path
    written = json.loads((tmp_path / "shard-000001_stats.json").read_text())
    assert ShardStats.from_dict(written) == done[1]
    assert ShardStats.from_dict(written).to_dict() == written
    written["status"][2]["key"] = 7
    with pytest.raises(
        ValueError, match=r"Expected `str \| null`, got `int` - at `\$\.status\[2\]\.key`"
    ):
        ShardStats.from_dict(written)


@pytest.mark.slow
def test_diffusers_inpainting_and_captioner_through_the_command(coco, tmp_path):
    """A user's model path goes through the same loading code: tiny random models saved to disk."""
    from tiny_captioner import build_tiny_blip

    from counterfactual.testing import build_tiny_inpaint_pipeline

    sd = build_tiny_inpaint_pipeline(tmp_path / "sd")
    blip = build_tiny_blip(tmp_path / "blip")
    out = tmp_path / "out"
    code = synth(
        coco,
        out,
        "--limit",
        "5",
        "--image-method",
        "inpaint",
        "--inpaint-backend",
        "diffusers",
        "--inpaint-model",
        str(sd),
        "--steps",
        "2",
        "--resolution",
        "64",
        "--text-method",
        "captioner",
        "--captioner-model",
        str(blip),
    )
    assert code == 0
    samples = read_shards(out)
    assert samples
    for _key, image, text, meta in samples:
        assert meta["image_method"]["backend"] == "diffusers"
        assert meta["image_method"]["model"] == str(sd)
        assert meta["text_method"]["method"] == "captioner"
        assert isinstance(text, str) and text == meta["caption"]
        assert image.size == (meta["width"], meta["height"])


def test_every_valid_plan_has_a_row_even_when_not_drawn(coco, tmp_path, run):
    """Under the uniform policy the valid plans not drawn are `skipped: not-drawn` rows, so
    each image has as many plan rows as the `all` policy makes samples or failures."""
    assert synth(coco, tmp_path, "--image-method", "blur") == 0

    def plan_rows(rows, reasons):
        out = {}
        for r in rows:
            if r["target"] is not None and (r["key"] is not None or r["reason"] in reasons):
                out.setdefault(r["image_id"], set()).add(r["target"])
        return out

    uniform = read_status(tmp_path)
    assert any(r["reason"] == "not-drawn" for r in uniform)
    assert plan_rows(uniform, {"not-drawn"}) == plan_rows(read_status(run), set())


def test_one_seed_draws_the_targets_and_the_rest(tmp_path):
    """`SynthConfig.seed` alone decides the draws: the targets (the selection takes it), the
    captions and each sample's seed; and the manifest still records it under `selection`."""
    from counterfactual.method.selection import SelectionConfig, select_many
    from counterfactual.readers.coco import read_coco
    from counterfactual.readers.generate import generate_coco
    from counterfactual.synth.plan import SynthConfig, plan

    files = generate_coco(tmp_path / "coco", 60, seed=2, write_images=False)
    records = read_coco(files.instances, files.captions, files.images).records

    def targets(seed):
        items = [
            i for row in plan(records, SynthConfig(seed=seed)) if isinstance(row, list) for i in row
        ]
        return [(i.record.image_id, i.plan.target) for i in items]

    for seed in (0, 7):
        drawn = select_many(records, SelectionConfig(), seed=seed)
        assert targets(seed) == [(s.image_id, s.plans[0].target) for s in drawn if s.plans]
    assert targets(7) != targets(0)
    assert SynthConfig(seed=7).to_dict()["selection"]["seed"] == 7
