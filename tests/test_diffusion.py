"""The diffusers inpainting backend, run on a tiny random pipeline saved and reloaded offline."""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arrays import random_image, rect_mask

from counterfactual.method.masks import mask_bounds

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

# looked up, not imported: a worker that never runs this file does not pay for the imports
if any(find_spec(name) is None for name in ("torch", "diffusers", "transformers")):
    pytest.skip("needs torch, diffusers and transformers", allow_module_level=True)

from counterfactual.image import (  # noqa: E402
    DiffusersConfig,
    EditRequest,
    ImageConfig,
    make_editor,
)
from counterfactual.image.diffusion import (  # noqa: E402
    DiffusionInpainter,
    crop_box,
    work_size,
)
from counterfactual.testing import build_tiny_inpaint_pipeline  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_inpaint_pipeline(tmp_path_factory.mktemp("tiny-sd") / "pipeline")


def _config(model: Path, **overrides: object) -> ImageConfig:
    options: dict[str, object] = {
        "model": str(model),
        "steps": 2,
        "resolution": 64,
        "guidance_scale": 5.0,
    }
    options.update(overrides)
    diffusers = DiffusersConfig(**options)  # type: ignore[arg-type]
    return ImageConfig(method="inpaint", backend="diffusers", diffusers=diffusers)


@pytest.fixture(scope="module")
def editor(model_path: Path) -> DiffusionInpainter:
    built = make_editor(_config(model_path))
    assert isinstance(built, DiffusionInpainter)
    return built


_image, _mask = random_image, rect_mask


# --- geometry (no model) -------------------------------------------------------------------


def test_mask_bounds() -> None:
    assert mask_bounds(np.zeros((4, 5), np.uint8)) is None
    assert mask_bounds(_mask(10, 12, 2, 5, 3, 9)) == (3, 2, 9, 5)


@pytest.mark.parametrize(
    ("box", "padding", "height", "width", "expected"),
    [
        # 10x10 box in the middle, 25% padding: 3 px each side (ceil 2.5) -> 16 px square
        ((20, 20, 30, 30), 0.25, 100, 100, (17, 17, 33, 33)),
        # wide box: the crop becomes square by growing the height
        ((20, 40, 60, 50), 0.0, 100, 100, (20, 25, 60, 65)),
        # at the top-left corner the square is shifted into the image, not clipped
        ((0, 0, 10, 10), 0.5, 100, 100, (0, 0, 20, 20)),
        # at the bottom-right corner likewise: the 10x5 box becomes a 10x10 crop
        ((90, 95, 100, 100), 0.0, 100, 100, (90, 90, 100, 100)),
        ((95, 90, 100, 100), 0.0, 100, 100, (90, 90, 100, 100)),
        # image narrower than the square: width clipped to the image, height still grows
        ((2, 10, 8, 40), 0.0, 100, 10, (0, 10, 10, 40)),
        # no padding, square box: unchanged
        ((5, 5, 15, 15), 0.0, 20, 20, (5, 5, 15, 15)),
        # whole image
        ((0, 0, 30, 20), 0.25, 20, 30, (0, 0, 30, 20)),
    ],
)
def test_crop_box(
    box: tuple[int, int, int, int],
    padding: float,
    height: int,
    width: int,
    expected: tuple[int, int, int, int],
) -> None:
    assert crop_box(box, padding, height, width) == expected


def test_crop_box_rejects_boxes_outside_the_image() -> None:
    with pytest.raises(ValueError, match="outside"):
        crop_box((0, 0, 11, 5), 0.0, 10, 10)


@pytest.mark.parametrize(
    ("crop", "resolution", "expected"),
    [
        ((16, 16), 64, (64, 64)),  # small crops are scaled up
        ((200, 200), 64, (64, 64)),  # large ones down
        ((100, 50), 64, (64, 32)),
        ((30, 100), 512, (152, 512)),  # 153.6 -> 152
        ((1, 1000), 64, (8, 64)),  # never below 8
        ((1000, 600), 0, (1000, 600)),  # native: a large crop keeps its size
        ((1003, 601), 0, (1000, 600)),  # ... snapped to multiples of 8
        ((100, 50), 0, (512, 256)),  # a small one is still scaled up to 512
    ],
)
def test_work_size(crop: tuple[int, int], resolution: int, expected: tuple[int, int]) -> None:
    assert work_size(*crop, resolution) == expected


# --- the pipeline --------------------------------------------------------------------------


def test_describe(editor: DiffusionInpainter, model_path: Path) -> None:
    info = editor.describe()
    assert info["method"] == "inpaint"
    assert info["backend"] == "diffusers"
    assert info["model"] == str(model_path)
    assert info["pipeline"] == "StableDiffusionInpaintPipeline"
    assert (info["steps"], info["resolution"], info["dtype"]) == (2, 64, "float32")
    assert info["prompt"] == "{background}"
    assert info["negative_prompt"] == "{removed}"


def test_prompts_from_templates(editor: DiffusionInpainter) -> None:
    request = EditRequest(
        image=_image(8, 8), mask=_mask(8, 8, 0, 1, 0, 1), removed=("dog", "frisbee"), kept=("man",)
    )
    assert editor._prompts(request) == ("empty background, nothing there", "dog, frisbee")


@pytest.mark.parametrize(
    ("y0", "y1", "x0", "x1"),
    [
        (20, 36, 24, 40),  # in the middle
        (0, 12, 0, 20),  # touching the top-left corner
        (30, 48, 50, 64),  # touching the bottom and right borders
        (0, 48, 30, 31),  # a one-pixel-wide line through the whole height
    ],
    ids=["middle", "top-left", "bottom-right", "thin-line"],
)
def test_only_masked_pixels_change(
    editor: DiffusionInpainter, y0: int, y1: int, x0: int, x1: int
) -> None:
    image = _image(48, 64)
    mask = _mask(48, 64, y0, y1, x0, x1)
    (out,) = editor([EditRequest(image=image, mask=mask, removed=("dog",), seed=1)])
    assert out.dtype == np.uint8
    assert out.shape == image.shape
    outside = mask == 0
    np.testing.assert_array_equal(out[outside], image[outside])
    assert np.any(out[~outside] != image[~outside])


def test_any_nonzero_mask_value_means_repaint(editor: DiffusionInpainter) -> None:
    image = _image(40, 40)
    mask = _mask(40, 40, 10, 20, 10, 20) // 255  # values 0 and 1
    (out,) = editor([EditRequest(image=image, mask=mask)])
    np.testing.assert_array_equal(out[mask == 0], image[mask == 0])
    assert np.any(out[mask > 0] != image[mask > 0])


def test_same_seed_same_output_other_seed_other_output(editor: DiffusionInpainter) -> None:
    image = _image(48, 48, seed=3)
    mask = _mask(48, 48, 10, 30, 12, 34)
    first, again, other = editor(
        [
            EditRequest(image=image, mask=mask, seed=7),
            EditRequest(image=image, mask=mask, seed=7),
            EditRequest(image=image, mask=mask, seed=8),
        ]
    )
    np.testing.assert_array_equal(first, again)
    assert np.any(first != other)


class _CountingPipeline:
    """Wraps a pipeline and records how many images each call receives."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append((len(kwargs["image"]), kwargs["width"], kwargs["height"]))
        return self.pipeline(**kwargs)


def test_batch_of_different_sizes(model_path: Path, editor: DiffusionInpainter) -> None:
    batched = make_editor(_config(model_path), batch_size=2)
    assert isinstance(batched, DiffusionInpainter)
    counting = _CountingPipeline(batched._pipeline)
    batched._pipeline = counting
    requests = [
        # 20x20 mask -> 30x30 crop -> 64x64
        EditRequest(image=_image(48, 64, 1), mask=_mask(48, 64, 10, 30, 10, 30), seed=1),
        # 40x10 mask in a 40-pixel-high image -> 60x40 crop -> 64x40 on the 64x64 canvas
        EditRequest(image=_image(40, 100, 4), mask=_mask(40, 100, 0, 40, 45, 55), seed=4),
        # 30x30 mask -> 46x46 crop -> 64x64, batched with the first
        EditRequest(image=_image(80, 56, 2), mask=_mask(80, 56, 40, 70, 20, 50), seed=2),
        EditRequest(image=_image(32, 32, 3), mask=np.zeros((32, 32), np.uint8), seed=3),
    ]
    outputs = batched(requests)
    # every crop is mirrored onto the one 64x64 canvas: full batches, whatever the crop's shape
    assert counting.calls == [(2, 64, 64), (1, 64, 64)]
    assert [o.shape for o in outputs] == [r.image.shape for r in requests]
    for request, out in zip(requests, outputs, strict=True):
        outside = request.mask == 0
        np.testing.assert_array_equal(out[outside], request.image[outside])
        assert np.any(out[~outside] != request.image[~outside]) == bool(request.mask.any())
    # Each request has its own generator: batching changes the result by float noise at most.
    one_by_one = [editor([request])[0] for request in requests]
    for single, out in zip(one_by_one, outputs, strict=True):
        assert np.abs(single.astype(int) - out.astype(int)).max() <= 2


def test_empty_mask_returns_the_input(editor: DiffusionInpainter) -> None:
    image = _image(24, 40)
    (out,) = editor([EditRequest(image=image, mask=np.zeros((24, 40), np.uint8))])
    np.testing.assert_array_equal(out, image)
    assert out is not image


def test_empty_batch(editor: DiffusionInpainter) -> None:
    assert editor([]) == []


def test_missing_model_is_a_value_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="no-such-model"):
        make_editor(_config(missing))


@pytest.mark.parametrize(
    ("image", "mask", "match"),
    [
        (_image(16, 16), np.zeros((16, 15), np.uint8), "mask must have shape"),
        (_image(16, 16), np.zeros((16, 16, 1), np.uint8), "mask must have shape"),
        (_image(16, 16), np.zeros((16, 16), bool), "mask must be a uint8"),
        (_image(16, 16).astype(np.float32), np.zeros((16, 16), np.uint8), "image must be a uint8"),
        (_image(16, 16)[..., :1], np.zeros((16, 16), np.uint8), r"image must have shape"),
    ],
    ids=["mask-width", "mask-3d", "mask-bool", "image-float", "image-gray"],
)
def test_bad_inputs_are_value_errors(
    editor: DiffusionInpainter, image: np.ndarray, mask: np.ndarray, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        editor([EditRequest(image=image, mask=mask)])


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"steps": 0}, "steps"),
        ({"strength": 0.0}, "strength"),
        ({"steps": 2, "strength": 0.4}, "steps \\* strength"),
        ({"resolution": 60}, "resolution"),
        ({"resolution": -8}, "resolution"),
        ({"prompt": "{scene}"}, "prompt"),
    ],
)
def test_bad_config_is_a_value_error(
    model_path: Path, overrides: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        DiffusionInpainter(_config(model_path, **overrides).diffusers)
