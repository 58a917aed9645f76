"""LaMa's batches (issue 35, point 1): crops go onto a few square canvases so that a batch of
COCO-like requests is one or two forwards, not one per crop size; counted on a tiny TorchScript
model with LaMa's interface, saved and reloaded through the real loading code."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from arrays import random_image, rect_mask

torch = pytest.importorskip("torch")

from tiny_lama import build_tiny_lama  # noqa: E402

from counterfactual.image import EditRequest, ImageConfig, LamaConfig, make_editor  # noqa: E402
from counterfactual.image.lama import canvas_side, canvases  # noqa: E402
from counterfactual.imageio import load_rgb  # noqa: E402
from counterfactual.readers.generate import generate_coco  # noqa: E402


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lama(tmp_path_factory.mktemp("lama") / "tiny-lama.pt")


def _editor(model: Path, batch_size: int = 8, **lama: object):
    config = ImageConfig(method="inpaint", backend="lama", lama=LamaConfig(str(model), **lama))  # type: ignore[arg-type]
    editor = make_editor(config, batch_size=batch_size)
    counting = _Counting(editor._model)  # type: ignore[attr-defined]
    editor._model = counting  # type: ignore[attr-defined]
    return editor, counting


class _Counting:
    """The scripted model, recording the input shape of each forward."""

    def __init__(self, model: object) -> None:
        self.model, self.calls = model, []

    def __call__(self, image, mask):
        self.calls.append(tuple(image.shape))
        return self.model(image, mask)


def coco_requests(root: Path, n: int = 8) -> list[EditRequest]:
    """``n`` COCO-like requests (640x480 pictures, the boxes of each picture's first class)."""
    files = generate_coco(root, n, seed=1)
    instances = json.loads(Path(files.instances).read_text())
    requests = []
    for image in instances["images"]:
        boxes = [a for a in instances["annotations"] if a["image_id"] == image["id"]]
        first = boxes[0]["category_id"]
        mask = np.zeros((image["height"], image["width"]), np.uint8)
        for a in boxes:
            if a["category_id"] == first:
                x, y, w, h = a["bbox"]
                mask[int(y) : math.ceil(y + h), int(x) : math.ceil(x + w)] = 255
        picture = load_rgb(Path(files.images) / image["file_name"])
        requests.append(EditRequest(image=picture, mask=mask))
    return requests


@pytest.mark.parametrize(
    ("long_side", "side"),
    [
        (1, 64),
        (64, 64),
        (72, 64),
        (73, 128),
        (256, 256),
        (263, 256),
        (288, 256),
        (289, 512),
        (512, 512),
        (576, 512),
        (640, 512),
        (5000, 512),
    ],
)
def test_canvas_side(long_side: int, side: int) -> None:
    assert canvases(512) == (64, 128, 256, 512)
    assert canvas_side(long_side, 512) == side


def test_canvases_of_an_odd_work_side() -> None:
    assert canvases(200) == (104, 200)  # halves rounded up to a multiple of 8, >= 64
    assert canvases(64) == (64,)


@pytest.mark.parametrize("side", [-8, 8, 60, 100, 513])
def test_bad_work_side(side: int) -> None:
    with pytest.raises(ValueError, match="lama_work_side must be 0 or a multiple of 8 >= 64"):
        LamaConfig(model="x.pt", work_side=side)


def test_eight_coco_requests_are_one_forward_per_canvas(model_path: Path, tmp_path: Path) -> None:
    requests = coco_requests(tmp_path / "coco")
    native, before = _editor(model_path, work_side=0)
    batched, after = _editor(model_path)
    outs = batched(requests)
    native(requests)
    sides = {canvas_side(max(h, w), 512) for h, w in _crops(requests)}
    assert len(after.calls) == len(sides) <= 2
    assert sorted(c[2] for c in after.calls) == sorted(sides)
    assert sum(c[0] for c in after.calls) == 8
    assert len(before.calls) > len(after.calls)  # grouping by exact padded size
    for request, out in zip(requests, outs, strict=True):
        keep = request.mask == 0
        np.testing.assert_array_equal(out[keep], request.image[keep])
        assert np.any(out[~keep] != request.image[~keep])


def _crops(requests: list[EditRequest]) -> list[tuple[int, int]]:
    from counterfactual.image.lama import region

    crops = [region(LamaConfig("x.pt"), r.mask) for r in requests]
    return [(y1 - y0, x1 - x0) for x0, y0, x1, y1 in crops]


def test_a_batch_of_n_on_one_canvas_is_one_forward(model_path: Path) -> None:
    # eight crops of 256 to 288 px, from pictures of different sizes, one forward of eight
    requests = [
        EditRequest(
            random_image(300 + 7 * i, 400 - 5 * i, i),
            rect_mask(300 + 7 * i, 400 - 5 * i, 20 + i, 80 + 3 * i, 30, 90 + 2 * i),
        )
        for i in range(8)
    ]
    editor, counting = _editor(model_path)
    outs = editor(requests)
    assert counting.calls == [(8, 3, 256, 256)]
    for request, out in zip(requests, outs, strict=True):
        keep = request.mask == 0
        np.testing.assert_array_equal(out[keep], request.image[keep])
    editor.batch_size = 3
    counting.calls.clear()
    editor(requests)
    assert counting.calls == [(3, 3, 256, 256), (3, 3, 256, 256), (2, 3, 256, 256)]


def test_an_output_does_not_depend_on_its_batch(model_path: Path, tmp_path: Path) -> None:
    requests = coco_requests(tmp_path / "coco")
    editor, _ = _editor(model_path)
    together = editor(requests)
    for request, out in zip(requests, together, strict=True):
        (alone,) = editor([request])
        # float noise between batch sizes moves a value by one step at most
        assert np.abs(alone.astype(int) - out.astype(int)).max() <= 1


def test_a_crop_larger_than_the_canvas_is_scaled_down_and_pasted_where_it_was(
    model_path: Path,
) -> None:
    image = random_image(700, 900, 4)
    mask = rect_mask(700, 900, 100, 600, 200, 700)  # a 500 px box: a crop of 700 px
    editor, counting = _editor(model_path)
    (out,) = editor([EditRequest(image, mask)])
    assert counting.calls == [(1, 3, 512, 512)]
    keep = mask == 0
    np.testing.assert_array_equal(out[keep], image[keep])
    changed = np.argwhere(np.any(out != image, axis=2))
    assert changed.min(axis=0).tolist() >= [100, 200] and changed.max(axis=0).tolist() <= [599, 699]
    assert editor.describe()["work_side"] == 512
