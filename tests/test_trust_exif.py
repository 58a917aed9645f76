"""EXIF orientation, one rule per dataset (issue 31, point 6): every picture carries one of the
eight orientations, its boxes are drawn on the stored pixels or on the upright picture, and
`counterfactual synth` must erase the object it says it removed, never the other one.

Each picture holds a dark square "dog" and a bright square "person" at different places on a
gray ground; with ``--policy all`` each picture makes two samples, one per removed class, and a
zero fill, so the test sees which region changed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bad_coco import synth_args
from PIL import Image, ImageOps

from counterfactual.imageio import SampleError, load_picture, read_header
from counterfactual.readers.generate import CocoFiles, generate_coco
from counterfactual.records import ImageRecord
from counterfactual.shards.frames import FrameRule, choose_frame, scan_rule
from counterfactual.shards.pictures import load_record_picture
from counterfactual.shards.samples import SampleMeta, iter_samples
from counterfactual.synth.plan import SynthConfig

W, H = 64, 40  # the upright picture
GROUND, DOG, PERSON = 128, 30, 235
# xywh on the upright picture: far apart, away from the middle, so no flip maps one on the other
BOXES = {"dog": (4, 4, 12, 10), "person": (22, 24, 14, 12)}
# the transpose that turns the upright picture into the stored one, per EXIF orientation
TO_STORED = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def upright(width: int = W, height: int = H) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The upright picture (a gradient ground keeps every flip distinguishable) and each
    object's mask."""
    y, x = np.mgrid[0:height, 0:width]
    image = np.repeat((GROUND - 20 + x * 40 // width)[..., None], 3, axis=2).astype(np.uint8)
    masks = {}
    for name, (bx, by, bw, bh) in BOXES.items():
        mask = np.zeros((height, width), bool)
        mask[by : by + bh, bx : bx + bw] = True
        image[mask] = DOG if name == "dog" else PERSON
        masks[name] = mask
    return image, masks


def stored_frame(array: np.ndarray, orientation: int) -> np.ndarray:
    method = TO_STORED[orientation]
    im = Image.fromarray(array)
    return np.asarray(im if method is None else im.transpose(method))


def bbox(mask: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(mask)
    return [
        int(xs.min()),
        int(ys.min()),
        int(xs.max() - xs.min() + 1),
        int(ys.max() - ys.min() + 1),
    ]


def save_tagged(path: Path, pixels: np.ndarray, orientation: int) -> None:
    """``pixels`` saved as stored, with an EXIF Orientation tag (a lossless PNG, or a JPEG)."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(
        path, exif=exif, **({"quality": 98} if path.suffix == ".jpg" else {})
    )


class Picture:
    """One picture of the dataset: its orientation, the frame its boxes are annotated in, and
    what a correct run sees in that frame (the pixels, each object's mask)."""

    def __init__(self, image_id: int, orientation: int, frame: str, square: bool = False) -> None:
        self.id, self.orientation, self.frame = image_id, orientation, frame
        image, masks = upright(H if square else W, H)
        self.stored = stored_frame(image, orientation)
        masks_stored = {
            k: stored_frame(m.astype(np.uint8) * 255, orientation) > 0 for k, m in masks.items()
        }
        self.pixels = image if frame == "oriented" else self.stored
        self.masks = masks if frame == "oriented" else masks_stored

    @property
    def file(self) -> str:
        return f"{self.id:03d}.jpg"


def write_dataset(root: Path, pictures: list[Picture]):
    """A COCO-format dataset of ``pictures``, JPEGs with their EXIF tag, one caption each."""
    files = generate_coco(root, len(pictures), seed=3, size=(W, H), write_images=False)
    inst = json.loads(files.instances.read_text())
    caps = json.loads(files.captions.read_text())
    files.images.mkdir(parents=True, exist_ok=True)
    category = {c["name"]: c["id"] for c in inst["categories"]}
    inst["images"], inst["annotations"] = [], []
    for p in pictures:
        save_tagged(files.images / p.file, p.stored, p.orientation)
        h, w = p.pixels.shape[:2]
        inst["images"].append({"id": p.id, "file_name": p.file, "width": w, "height": h})
        for name, mask in p.masks.items():
            box = bbox(mask)
            inst["annotations"].append(
                {
                    "id": 10 * p.id + len(name),
                    "image_id": p.id,
                    "category_id": category[name],
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    caps["images"] = [dict(im) for im in inst["images"]]
    caps["annotations"] = [
        {"id": p.id, "image_id": p.id, "caption": "A dog sits near a person."} for p in pictures
    ]
    files.instances.write_text(json.dumps(inst))
    files.captions.write_text(json.dumps(caps))
    return files


def run_synth(
    files, out: Path, *extra: str, runner: tuple[str, ...] = ("--runner", "local")
) -> subprocess.CompletedProcess[str]:
    argv = synth_args(files, out, *runner, "--policy", "all")
    argv += ["--image-method", "zero", "--text-method", "prompt", "--contact-sheet", "0", *extra]
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *argv], capture_output=True, text=True, timeout=300
    )


def statuses(out: Path) -> dict[tuple[str, str | None], dict]:
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    return {(r["image_id"], r.get("target")): r for r in rows}


def check_erased(out: Path, pictures: list[Picture]) -> dict[str, SampleMeta]:
    """Every written sample erased its removed object and kept the other, in the frame its
    boxes were annotated in; returns the samples by key."""
    by_id = {str(p.id): p for p in pictures}
    seen = {}
    for row in iter_samples(out):
        meta = row.meta
        p = by_id[meta.image_id]
        edited = np.asarray(Image.open(io.BytesIO(row.jpg)).convert("RGB")).astype(int)
        assert edited.shape == p.pixels.shape, (p.orientation, p.frame)
        (removed,) = meta.plan.removed
        kept = "person" if removed == "dog" else "dog"
        diff = np.abs(edited - p.pixels.astype(int)).mean(axis=2)
        where = f"orientation {p.orientation}, boxes {p.frame}, removed {removed}"
        assert diff[p.masks[removed]].mean() > 25, where  # erased (zero fill)
        assert diff[p.masks[kept]].mean() < 6, where  # untouched
        # everything far from the removed box is the annotated frame's picture
        far = np.ones(diff.shape, bool)
        x, y, w, h = bbox(p.masks[removed])
        far[max(0, y - 8) : y + h + 8, max(0, x - 8) : x + w + 8] = False
        assert diff[far].mean() < 4, where
        if p.orientation == 1:
            assert (meta.exif_orientation, meta.exif_frame) == (1, None)
        else:
            assert (meta.exif_orientation, meta.exif_frame) == (p.orientation, p.frame), where
        seen[meta.key] = meta
    return seen


# --- the scenario: all eight orientations, boxes in each frame ------------------------------


@pytest.mark.parametrize("frame", ["stored", "oriented"])
def test_every_orientation_erases_the_named_object(tmp_path: Path, frame: str) -> None:
    """Eight pictures, orientations 1..8, all annotated in one frame: the rotated ones (5-8)
    tell the frame by their size, and orientations 2-4 follow it."""
    pictures = [Picture(o, o, frame) for o in range(1, 9)]
    files = write_dataset(tmp_path / "coco", pictures)
    done = run_synth(files, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    rows = statuses(tmp_path / "out")
    assert {r["status"] for r in rows.values()} == {"written"}, rows
    assert len(rows) == 16
    samples = check_erased(tmp_path / "out", pictures)
    assert len(samples) == 16


# --- the ambiguous pictures ----------------------------------------------------------------


def ambiguous(frame: str) -> list[Picture]:
    """Pictures whose size cannot tell the frame: orientation 3 (wide), 2 and 4, and square
    pictures tagged 3 and 6."""
    return [
        Picture(1, 3, frame),
        Picture(2, 2, frame),
        Picture(3, 4, frame),
        Picture(4, 3, frame, square=True),
        Picture(5, 6, frame, square=True),
    ]


def test_ambiguous_pictures_default_to_the_stored_frame(tmp_path: Path) -> None:
    """Nothing in the dataset tells the frame: stored (pycocotools' and PIL's frame)."""
    pictures = ambiguous("stored")
    files = write_dataset(tmp_path / "coco", pictures)
    done = run_synth(files, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert len(check_erased(tmp_path / "out", pictures)) == 10


def test_exif_frame_option_decides_the_ambiguous_pictures(tmp_path: Path) -> None:
    pictures = ambiguous("oriented")
    files = write_dataset(tmp_path / "coco", pictures)
    done = run_synth(files, tmp_path / "out", "--exif-frame", "oriented")
    assert done.returncode == 0, done.stderr
    assert len(check_erased(tmp_path / "out", pictures)) == 10
    assert '"exif_frame": "oriented"' in (tmp_path / "out" / "manifest.json").read_text()


@pytest.fixture(scope="module")
def told_by_the_dataset(
    tmp_path_factory,
) -> tuple[list[Picture], CocoFiles, Path, subprocess.CompletedProcess[str]]:
    """The ambiguous pictures and one sideways picture annotated upright, their dataset and
    its local run, one image per shard: ``(pictures, files, out, process)``. Read by the test
    of that run and by the Ray test, whose shards must be this run's."""
    root = tmp_path_factory.mktemp("told")
    pictures = [*ambiguous("oriented"), Picture(6, 8, "oriented")]
    files = write_dataset(root / "coco", pictures)
    done = run_synth(files, root / "out", "--images-per-shard", "1")
    return pictures, files, root / "out", done


def test_the_dataset_frame_decides_the_ambiguous_pictures(told_by_the_dataset) -> None:
    """One sideways picture annotated upright tells the frame of the square and upside-down ones,
    the same in every shard (one image per shard here)."""
    pictures, _, out, done = told_by_the_dataset
    assert done.returncode == 0, done.stderr
    assert {r["status"] for r in statuses(out).values()} == {"written"}
    assert len(check_erased(out, pictures)) == 12


@pytest.mark.slow
def test_ray_workers_use_the_drivers_frame(tmp_path: Path, told_by_the_dataset) -> None:
    """On Ray, one image per shard on two CPUs: every worker gets the frame the driver found,
    and the shards are the in-process runner's (the local run of the same dataset, shared)."""
    pictures, files, local, done_local = told_by_the_dataset
    ray = ("--runner", "ray", "--num-cpus", "2", "--no-dashboard")
    done = run_synth(files, tmp_path / "out", "--images-per-shard", "1", runner=ray)
    assert done.returncode == 0, done.stderr
    samples = check_erased(tmp_path / "out", pictures)
    assert len(samples) == 12
    assert done_local.returncode == 0, done_local.stderr
    assert check_erased(local, pictures) == samples


def test_a_size_that_contradicts_the_given_frame_fails(tmp_path: Path) -> None:
    """--exif-frame stored, but a sideways picture is annotated at its upright size: that one
    fails with its reason; the ambiguous ones follow the option."""
    pictures = [Picture(1, 6, "oriented"), Picture(2, 3, "stored")]
    files = write_dataset(tmp_path / "coco", pictures)
    done = run_synth(files, tmp_path / "out", "--exif-frame", "stored")
    assert done.returncode == 0, done.stderr
    rows = statuses(tmp_path / "out")
    failed = [r for r in rows.values() if r["image_id"] == "1"]
    assert [(r["status"], r["reason"]) for r in failed] == [("failed", "exif-frame-mismatch")] * 2
    assert "oriented size of a picture with EXIF orientation 6" in failed[0]["detail"]
    assert len(check_erased(tmp_path / "out", pictures[1:])) == 2


def test_a_dataset_annotated_in_both_frames_fails_its_ambiguous_pictures(tmp_path: Path) -> None:
    pictures = [Picture(1, 6, "stored"), Picture(2, 8, "oriented"), Picture(3, 3, "oriented")]
    files = write_dataset(tmp_path / "coco", pictures)
    done = run_synth(files, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    rows = statuses(tmp_path / "out")
    assert {r["reason"] for r in rows.values() if r["image_id"] == "3"} == {"exif-frame-unknown"}
    assert len(check_erased(tmp_path / "out", pictures[:2])) == 4
    # the user names the frame: the upside-down picture is made, the contradicting one fails
    again = run_synth(files, tmp_path / "out2", "--exif-frame", "oriented")
    assert again.returncode == 0, again.stderr
    rows = statuses(tmp_path / "out2")
    assert {r["reason"] for r in rows.values() if r["image_id"] == "1"} == {"exif-frame-mismatch"}
    assert len(check_erased(tmp_path / "out2", pictures[1:])) == 4


def test_a_bad_exif_frame_is_one_line_and_exit_2(tmp_path: Path) -> None:
    files = write_dataset(tmp_path / "coco", [Picture(1, 3, "stored")])
    done = run_synth(files, tmp_path / "out", "--exif-frame", "upright")
    assert done.returncode == 2
    line, pointer = done.stderr.strip().splitlines()  # the error, and where help is
    assert line == (
        "counterfactual synth: error: argument --exif-frame: invalid choice: 'upright' "
        "(choose from 'auto', 'stored', 'oriented')"
    )
    assert pointer == "Try 'counterfactual synth --help'."
    assert not (tmp_path / "out" / "status.jsonl").exists()


# --- the rule as a table --------------------------------------------------------------------


def record(p: Picture, root: Path | str) -> ImageRecord:
    h, w = p.pixels.shape[:2]
    return ImageRecord(str(p.id), p.file, w, h, (), (), root=root)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("frame", ["stored", "oriented"])
def test_choose_frame_per_orientation(tmp_path: Path, orientation: int, frame: str) -> None:
    p = Picture(1, orientation, frame)
    save_tagged(tmp_path / "p.png", p.stored, orientation)  # lossless: exact pixels
    rec = ImageRecord("1", "p.png", p.pixels.shape[1], p.pixels.shape[0], (), (), root=tmp_path)
    for rule in (FrameRule(frame), FrameRule(frame, given=True)):
        got = load_record_picture(rec, 10**6, rule)
        assert np.array_equal(got.pixels, p.pixels)
        assert (got.orientation, got.frame) == (
            orientation,
            "stored" if orientation == 1 else frame,
        )
    other = "oriented" if frame == "stored" else "stored"
    if orientation in (5, 6, 7, 8):  # the size tells: the default rule cannot mislead it
        assert np.array_equal(load_record_picture(rec, 10**6, FrameRule(other)).pixels, p.pixels)
        with pytest.raises(SampleError) as err:
            load_record_picture(rec, 10**6, FrameRule(other, given=True))
        assert err.value.reason == "exif-frame-mismatch"
    elif orientation != 1:  # it cannot: the rule decides, and unknown fails
        with pytest.raises(SampleError) as err:
            load_record_picture(rec, 10**6, FrameRule(None))
        assert err.value.reason == "exif-frame-unknown"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_decoded_upright_is_pil_exif_transpose(tmp_path: Path, orientation: int) -> None:
    p = Picture(1, orientation, "stored")
    save_tagged(tmp_path / "p.png", p.stored, orientation)
    decoded = load_picture(tmp_path / "p.png")
    with Image.open(tmp_path / "p.png") as im:
        assert np.array_equal(
            decoded.upright(), np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        )
    header = read_header(tmp_path / "p.png")
    assert (header.width, header.height, header.orientation) == (
        p.stored.shape[1],
        p.stored.shape[0],
        orientation,
    )


def test_scan_rule_counts_the_telling_pictures_in_any_order(tmp_path: Path) -> None:
    pictures = [Picture(1, 6, "stored"), Picture(2, 3, "oriented"), Picture(3, 7, "stored")]
    pictures += [Picture(4, 5, "stored", square=True), Picture(5, 1, "oriented")]
    for p in pictures:
        save_tagged(tmp_path / p.file, p.stored, p.orientation)
    records = [record(p, tmp_path) for p in pictures]
    rule = scan_rule(records)
    assert rule == FrameRule("stored", stored=2, oriented=0)
    assert scan_rule(records[::-1], threads=1) == rule
    assert scan_rule(records, "oriented") == FrameRule("oriented", given=True)
    mixed = [*records, record(Picture(6, 8, "oriented"), tmp_path)]
    save_tagged(tmp_path / "006.jpg", Picture(6, 8, "oriented").stored, 8)
    assert scan_rule(mixed) == FrameRule(None, stored=2, oriented=1)
    assert scan_rule([]) == FrameRule("stored")


def test_choose_frame_keeps_the_size_check(tmp_path: Path) -> None:
    p = Picture(1, 6, "stored")
    save_tagged(tmp_path / "p.png", p.stored, 6)
    rec = ImageRecord("1", "p.png", 50, 50, (), (), root=tmp_path)
    with pytest.raises(SampleError) as err:
        choose_frame(rec, load_picture(tmp_path / "p.png"))
    assert (err.value.reason, err.value.detail) == (
        "size-mismatch",
        f"annotated 50x50, decoded {W}x{H}",
    )


def test_older_sample_json_without_the_exif_keys_reads(tmp_path: Path) -> None:
    """Shards written before the keys read as untagged; a half-set pair is refused."""
    files = write_dataset(tmp_path / "coco", [Picture(1, 6, "stored")])
    done = run_synth(files, tmp_path / "out")
    assert done.returncode == 0, done.stderr
    (row,) = [r for r in iter_samples(tmp_path / "out")][:1]
    d = row.meta.to_dict()
    assert (d["exif_orientation"], d["exif_frame"]) == (6, "stored")
    old = {k: v for k, v in d.items() if not k.startswith("exif_")}
    assert (SampleMeta.from_dict(old).exif_orientation, SampleMeta.from_dict(old).exif_frame) == (
        1,
        None,
    )
    with pytest.raises(ValueError, match="exif"):
        SampleMeta.from_dict({**old, "exif_orientation": 6})
    with pytest.raises(ValueError, match="exif_frame"):
        SampleMeta.from_dict({**d, "exif_frame": "upright"})


def test_exif_frame_is_fingerprinted_only_when_given() -> None:
    assert "exif_frame" not in SynthConfig().to_dict()
    assert SynthConfig(exif_frame="oriented").fingerprint()["exif_frame"] == "oriented"
    with pytest.raises(ValueError, match="exif_frame"):
        SynthConfig(exif_frame="upright")


def test_scan_rule_reads_headers_from_an_object_store(s3, tmp_path: Path) -> None:
    """Pictures under an ``s3://`` root: the pass reads their headers through fsspec (a missing
    object tells nothing), and a worker loads each in the frame the pass found."""
    bucket = s3.bucket()
    pictures = [Picture(1, 8, "oriented"), Picture(2, 3, "oriented")]
    for p in pictures:
        save_tagged(tmp_path / p.file, p.stored, p.orientation)
        s3.upload(tmp_path / p.file, f"{bucket}/images/{p.file}")
    records = [record(p, f"{bucket}/images") for p in pictures]
    gone = ImageRecord("9", "gone.jpg", W, H, (), (), root=f"{bucket}/images")
    assert read_header(f"{bucket}/images/{pictures[0].file}").orientation == 8
    with pytest.raises(SampleError) as err:
        read_header(f"{bucket}/images/gone.jpg")
    assert err.value.reason == "missing-file"
    rule = scan_rule([*records, gone])
    assert rule == FrameRule("oriented", stored=0, oriented=1)
    for p, rec in zip(pictures, records, strict=True):
        got = load_record_picture(rec, 10**6, rule)
        assert got.frame == "oriented"
        assert np.abs(got.pixels.astype(int) - p.pixels).mean() < 3  # a JPEG of the same
