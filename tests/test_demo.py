"""The bundled demo: real photos from the scikit-image wheel, hand-drawn boxes, composites."""

from __future__ import annotations

import json
import re
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from counterfactual.method.selection import SelectionConfig, candidates, select
from counterfactual.readers.demo import demo_recipe, prepare_demo, read_demo
from counterfactual.records import Dataset, ImageRecord

pytest.importorskip("skimage")

# Words the captions use for the classes that are not COCO's; COCO classes use coco_synonyms.txt.
NON_COCO_WORDS = {
    "flag": {"flag"},
    "rocket": {"rocket", "shuttle"},
    "helmet": {"helmet"},
    "saucer": {"saucer"},
    "camera": {"camera"},
    "tripod": {"tripod"},
}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def dataset(demo_dir: Path) -> Dataset:
    return read_demo(demo_dir)


def _record(dataset: Dataset, file: str) -> ImageRecord:
    return next(r for r in dataset.records if r.file == file)


def _class_words() -> dict[str, set[str]]:
    text = resources.files("counterfactual").joinpath("data", "coco_synonyms.txt").read_text()
    words = {}
    for line in text.splitlines():
        entries = [e.strip().lower() for e in line.split(",") if e.strip()]
        if entries:
            words[entries[0]] = set(entries)
    return words | NON_COCO_WORDS


def test_records_load(dataset: Dataset) -> None:
    assert dataset.name == "demo"
    assert dataset.failures == ()
    assert [r.file for r in dataset.records] == [
        "astronaut.jpg",
        "coffee.jpg",
        "camera.jpg",
        "chelsea.jpg",
        "rocket.jpg",
        "motorcycle.jpg",
        "cat_and_rocket.jpg",
        "cameraman_and_espresso.jpg",
    ]
    for r in dataset.records:
        assert r.dataset == "demo"
        assert 3 <= len(r.captions) <= 5
        assert r.objects
    assert _record(dataset, "astronaut.jpg").classes == ("person", "flag", "rocket", "helmet")
    assert set(dataset.class_names) == {
        "person", "flag", "rocket", "helmet", "cup", "saucer", "spoon", "dining table",
        "camera", "tripod", "cat", "motorcycle", "bench",
    }  # fmt: skip


def test_pictures_have_the_annotated_size(dataset: Dataset) -> None:
    for r in dataset.records:
        with Image.open(r.root / r.file) as im:
            assert im.format == "JPEG"
            assert im.size == (r.width, r.height), r.file
            assert im.mode == ("L" if r.file == "camera.jpg" else "RGB"), r.file


def test_boxes_lie_inside_the_picture(dataset: Dataset) -> None:
    for r in dataset.records:
        for o in r.objects:
            x, y, w, h = o.bbox
            assert w > 0 and h > 0
            assert 0 <= x and 0 <= y and x + w <= r.width and y + h <= r.height, (r.file, o)


def test_recipe_matches_the_annotations() -> None:
    instances = json.loads(
        resources.files("counterfactual").joinpath("data", "demo_instances.json").read_text()
    )
    recipe = demo_recipe()
    assert set(recipe) == {i["file_name"] for i in instances["images"]}
    photo_size = {file.removesuffix(".jpg"): spec["size"] for file, spec in recipe.items()}
    for image in instances["images"]:
        spec = recipe[image["file_name"]]
        assert spec["size"] == [image["width"], image["height"]]
        # the layers tile the canvas: no empty (black) area in any picture
        covered = np.zeros((image["height"], image["width"]), dtype=int)
        for layer in spec["layers"]:
            x, y = layer["at"]
            if "resize" in layer:
                w, h = layer["resize"]
            elif "crop" in layer:
                left, top, right, bottom = layer["crop"]
                w, h = right - left, bottom - top
            else:
                w, h = photo_size[layer["photo"]]
            covered[y : y + h, x : x + w] += 1
        assert (covered == 1).all(), image["file_name"]


def test_composite_boxes_are_the_source_boxes_moved(dataset: Dataset) -> None:
    """A composite's boxes are its photos' boxes, cropped, scaled and moved as the recipe says."""
    recipe = demo_recipe()
    for file, spec in recipe.items():
        if len(spec["layers"]) < 2:
            continue
        expected = []
        for layer in spec["layers"]:
            source = _record(dataset, f"{layer['photo']}.jpg")
            left, top, right, bottom = layer.get("crop", [0, 0, source.width, source.height])
            w, h = layer.get("resize", [right - left, bottom - top])
            sx, sy = w / (right - left), h / (bottom - top)
            for o in source.objects:
                x0, y0 = max(o.bbox[0], left), max(o.bbox[1], top)
                x1 = min(o.bbox[0] + o.bbox[2], right)
                y1 = min(o.bbox[1] + o.bbox[3], bottom)
                if x1 > x0 and y1 > y0:
                    bx, by = layer["at"][0] + (x0 - left) * sx, layer["at"][1] + (y0 - top) * sy
                    expected.append((o.category, bx, by, (x1 - x0) * sx, (y1 - y0) * sy))
        got = [(o.category, *o.bbox) for o in _record(dataset, file).objects]
        assert len(got) == len(expected), file
        for g, e in zip(got, expected, strict=True):
            assert g[0] == e[0]
            assert g[1:] == pytest.approx(e[1:], abs=0.01), (file, g, e)


# (picture, candidate class) -> (plan kind, rule that rejects it or None), default alphas.
EXPECTED = {
    ("astronaut.jpg", "person"): ("single", "keep-overlap"),
    ("astronaut.jpg", "flag"): ("single", None),
    ("astronaut.jpg", "rocket"): ("single", None),
    ("astronaut.jpg", "helmet"): ("single", None),
    ("coffee.jpg", "dining table"): ("multi", "nothing-kept"),
    ("coffee.jpg", "saucer"): ("multi", "keep-overlap"),
    ("coffee.jpg", "cup"): ("single", "keep-overlap"),
    ("coffee.jpg", "spoon"): ("single", None),
    ("camera.jpg", "person"): ("multi", "keep-overlap"),
    ("camera.jpg", "camera"): ("single", None),
    ("camera.jpg", "tripod"): ("single", None),
    ("motorcycle.jpg", "motorcycle"): ("single", "keep-overlap"),
    ("motorcycle.jpg", "bench"): ("single", None),
    ("cat_and_rocket.jpg", "cat"): ("single", "too-large"),
    ("cat_and_rocket.jpg", "rocket"): ("single", None),
    ("cameraman_and_espresso.jpg", "person"): ("multi", None),
    ("cameraman_and_espresso.jpg", "camera"): ("single", None),
    ("cameraman_and_espresso.jpg", "dining table"): ("multi", None),
    ("cameraman_and_espresso.jpg", "saucer"): ("multi", "keep-overlap"),
    ("cameraman_and_espresso.jpg", "cup"): ("single", "keep-overlap"),
    ("cameraman_and_espresso.jpg", "spoon"): ("single", None),
}


def test_every_rule_outcome_occurs(dataset: Dataset) -> None:
    config = SelectionConfig()
    got = {}
    reasons = {}
    for r in dataset.records:
        sel = candidates(r, config)
        reasons[r.file] = sel.reason
        for plan in sel.candidates:
            got[(r.file, plan.target)] = (plan.kind, plan.rejected_by)
    assert got == EXPECTED
    assert reasons["chelsea.jpg"] == reasons["rocket.jpg"] == "fewer-than-two-classes"
    outcomes = set(got.values())
    for outcome in [
        ("single", None),
        ("multi", None),
        ("multi", "nothing-kept"),
        ("single", "keep-overlap"),
        ("single", "too-large"),
    ]:
        assert outcome in outcomes


def test_multi_plan_removes_what_lies_inside_the_target(dataset: Dataset) -> None:
    r = _record(dataset, "cameraman_and_espresso.jpg")
    person = next(p for p in candidates(r, SelectionConfig()).candidates if p.target == "person")
    assert person.removed == ("person", "camera")
    assert person.co_removal["camera"] == pytest.approx(1.0)
    assert set(person.kept) == {"dining table", "saucer", "cup", "spoon"}
    assert person.removed_fraction == pytest.approx(331 * 117 / (512 * 521))


def test_select_keeps_one_valid_plan_per_image(dataset: Dataset) -> None:
    for r in dataset.records:
        sel = select(r, SelectionConfig(), seed=3)
        if r.file in ("chelsea.jpg", "rocket.jpg"):
            assert sel.plans == () and sel.reason == "fewer-than-two-classes"
        else:
            assert len(sel.plans) == 1 and sel.plans[0].valid, r.file


def test_captions_mention_the_objects(dataset: Dataset) -> None:
    """Every class of a picture is named in at least one of its captions."""
    words = _class_words()
    for r in dataset.records:
        text = " ".join(c.text.lower() for c in r.captions)
        tokens = set(re.findall(r"[a-z]+", text))
        for cls in r.classes:
            found = any(
                re.search(rf"\b{w}\b", text) if " " in w else tokens & {w, w + "s", w + "es"}
                for w in words[cls]
            )
            assert found, (r.file, cls)


def test_prepare_twice_keeps_the_pictures(tmp_path: Path) -> None:
    files = prepare_demo(tmp_path)
    picture = files.images / "cat_and_rocket.jpg"
    first = picture.read_bytes()
    stamp = picture.stat().st_mtime_ns
    again = prepare_demo(tmp_path)
    assert again == files
    assert picture.stat().st_mtime_ns == stamp
    # a picture of the wrong size is rewritten, byte for byte the same as the first time
    Image.new("RGB", (10, 10)).save(picture, "JPEG")
    prepare_demo(tmp_path)
    assert picture.read_bytes() == first
    assert not list(files.images.glob("*.tmp")) and not list(files.images.glob(".*"))


def test_missing_scikit_image_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "skimage.data", None)
    with pytest.raises(ImportError, match=r"skimage is needed here .*: pip install .*\[demo\]"):
        prepare_demo(tmp_path)
