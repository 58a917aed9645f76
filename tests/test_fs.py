"""Local paths and URLs through ``counterfactual.fs``, and the dataset readers and picture loading
on an S3-compatible server (moto, see ``tests/s3server.py``)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from counterfactual import fs
from counterfactual.imageio import SampleError, load_rgb, resolve_inside
from counterfactual.readers.coco import read_coco
from counterfactual.readers.flickr30k import read_flickr30k
from counterfactual.readers.generate import generate_coco
from counterfactual.shards.pictures import load_record_image
from tests.test_flickr30k import ANNOTATION_1000, SENTENCES_1000


@pytest.fixture(params=["local", "s3"])
def base(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """An empty folder: a local one, or a fresh bucket on the moto server."""
    if request.param == "local":
        return tmp_path
    return request.getfixturevalue("s3").bucket()


@pytest.mark.parametrize(
    ("path", "url", "as_path"),
    [
        ("s3://b/k/", True, "s3://b/k"),
        ("s3://b", True, "s3://b"),
        ("gs://b/a/b.json", True, "gs://b/a/b.json"),
        ("file:///tmp/x", False, Path("/tmp/x")),
        ("/tmp/x", False, Path("/tmp/x")),
        ("rel/x", False, Path("rel/x")),
        ("C:/data", False, Path("C:/data")),
    ],
)
def test_is_url_and_as_path(path: str, url: bool, as_path: str | Path) -> None:
    assert fs.is_url(path) is url
    assert fs.as_path(path) == as_path


def test_url_names() -> None:
    assert fs.join("s3://b/root/", "a", "/b.jpg") == "s3://b/root/a/b.jpg"
    assert fs.name("s3://b/root/a.jpg") == "a.jpg"
    assert fs.parent("s3://b/root/a.jpg") == "s3://b/root"
    assert fs.join(Path("/x"), "a", "b") == Path("/x/a/b")


def test_write_read_exists_remove(base: Path | str) -> None:
    path = fs.join(base, "sub", "a.txt")
    assert not fs.exists(path) and not fs.isfile(path)
    fs.makedirs(fs.parent(path))
    fs.write_text(path, "héllo")
    assert fs.exists(path) and fs.isfile(path) and not fs.isdir(path)
    assert fs.isdir(fs.join(base, "sub"))
    assert fs.read_text(path) == "héllo"
    assert fs.size(path) == len("héllo".encode())
    fs.remove(path)
    assert not fs.exists(path)
    fs.remove(path)  # already gone: no error
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(path)


def test_file_sha256_reads_in_blocks_locally_and_from_a_url(base: Path | str) -> None:
    """The one file-hash helper: the hash of the whole file, across several 1 MiB blocks, for a
    local path (str or Path) and an object behind a URL alike."""
    data = np.random.default_rng(0).integers(0, 256, (5 << 20) // 2 + 7, dtype=np.uint8).tobytes()
    path = fs.join(base, "blob.bin")
    fs.write_bytes(path, data)
    expected = hashlib.sha256(data).hexdigest()
    assert fs.file_sha256(path) == expected
    if isinstance(base, Path):
        assert fs.file_sha256(Path(path)) == expected


def test_atomic_write_appears_only_when_complete(base: Path | str) -> None:
    path = fs.join(base, "out.bin")
    with fs.atomic_write(path) as fh:
        fh.write(b"x" * 1000)
        assert not fs.exists(path)
    assert fs.read_bytes(path) == b"x" * 1000
    assert fs.listdir(base) == ["out.bin"]  # no temporary file left beside it


def test_atomic_write_exception_leaves_nothing(base: Path | str) -> None:
    path = fs.join(base, "broken.bin")
    with pytest.raises(RuntimeError, match="cut short"), fs.atomic_write(path) as fh:
        fh.write(b"y" * 1000)
        raise RuntimeError("cut short")
    assert not fs.exists(path)
    assert fs.listdir(base) == []
    # an existing file survives a failed rewrite unchanged
    fs.write_bytes(path, b"old")
    with pytest.raises(RuntimeError), fs.atomic_write(path) as fh:
        fh.write(b"new")
        raise RuntimeError("cut short")
    assert fs.read_bytes(path) == b"old"


def test_listdir_and_glob(base: Path | str) -> None:
    for rel in ("b.txt", "a.txt", "c.json", "sub/d.txt"):
        fs.makedirs(fs.parent(fs.join(base, rel)))
        fs.write_text(fs.join(base, rel), rel)
    assert fs.listdir(base) == ["a.txt", "b.txt", "c.json"]  # files only, not sub/
    assert fs.listdir(fs.join(base, "sub")) == ["d.txt"]
    assert fs.listdir(fs.join(base, "nowhere")) == []
    found = fs.glob(fs.join(base, "*.txt"))
    assert found == [fs.join(base, "a.txt"), fs.join(base, "b.txt")]
    assert all(isinstance(p, type(fs.as_path(base))) for p in found)
    assert fs.glob(fs.join(base, "*", "*.txt")) == [fs.join(base, "sub", "d.txt")]


def test_fixture_upload_download(s3, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "x" / "y").mkdir(parents=True)
    (src / "top.txt").write_text("1")
    (src / "x" / "y" / "deep.txt").write_text("2")
    bucket = s3.bucket()
    assert bucket.startswith("s3://cf-test-")
    s3.upload(src, f"{bucket}/data")
    s3.upload(src / "top.txt", f"{bucket}/single.txt")
    assert fs.read_text(f"{bucket}/data/x/y/deep.txt") == "2"
    s3.download(f"{bucket}/data", tmp_path / "back")
    assert (tmp_path / "back" / "x" / "y" / "deep.txt").read_text() == "2"
    assert (tmp_path / "back" / "top.txt").read_text() == "1"
    s3.download(f"{bucket}/single.txt", tmp_path / "one.txt")
    assert (tmp_path / "one.txt").read_text() == "1"
    assert s3.bucket() != bucket


def _without_root(records) -> list:
    return [dataclasses.replace(r, root=None) for r in records]


def test_read_coco_from_s3_equals_local(s3, tmp_path: Path) -> None:
    files = generate_coco(tmp_path / "coco", 3, size=(64, 48))
    bucket = s3.bucket()
    s3.upload(tmp_path / "coco", f"{bucket}/coco")
    local = read_coco(files.instances, files.captions, files.images)
    remote = read_coco(
        f"{bucket}/coco/instances.json", f"{bucket}/coco/captions.json", f"{bucket}/coco/images/"
    )
    assert len(local.records) == 3
    assert _without_root(remote.records) == _without_root(local.records)
    assert (remote.class_names, remote.failures) == (local.class_names, local.failures)
    assert {r.root for r in remote.records} == {f"{bucket}/coco/images"}
    record = remote.records[0]
    assert np.array_equal(
        load_record_image(record, 10**8), load_record_image(local.records[0], 10**8)
    )


def _flickr(root: Path) -> None:
    files = {
        "Sentences/1000.txt": SENTENCES_1000,
        "Annotations/1000.xml": ANNOTATION_1000,
        "Sentences/2000.txt": "[/EN#1/people A child] plays .\n",
        "Annotations/2000.xml": "<annotation><size><width>10</width></size>",
        "Sentences/3000.txt": "[/EN#1/people A dog] runs .\n",
        "Annotations/5000.xml": "<annotation><size><width>10</width><height>10</height>"
        "</size></annotation>",
        "train.txt": "1000\n2000\n3000\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    images = root / "flickr30k-images"
    images.mkdir()
    Image.new("RGB", (500, 375), (10, 120, 200)).save(images / "1000.jpg")


@pytest.mark.parametrize("split", [None, "train"])
def test_read_flickr30k_from_s3_equals_local(s3, tmp_path: Path, split: str | None) -> None:
    _flickr(tmp_path / "f30k")
    bucket = s3.bucket()
    s3.upload(tmp_path / "f30k", f"{bucket}/f30k")
    local = read_flickr30k(tmp_path / "f30k", split=split)
    remote = read_flickr30k(f"{bucket}/f30k", split=split)
    assert [r.image_id for r in local.records] == ["1000"]
    assert _without_root(remote.records) == _without_root(local.records)
    assert remote.records[0].root == f"{bucket}/f30k/flickr30k-images"

    def reasons(ds):
        return [(f.image_id, f.status, f.reason) for f in ds.failures]

    assert reasons(remote) == reasons(local)
    assert len(reasons(local)) == (3 if split is None else 2)
    assert np.array_equal(
        load_record_image(remote.records[0], 10**8), load_record_image(local.records[0], 10**8)
    )


def test_flickr30k_url_root_must_exist(s3) -> None:
    bucket = s3.bucket()
    with pytest.raises(ValueError, match="is not a folder"):
        read_flickr30k(f"{bucket}/nothing-here")
    fs.write_text(f"{bucket}/f/Sentences/1.txt", "[/EN#1/people A man] .\n")
    with pytest.raises(ValueError, match="split file"):
        read_flickr30k(f"{bucket}/f", split="val")


def test_missing_object_is_missing_file_like_a_missing_local_file(s3, tmp_path: Path) -> None:
    files = generate_coco(tmp_path / "coco", 2, size=(32, 24))
    bucket = s3.bucket()
    s3.upload(tmp_path / "coco", f"{bucket}/coco")
    (files.images / "000000000002.jpg").unlink()
    fs.remove(f"{bucket}/coco/images/000000000002.jpg")
    local = read_coco(files.instances, None, files.images).records[1]
    remote = read_coco(files.instances, None, f"{bucket}/coco/images").records[1]
    errors = []
    for record in (local, remote):
        with pytest.raises(SampleError) as err:
            load_record_image(record, 10**8)
        errors.append((err.value.reason, err.value.detail))
    assert errors[0] == errors[1] == ("missing-file", "000000000002.jpg")


@pytest.mark.parametrize("relative", ["../x.jpg", "/etc/passwd", "a/../../x.jpg", "", "C:/x.jpg"])
def test_url_root_refuses_paths_that_leave_it(relative: str) -> None:
    with pytest.raises(SampleError) as err:
        resolve_inside("s3://b/images", relative)
    assert err.value.reason == "unsafe-path"


def test_url_root_joins_plain_paths() -> None:
    assert resolve_inside("s3://b/images/", "sub/a.jpg") == "s3://b/images/sub/a.jpg"
    assert resolve_inside("s3://b/images", "a\\b.jpg") == "s3://b/images/a/b.jpg"


def test_load_rgb_from_url_keeps_exif_and_bomb_guard(s3, tmp_path: Path) -> None:
    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :10] = (255, 0, 0)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    local = tmp_path / "rotated.png"
    Image.fromarray(pixels).save(local, exif=exif)
    bucket = s3.bucket()
    s3.upload(local, f"{bucket}/rotated.png")
    remote = load_rgb(f"{bucket}/rotated.png")
    assert remote.shape == (40, 20, 3)
    assert np.array_equal(remote, load_rgb(local))
    for where in (local, f"{bucket}/rotated.png"):
        with pytest.raises(SampleError) as err:
            load_rgb(where, max_pixels=799)
        detail = "40x20 = 800 pixels, over --max-pixels 799"
        assert (err.value.reason, err.value.detail) == ("image-too-large", detail)
    fs.write_bytes(f"{bucket}/junk.jpg", b"not a picture")
    with pytest.raises(SampleError) as err:
        load_rgb(f"{bucket}/junk.jpg")
    assert err.value.reason == "decode-error" and "junk.jpg" in err.value.detail
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG")
    fs.write_bytes(f"{bucket}/cut.jpg", buf.getvalue()[:100])
    with pytest.raises(SampleError) as err:
        load_rgb(f"{bucket}/cut.jpg")
    assert err.value.reason == "decode-error"
