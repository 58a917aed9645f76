"""``counterfactual.edit`` (issue 22, point 7): one call erases a class from one picture and
its caption, with the real OpenCV eraser and the real spaCy model, on the demo's photos (the
demo's own class words); importing ``counterfactual`` stays cheap."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import counterfactual
from counterfactual.readers.demo import demo_vocabulary_path, read_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    ds = read_demo(tmp_path_factory.mktemp("demo"))
    return {r.file: r for r in ds.records}


def _inputs(record):
    picture = Image.open(Path(record.root) / record.file)
    boxes = [(o.category, o.bbox) for o in record.objects]
    return picture, boxes, record.captions[0].text


VOCABULARY = str(demo_vocabulary_path())


def test_import_is_cheap_and_edit_is_there():
    code = (
        "import sys, counterfactual; "
        "print(sorted(m for m in ('numpy', 'cv2', 'spacy', 'PIL', 'torch') if m in sys.modules)); "
        "print(callable(counterfactual.edit), counterfactual.EditResult.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True EditResult"]


def test_one_call_removes_a_class_from_picture_and_caption(demo):
    picture, boxes, caption = _inputs(demo["camera.jpg"])
    assert picture.mode == "L"  # a grayscale JPEG: made RGB
    result = counterfactual.edit(picture, boxes, caption, remove="tripod", vocabulary=VOCABULARY)
    assert caption == "A man in a black coat looks through a video camera mounted on a tripod."
    assert result.caption == "A man in a black coat looks through a video camera mounted."
    assert result.removed_phrases == ("a tripod",) and result.still_named == ()
    assert (result.removed, result.kept) == (("tripod",), ("person", "camera"))
    assert result.plan.valid and result.plan.mask_boxes == ((229.0, 186.0, 178.0, 326.0),)
    assert result.image.mode == result.original.mode == "RGB" and result.mask.mode == "L"
    assert result.image.size == result.mask.size == picture.size
    mask = np.asarray(result.mask)
    assert np.count_nonzero(mask) == 178 * 326 and set(np.unique(mask)) == {0, 255}
    before, after = np.asarray(result.original), np.asarray(result.image)
    assert np.array_equal(before[mask == 0], after[mask == 0])  # only the mask is repainted
    assert np.abs(before[mask > 0].astype(int) - after[mask > 0]).mean() > 10


def test_arrays_dicts_and_the_rules_choosing(demo):
    record = demo["coffee.jpg"]
    pixels = np.asarray(Image.open(Path(record.root) / record.file).convert("RGB"))
    boxes = [{"category": o.category, "bbox": list(o.bbox)} for o in record.objects]
    caption = record.captions[0].text
    first = counterfactual.edit(pixels, boxes, caption, vocabulary=VOCABULARY, seed=3)
    again = counterfactual.edit(pixels, boxes, caption, vocabulary=VOCABULARY, seed=3)
    assert first.plan == again.plan and first.caption == again.caption
    assert np.array_equal(np.asarray(first.image), np.asarray(again.image))
    assert first.plan.valid and first.plan.target in {"saucer", "cup", "spoon"}
    spoon = counterfactual.edit(pixels, boxes, caption, remove=["spoon"], vocabulary=VOCABULARY)
    assert spoon.caption == "A cup of espresso on a red saucer on a wooden table."
    blurred = counterfactual.edit(
        pixels, boxes, caption, remove="spoon", vocabulary=VOCABULARY,
        image_method="blur", text_method="prompt", dilate=4,
    )  # fmt: skip
    assert all(k in blurred.caption for k in blurred.kept)  # a template naming the kept ones
    assert "spoon" not in blurred.caption
    assert np.count_nonzero(np.asarray(blurred.mask)) > np.count_nonzero(np.asarray(spoon.mask))


def test_what_cannot_be_done_says_why(demo):
    picture, boxes, caption = _inputs(demo["coffee.jpg"])
    with pytest.raises(counterfactual.EditError, match="nothing-kept") as err:
        counterfactual.edit(picture, boxes, caption, remove="dining table", vocabulary=VOCABULARY)
    assert err.value.reason == "nothing-kept" and len(err.value.candidates) == 4
    with pytest.raises(counterfactual.EditError, match="spoon: removes only spoon") as err:
        counterfactual.edit(picture, boxes, caption, remove=["spoon", "cup"])
    assert err.value.reason == "not-one-plan"
    with pytest.raises(counterfactual.EditError, match="the boxes' classes are cup, dining"):
        counterfactual.edit(picture, boxes, caption, remove="dog", vocabulary=VOCABULARY)
    lone = [("cat", (0, 0, 10, 10))]
    with pytest.raises(counterfactual.EditError, match="fewer-than-two-classes"):
        counterfactual.edit(picture, lone, "a cat")
    with pytest.raises(ValueError, match=r"box 1 \(cup\): w and h must be > 0"):
        counterfactual.edit(picture, [("cat", (0, 0, 9, 9)), ("cup", (0, 0, 0, 5))], "a cup")
    with pytest.raises(ValueError, match="image method 'erase'"):
        counterfactual.edit(picture, boxes, caption, image_method="erase")
    with pytest.raises(ValueError, match="an image array must be"):
        counterfactual.edit(np.zeros((4, 4, 4), np.uint8), boxes, caption)
