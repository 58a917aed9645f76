"""The hostile-input suite (issue 13): one COCO-format dataset holding every kind of picture
and entry a user's data throws at a run, run as a user runs it (a process, both runners).
For each image: the exit code, stderr without a traceback, its status rows, and where a sample
is written, the decoded tones of the picture outside the erased boxes against the source."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
W, H = 96, 72
BOXES = [(1, [2, 2, 20, 16]), (18, [W - 22, H - 18, 20, 16])]  # a person and a dog, corners


def _ramp() -> np.ndarray:
    """A smooth 8-bit RGB picture (JPEG keeps its tones within a few levels)."""
    y, x = np.mgrid[0:H, 0:W]
    return np.stack([x * 255 // (W - 1), y * 255 // (H - 1), (x + y) * 255 // (W + H - 2)], -1)


def _pictures(folder: Path) -> dict[str, tuple[str, np.ndarray]]:
    """file name and the 8-bit RGB tones each picture must decode to, by image id."""
    ramp = _ramp().astype(np.uint8)
    gray = ramp[..., 0]
    out: dict[str, tuple[str, np.ndarray]] = {}

    # 16-bit grayscale PNG: values up to 65535 (the bug: written as all white)
    Image.fromarray(gray.astype(np.uint16) * 257).save(folder / "gray16.png")
    out["1"] = ("gray16.png", np.repeat(gray[..., None], 3, -1))
    # float TIFF in [0, 1]
    Image.fromarray(gray.astype(np.float32) / 255, mode="F").save(folder / "float.tif")
    out["2"] = ("float.tif", np.repeat(gray[..., None], 3, -1))
    # palette PNG with a transparent index: transparent pixels over white
    pal = Image.fromarray(ramp).quantize(64)
    pal.info["transparency"] = 0
    pal.save(folder / "palette.png", transparency=0)
    expected = np.asarray(pal.convert("RGB")).copy()
    expected[np.asarray(pal) == 0] = 255
    out["3"] = ("palette.png", expected)
    # animated GIF: the first frame (a later one is blue)
    first = Image.fromarray(ramp).quantize(256, dither=Image.Dither.NONE)
    blue = Image.new("RGB", (W, H), (0, 0, 255)).quantize(256)
    first.save(folder / "anim.gif", save_all=True, append_images=[blue], duration=100, loop=0)
    out["4"] = ("anim.gif", np.asarray(first.convert("RGB")))
    # progressive JPEG
    Image.fromarray(ramp).save(folder / "progressive.jpg", quality=95, progressive=True)
    out["5"] = ("progressive.jpg", ramp)
    # EXIF-rotated JPEG, annotated at its upright size
    exif = Image.Exif()
    exif[0x0112] = 6
    stored = Image.fromarray(ramp).transpose(Image.Transpose.ROTATE_90)
    stored.save(folder / "rotated.jpg", quality=95, exif=exif)
    out["6"] = ("rotated.jpg", ramp)
    for i in ("7", "8", "9", "10", "11", "12"):
        Image.fromarray(ramp).save(folder / f"plain{i}.png")
        out[i] = (f"plain{i}.png", ramp)
    return out


def _dataset(root: Path) -> tuple[Path, Path, Path, dict]:
    images = root / "images"
    images.mkdir(parents=True)
    pictures = _pictures(images)
    inst: dict = {
        "images": [
            {"id": int(i), "file_name": name, "width": W, "height": H}
            for i, (name, _) in pictures.items()
        ],
        "annotations": [],
        "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}],
    }
    inst["images"].append({"id": 9, "file_name": "plain10.png", "width": W, "height": H})
    ann_id = 100
    for i in pictures:
        for cat, box in BOXES:
            ann_id += 1
            inst["annotations"].append(
                {"id": ann_id, "image_id": int(i), "category_id": cat, "bbox": box, "iscrowd": 0}
            )
    bad = {
        "7": {"bbox": [2, 2, 20]},  # three numbers
        "8": {"category_id": "dog"},  # a category by name
        "11": {"segmentation": [[2, 2, "x", 4, 20, 20]]},  # a string in a polygon
    }
    for ann in inst["annotations"]:
        if str(ann["image_id"]) in bad and ann["category_id"] == 18:
            ann.update(bad[str(ann["image_id"])])
    inst["annotations"].append("not an object")
    captions = {
        "annotations": [
            {"id": 1000 + int(i), "image_id": int(i), "caption": "A person beside a dog."}
            for i in pictures
        ]
    }
    captions["annotations"][9]["caption"] = "A person\x00 beside a dog.\x07"  # image 10
    captions["annotations"].append({"id": 2000, "image_id": 12, "caption": 42})  # not a string
    (root / "instances.json").write_text(json.dumps(inst))
    (root / "captions.json").write_text(json.dumps(captions))
    return root / "instances.json", root / "captions.json", images, pictures


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _dataset(tmp_path_factory.mktemp("hostile"))


def _synth(data, out: Path, runner: str) -> subprocess.CompletedProcess:
    instances, captions, images, _ = data
    args = [
        "synth", "--dataset", "coco", "--instances", str(instances), "--captions",
        str(captions), "--images", str(images), "--out", str(out), "--image-method", "blur",
        "--policy", "all", "--contact-sheet", "0", "--images-per-shard", "4", "--runner", runner,
    ]  # fmt: skip
    if runner == "ray":
        args += ["--num-cpus", "2", "--no-dashboard"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True, text=True, env=env, cwd=out.parent, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module", params=["local", "ray"])
def run(request, data, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "out"
    done = _synth(data, out, request.param)
    return out, done


def _rows(out: Path) -> dict[str, list[dict]]:
    rows: dict[str, list[dict]] = {}
    for line in (out / "status.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["image_id"], []).append(row)
    return rows


def test_the_run_ends_well_and_says_nothing_alarming(run):
    _, done = run
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    # the annotation that belongs to no image: one line, naming it
    warned = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    assert len(warned) == 1 and warned[0].startswith("counterfactual synth: warning:"), warned
    assert "annotations[24]" in warned[0]


def test_every_image_is_accounted_for(run, data):
    out, _ = run
    rows = _rows(out)
    assert set(rows) == set(data[3]), sorted(rows)
    outcome = {i: {(r["status"], r["reason"]) for r in rs} for i, rs in rows.items()}
    for good in ("1", "2", "3", "4", "5", "6", "10"):
        assert ("written", None) in outcome[good], (good, rows[good])
    for bad, names in {
        "7": ("bbox",),
        "8": ("category_id", "'dog'"),
        "11": ("segmentation",),
    }.items():
        assert outcome[bad] == {("failed", "bad-annotation")}, rows[bad]
        detail = rows[bad][0]["detail"]
        assert all(n in detail for n in names) and "annotation" in detail, detail
    assert outcome["12"] == {("failed", "bad-annotation")}, rows["12"]
    assert "2000" in rows["12"][0]["detail"]  # names the caption entry
    # image 9 twice: the first is processed, the second is a duplicate-id row
    assert ("written", None) in outcome["9"]
    assert sum(r["reason"] == "duplicate-id" for r in rows["9"]) == 1


def _samples(out: Path) -> list[dict]:
    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    return list(wds.WebDataset(urls, shardshuffle=False))


def test_written_pictures_keep_their_tones(run, data):
    out, _ = run
    pictures = data[3]
    checked = set()
    for sample in _samples(out):
        meta = json.loads(sample["json"])
        image_id = meta["image_id"]
        got = np.asarray(Image.open(io.BytesIO(sample["jpg"])).convert("RGB")).astype(int)
        want = pictures[image_id][1].astype(int)
        assert got.shape == want.shape, image_id
        outside = np.ones((H, W), bool)
        for x, y, w, h in meta["mask_boxes"]:
            x0, y0 = max(0, int(x) - 4), max(0, int(y) - 4)
            outside[y0 : int(np.ceil(y + h)) + 4, x0 : int(np.ceil(x + w)) + 4] = False
        diff = np.abs(got - want)[outside].mean()
        assert diff < 4, (image_id, diff)  # JPEG at quality 95 on smooth pictures
        checked.add(image_id)
    assert {"1", "2", "3", "4", "5", "6"} <= checked


def test_control_characters_leave_the_caption_and_are_counted(run):
    out, _ = run
    samples = [s for s in _samples(out) if json.loads(s["json"])["image_id"] == "10"]
    assert samples
    for sample in samples:
        meta = json.loads(sample["json"])
        assert "\x00" not in sample["txt"].decode() and "\x00" not in meta["original_caption"]
        assert meta["original_caption"] == "A person beside a dog."
        assert meta["caption_cleaned"] == 2  # NUL and BEL
