"""End to end through the command a user types, on a generated COCO-format dataset with bad
inputs; shards are read back with the webdataset loader."""

import json
import shutil

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from counterfactual.cli import main
from counterfactual.generate import generate_coco

ODD_CAPTION = "Ein Hund 🐕 neben a dog — naïve café\u200b with a\ttab."


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    files = generate_coco(root, 14, seed=1)
    inst = json.loads(files.instances.read_text())
    caps = json.loads(files.captions.read_text())
    images = {im["id"]: im for im in inst["images"]}
    path = {i: files.images / im["file_name"] for i, im in images.items()}
    # two small objects in opposite corners give every image a removable class
    for i, im in images.items():
        for cat, x, y in ((1, 0, 0), (18, im["width"] - 24, im["height"] - 24)):
            inst["annotations"].append(
                {
                    "id": 10000 + 2 * i + (cat > 1),
                    "image_id": i,
                    "category_id": cat,
                    "bbox": [x, y, 24, 24],
                    "iscrowd": 0,
                }
            )
    photo = np.asarray(Image.open(path[4]).convert("RGB"))
    path[1].write_bytes(b"not a jpeg at all")  # corrupt
    path[2].unlink()  # missing
    path[3].write_bytes(b"")  # empty
    Image.fromarray(photo).convert("CMYK").save(path[4], "JPEG")  # CMYK
    Image.fromarray(photo).convert("L").save(path[5], "JPEG")  # grayscale
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: stored sideways, upright after EXIF transpose
    Image.fromarray(photo).transpose(Image.Transpose.ROTATE_270).save(path[6], exif=exif)
    Image.fromarray(np.zeros((1000, 1200, 3), np.uint8)).save(path[7].with_suffix(".png"))
    images[7].update(file_name=path[7].with_suffix(".png").name, width=1200, height=1000)
    images[8]["file_name"] = "../../../etc/passwd"  # must never be read
    inst["annotations"].append(
        {"id": 9999, "image_id": 9, "category_id": 999, "bbox": [1, 1, 5, 5], "iscrowd": 0}
    )
    for ann in inst["annotations"]:
        if ann["image_id"] == 10:
            ann["bbox"] = [ann["bbox"][0] + 500, ann["bbox"][1] - 300, 900, 900]  # outside
    for cap in caps["annotations"]:
        if cap["image_id"] == 11:
            cap["caption"] = ODD_CAPTION
    Image.fromarray(photo[:300, :100]).save(path[12])  # size disagrees with annotation
    files.instances.write_text(json.dumps(inst))
    files.captions.write_text(json.dumps(caps))
    return files


def synth(files, out, *extra):
    return main(
        [
            "synth",
            "--dataset",
            "coco",
            "--instances",
            str(files.instances),
            "--captions",
            str(files.captions),
            "--images",
            str(files.images),
            "--out",
            str(out),
            "--samples-per-shard",
            "3",
            "--max-pixels",
            "1000000",
            "--contact-sheet",
            "2",
            *extra,
        ]
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
        assert stats["count"] == len(stats["keys"]) <= 3
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
    assert odd and all(m["original_caption"] == ODD_CAPTION for m in odd)
    assert (run / "contact_sheet.png").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["samples"] == len(samples)
    assert summary["images"] == 14 and summary["counts"]["failed:unsafe-path"] == 1


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


def test_shard_writer_contract(tmp_path):
    from counterfactual.shards import Sample, ShardWriter, sample_key

    assert sample_key("123", "person", "45") == "123_person_45"
    odd = sample_key("a.b", "hot dog", "x_y")
    assert "." not in odd and " " not in odd and odd != sample_key("a-b", "hot dog", "x_y")
    with ShardWriter(tmp_path, samples_per_shard=2) as writer:
        for i in range(5):
            writer.write(Sample(f"k{i}", b"\xff\xd8", f"t{i}", {"i": i}))
    assert writer.written == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    assert not list(tmp_path.glob("*.tmp"))
    stats = json.loads((tmp_path / "shard-000002_stats.json").read_text())
    assert stats == {"shard": "shard-000002.tar", "count": 1, "keys": ["k4"]}
    rows = list(wds.WebDataset(sorted(str(p) for p in tmp_path.glob("*.tar")), shardshuffle=False))
    assert [r["__key__"] for r in rows] == [f"k{i}" for i in range(5)]
    with pytest.raises(ValueError, match="dot"):
        ShardWriter(tmp_path / "x").write(Sample("a.b", b"", "", {}))


@pytest.mark.slow
def test_diffusers_inpainting_and_captioner_through_the_command(coco, tmp_path):
    """A user's model path goes through the same loading code: tiny random models saved to disk."""
    from tiny_captioner import build_tiny_blip
    from tiny_diffusion import build_tiny_inpaint_pipeline

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
