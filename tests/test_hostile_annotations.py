"""Hostile annotation files through the command a user types: a bad entry costs its image a
reasoned status row, never the run; only a file of the wrong shape stops it, in one line."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from bad_coco import synth_args
from PIL import Image
from shard_files import run_outputs

from counterfactual.cli import main
from counterfactual.readers.coco import AnnotationWarning, read_coco
from counterfactual.readers.flickr30k import read_flickr30k
from counterfactual.readers.generate import CocoFiles, generate_coco
from counterfactual.records import RLE
from counterfactual.synth.run import read_status

N = 16
FAST = ("--image-method", "blur", "--policy", "all", "--contact-sheet", "0")


def _clean(root: Path) -> CocoFiles:
    """16 small generated images, each with two small removable objects (person, dog)."""
    files = generate_coco(root, N, seed=3, size=(160, 120))
    inst = json.loads(files.instances.read_text())
    for i in range(1, N + 1):
        for cat, x, y in ((1, 0, 0), (18, 136, 96)):
            ann = {"id": 9000 + 2 * i + (cat > 1), "image_id": i, "category_id": cat}
            inst["annotations"].append({**ann, "bbox": [x, y, 24, 24], "iscrowd": 0})
    files.instances.write_text(json.dumps(inst))
    return files


def _first(entries: list, image_id: int) -> dict:
    return next(e for e in entries if isinstance(e, dict) and e["image_id"] == image_id)


def _make_hostile(files: CocoFiles) -> dict[str, list[str]]:
    """Break the files in place; the words each image's status detail must contain."""
    inst = json.loads(files.instances.read_text())
    caps = json.loads(files.captions.read_text())
    anns, texts = inst["annotations"], caps["annotations"]
    expect: dict[str, list[str]] = {}
    # a repeated image id: images[16] repeats id 1 (images[0] is read)
    inst["images"].append({**inst["images"][1], "id": 1})
    expect["1"] = ["instances.json", "images[16]", "images[0]"]
    bad = _first(anns, 3)
    bad["segmentation"] = [[1, 2, "a", 4, 5, 6]]
    expect["3"] = ["instances.json", f"annotation {bad['id']}", "segmentation[0]", "'a'"]
    bad = _first(anns, 4)
    bad["bbox"] = [1, 2, 3]
    expect["4"] = [f"annotation {bad['id']}", "bbox [1, 2, 3]"]
    bad = _first(anns, 5)
    bad["category_id"] = "person"  # a category given by name
    expect["5"] = [f"annotation {bad['id']}", "category_id 'person'"]
    inst["images"][5]["width"] = "160"  # image 6
    expect["6"] = ["image 6", "width '160'"]
    bad = _first(texts, 7)
    bad["caption"] = None
    expect["7"] = ["captions.json", f"caption {bad['id']}", "None"]
    inst["categories"].append({"id": 500, "name": 7})  # a category whose name is no name
    anns.append({"id": 77001, "image_id": 9, "category_id": 500, "bbox": [1, 1, 5, 5]})
    expect["9"] = ["annotation 77001", "category 500", "name 7"]
    _first(anns, 10)["iscrowd"] = "0"
    expect["10"] = ["iscrowd '0'"]
    twice = [c for c in texts if c["image_id"] == 11][:2]
    twice[1]["id"] = twice[0]["id"]  # two captions of one image share an id (and a key)
    expect["11"] = [f"caption {twice[0]['id']}", "repeated"]
    inst["categories"].append({"name": "ghost"})  # no id: nothing can use it
    anns.append({"id": 77002, "image_id": 12, "category_id": 600, "bbox": [1, 1, 5, 5]})
    expect["12"] = ["annotation 77002", "category_id 600"]
    inst["images"].append("not an image")
    expect["images[17]"] = ["images[17]", "not an object"]
    inst["images"].append({**inst["images"][2], "id": None})
    expect["images[18]"] = ["images[18]", "id None"]
    anns.append("not an annotation")  # belongs to no image: a warning, not a row
    anns.append({"id": 77003, "image_id": 999, "category_id": 1, "bbox": [1, 1, 5, 5]})
    # a NUL and a zero-width space in image 8's captions: cleaned, counted, written
    for cap in texts:
        if cap["image_id"] == 8:
            cap["caption"] = cap["caption"].replace(" ", " \x00", 1) + "\u200b"
    texts.append(["not", "a", "caption"])
    files.instances.write_text(json.dumps(inst))
    files.captions.write_text(json.dumps(caps))
    return expect


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """``(clean, hostile, expected details)``: the same images, once intact, once broken."""
    clean = _clean(tmp_path_factory.mktemp("clean"))
    hostile = _clean(tmp_path_factory.mktemp("hostile"))
    return clean, hostile, _make_hostile(hostile)


@pytest.fixture(scope="module")
def clean_run(datasets, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean-run")
    assert main(synth_args(datasets[0], out, *FAST)) == 0
    return out


@pytest.fixture(scope="module")
def hostile_run(datasets, tmp_path_factory):
    out = tmp_path_factory.mktemp("hostile-run")
    with pytest.warns(AnnotationWarning) as warned:
        assert main(synth_args(datasets[1], out, *FAST)) == 0
    return out, [str(w.message) for w in warned]


def _rows(out: Path) -> dict[str, list[tuple]]:
    rows = defaultdict(list)
    for s in read_status(out):
        rows[s.image_id].append((s.status, s.reason, s.key, s.target, s.detail))
    return rows


def test_each_bad_entry_is_its_images_row(datasets, hostile_run):
    _, _, expect = datasets
    rows = _rows(hostile_run[0])
    assert set(rows) == {str(i) for i in range(1, N + 1)} | {"images[17]", "images[18]"}
    for image_id, words in expect.items():
        failed = [r for r in rows[image_id] if r[0] == "failed"]
        reason = "duplicate-id" if image_id == "1" else "bad-annotation"
        assert [r[1] for r in failed] == [reason], image_id
        for word in words:
            assert word in failed[0][4], (image_id, word, failed[0][4])
    for image_id in expect.keys() - {"1"}:  # a bad image has exactly one row
        assert len(rows[image_id]) == 1, rows[image_id]


def test_good_images_come_out_as_from_the_intact_files(datasets, hostile_run, clean_run):
    _, _, expect = datasets
    ours, theirs = _rows(hostile_run[0]), _rows(clean_run)
    good = {str(i) for i in range(1, N + 1)} - expect.keys() | {"1"}
    assert good == {"1", "2", "8", "13", "14", "15", "16"}
    for image_id in good:
        mine = sorted(r for r in ours[image_id] if r[1] != "duplicate-id")
        assert mine == sorted(theirs[image_id]), image_id
        assert any(r[0] == "written" for r in mine), image_id


def test_entries_of_no_image_are_named_in_one_warning_per_file(hostile_run):
    _, messages = hostile_run
    assert any(
        m.startswith("instances.json: 2 of the 'annotations' entries belong to no image")
        and "annotations[" in m
        and "is a string, not an object" in m
        for m in messages
    ), messages
    assert any(m.startswith("captions.json: 1 of the 'annotations'") for m in messages)
    assert any("'categories'" in m and "has id None" in m for m in messages), messages


def test_control_characters_never_reach_a_shard(hostile_run):
    out, _ = hostile_run
    written = 0
    for shard in out.glob("shard-*.tar"):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member).read()
                if member.name.endswith(".txt"):
                    assert b"\x00" not in data and "\u200b".encode() not in data
                if member.name.endswith(".json"):
                    meta = json.loads(data)
                    cleaned = meta.get("caption_cleaned")
                    if meta["image_id"] == "8":
                        assert cleaned == 2 and "\x00" not in meta["original_caption"]
                        written += 1
                    else:
                        assert cleaned is None  # absent when nothing was removed
    assert written


@pytest.mark.slow
def test_ray_runner_gives_the_same_rows_and_bytes(datasets, hostile_run, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    extra = ("--runner", "ray", "--num-cpus", "2", "--no-dashboard")
    with pytest.warns(AnnotationWarning):
        assert main(synth_args(datasets[1], out, *FAST, *extra)) == 0
    ours, theirs = run_outputs(out), run_outputs(hostile_run[0])
    assert ours == theirs
    rows = _rows(out)
    assert [r[1] for r in rows["1"] if r[0] == "failed"] == ["duplicate-id"]
    assert [r[1] for r in rows["3"]] == ["bad-annotation"]


SHAPES = {
    "top level a list": ("instances", lambda d: [d], "the top level is a list"),
    "images an object": ("instances", lambda d: {**d, "images": {}}, "'images' is an object"),
    "no images": ("instances", lambda d: {"annotations": []}, "has no 'images' list"),
    "annotations a string": (
        "instances",
        lambda d: {**d, "annotations": "x"},
        "'annotations' is a string",
    ),
    "categories null": ("instances", lambda d: {**d, "categories": None}, "'categories' is null"),
    "captions a list": ("captions", lambda d: d["annotations"], "the top level is a list"),
    "captions without annotations": ("captions", lambda d: {}, "has no 'annotations' list"),
}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("small"), 2, seed=1, size=(64, 48))


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_a_file_of_the_wrong_shape_is_one_line(small, case, tmp_path, capsys):
    which, change, words = SHAPES[case]
    path = getattr(small, which)
    broken = tmp_path / path.name
    broken.write_text(json.dumps(change(json.loads(path.read_text()))))
    files = CocoFiles(
        broken if which == "instances" else small.instances,
        broken if which == "captions" else small.captions,
        small.images,
    )
    assert main(synth_args(files, tmp_path / "out", *FAST)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(broken) in err and words in err, err


@pytest.mark.parametrize(
    "content,words",
    [(b'{"images": ["\xff"]}', "not valid JSON"), (b"[" * 100_000, "nested too deeply")],
)
def test_unreadable_json_is_one_line_from_the_command(small, content, words, tmp_path):
    broken = tmp_path / "instances.json"
    broken.write_bytes(content)
    files = CocoFiles(broken, small.captions, small.images)
    cmd = [sys.executable, "-m", "counterfactual", *synth_args(files, tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert str(broken) in proc.stderr and words in proc.stderr


def test_reader_tables_every_malformed_field(tmp_path):
    """Each kind of bad value, one image each, read directly."""
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 10, "height": 10} for i in range(1, 11)]
    good = {"category_id": 1, "bbox": [1, 1, 2, 2]}
    anns = [
        {"image_id": 1, **good, "bbox": [1, 1, True, 2]},  # a boolean is no number
        {"image_id": 2, **good, "bbox": [1, 1, 10**400, 2]},  # too large for a float
        {"image_id": 3, **good, "segmentation": [[1, 1, 2, 2, 3]]},  # odd
        {"image_id": 4, **good, "segmentation": "polygon"},
        {"image_id": 5, **good, "category_id": [1]},
        {
            "image_id": 6,
            **good,
            "segmentation": {"counts": ";280U2", "size": [10, 10]},
        },  # RLE: fine
        {"image_id": 7, **good, "segmentation": [[1, 1, 2, 2]]},  # too short: dropped, fine
        {"image_id": 8, "id": 5, **good, "bbox": "1 1 2 2"},
    ]
    images[8]["height"] = True
    images[9]["id"] = "ten"  # a string id is an id
    anns.append({"image_id": "ten", **good})
    inst = {"images": images, "annotations": anns, "categories": [{"id": 1, "name": "cat"}]}
    path = tmp_path / "inst.json"
    path.write_text(json.dumps(inst))
    ds = read_coco(path, None, tmp_path)
    assert sorted(r.image_id for r in ds.records) == ["6", "7", "ten"]
    assert [r.objects[0].segmentation for r in ds.records] == [RLE(10, 10, ";280U2"), None, None]
    detail = {s.image_id: (s.reason, s.detail) for s in ds.failures}
    assert detail == {
        "1": ("bad-annotation", "inst.json annotations[0]: bbox [1, 1, True, 2] is not "
              "[x, y, w, h] of finite numbers"),
        "2": ("bad-annotation", detail["2"][1]),
        "3": ("bad-annotation", "inst.json annotations[2]: segmentation[0] has an odd number "
              "of values (5)"),
        "4": ("bad-annotation", "inst.json annotations[3]: segmentation 'polygon' is neither "
              "polygons nor RLE"),
        "5": ("bad-annotation", "inst.json annotations[4]: category_id [1] is not among the "
              "categories"),
        "8": ("bad-annotation", "inst.json annotation 5: bbox '1 1 2 2' is not [x, y, w, h] of "
              "finite numbers"),
        "9": ("bad-annotation", "inst.json image 9: height True is not a positive integer"),
    }  # fmt: skip
    assert detail["2"][1].startswith("inst.json annotations[1]: bbox [1, 1, 1000")


def test_many_problems_are_counted_not_listed(tmp_path):
    images = [{"id": 1, "file_name": "a.jpg", "width": 10, "height": 10}]
    anns = [{"id": k, "image_id": 1, "category_id": 9, "bbox": [0, 0, 1, 1]} for k in range(7)]
    path = tmp_path / "inst.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": []}))
    (failure,) = read_coco(path, None, tmp_path).failures
    assert failure.detail.count("category_id 9") == 3 and failure.detail.endswith("(and 4 more)")


# --- Flickr30k -------------------------------------------------------------------------------


def _flickr(root: Path) -> Path:
    """Four images: 1 intact, 2 with a NUL and a tab in its sentences, 3 with an XML in an
    unknown encoding, 4 with a phrase never closed on its second line."""
    (root / "Sentences").mkdir(parents=True)
    (root / "Annotations").mkdir()
    (root / "flickr30k-images").mkdir()
    xml = (
        "<annotation><size><width>64</width><height>48</height></size>"
        "<object><name>1</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>20</xmax>"
        "<ymax>20</ymax></bndbox></object>"
        "<object><name>2</name><bndbox><xmin>40</xmin><ymin>30</ymin><xmax>60</xmax>"
        "<ymax>45</ymax></bndbox></object></annotation>"
    )
    line = "[/EN#1/people A man] walks [/EN#2/animals a dog] ."
    sentences = {
        "1": line,
        "2": "[/EN#1/people A\x00 man]\twalks [/EN#2/animals a dog] .\x0c",
        "3": line,
        "4": f"{line}\n[/EN#1/people A man walks .",
    }
    for image_id, text in sentences.items():
        (root / "Sentences" / f"{image_id}.txt").write_text(text + "\n", encoding="utf-8")
        content = xml if image_id != "3" else '<?xml version="1.0" encoding="nope"?>' + xml
        (root / "Annotations" / f"{image_id}.xml").write_text(content)
        picture = np.full((48, 64, 3), 90 + 20 * int(image_id), np.uint8)
        Image.fromarray(picture).save(root / "flickr30k-images" / f"{image_id}.jpg")
    return root


def test_flickr30k_bad_files_are_their_images_rows(tmp_path):
    root = _flickr(tmp_path / "flickr")
    out = tmp_path / "out"
    args = ["synth", "--dataset", "flickr30k", "--root", str(root), "--out", str(out), *FAST]
    assert main(args) == 0
    rows = _rows(out)
    assert set(rows) == {"1", "2", "3", "4"}
    assert [r[:2] for r in rows["3"]] == [("failed", "bad-annotation")]
    assert rows["3"][0][4].startswith("3.xml: not well-formed XML")
    assert [r[:2] for r in rows["4"]] == [("failed", "bad-annotation")]
    assert rows["4"][0][4] == "4.txt line 2: the phrase of entity 1 is never closed"
    assert any(r[0] == "written" for r in rows["1"]) and any(r[0] == "written" for r in rows["2"])
    (record,) = [r for r in read_flickr30k(root).records if r.image_id == "2"]
    (caption,) = record.captions
    assert caption.text == "A man walks a dog ." and caption.cleaned == 3
    assert [caption.text[p.start : p.end] for p in caption.phrases] == ["A man", "a dog"]
