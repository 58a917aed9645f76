"""The exemplar fill (``--inpaint-backend exemplar``): pixels outside the mask, determinism,
time, texture, and its place behind the eraser registry."""

from __future__ import annotations

import time

import numpy as np
import pytest

from counterfactual.image import (
    ERASERS,
    EditRequest,
    ExemplarConfig,
    ImageConfig,
    OpenCVConfig,
    edit_region,
    make_editor,
)
from counterfactual.method.masks import box_mask


def _stripes(h: int = 96, w: int = 128, period: int = 8) -> np.ndarray:
    """Vertical black and white stripes with a seeded speckle: a texture a smear cannot fake."""
    x = np.arange(w)
    row = np.where((x // (period // 2)) % 2 == 0, 40, 215).astype(np.int16)
    noise = np.random.default_rng(0).integers(-6, 7, (h, w, 3))
    return np.clip(row[None, :, None] + noise, 0, 255).astype(np.uint8)


def _photo_like(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.linspace(0, 200, w)[None, :, None] + np.linspace(0, 50, h)[:, None, None]
    return np.clip(base + rng.normal(0, 20, (h, w, 3)), 0, 255).astype(np.uint8)


# (name, picture, box xywh): boxes inside, at the corner, at an edge, one pixel, most of it.
CASES = [
    ("middle", (96, 128), (40, 30, 30, 24)),
    ("corner", (96, 128), (0, 0, 25, 20)),
    ("right-edge", (96, 128), (100, 10, 28, 60)),
    ("one-pixel", (96, 128), (64, 48, 1, 1)),
    ("most-of-it", (64, 64), (2, 2, 60, 60)),
    ("tall-picture", (200, 40), (10, 80, 20, 40)),
]


@pytest.mark.parametrize("name, size, box", CASES, ids=[c[0] for c in CASES])
def test_pixels_outside_the_mask_are_unchanged_and_the_hole_is_filled(name, size, box):
    image = _photo_like(*size, seed=len(name))
    mask = box_mask(size[0], size[1], [box])
    editor = make_editor(ImageConfig(backend="exemplar"))
    (out,) = editor([EditRequest(image, mask)])
    assert out.shape == image.shape and out.dtype == np.uint8
    assert np.array_equal(out[mask == 0], image[mask == 0])
    x, y, w, h = box
    if w * h >= 100:  # a real hole is rebuilt, not left as it was
        assert not np.array_equal(out[y : y + h, x : x + w], image[y : y + h, x : x + w])


def test_an_empty_mask_returns_the_picture():
    image = _photo_like(40, 50, 1)
    (out,) = make_editor(ImageConfig(backend="exemplar"))(
        [EditRequest(image, np.zeros((40, 50), np.uint8))]
    )
    assert np.array_equal(out, image)


def test_the_same_request_gives_the_same_pixels_in_a_batch_and_alone():
    image = _photo_like(120, 160, 7)
    masks = [box_mask(120, 160, [b]) for b in ((20, 20, 40, 30), (90, 50, 50, 60))]
    editor = make_editor(ImageConfig(backend="exemplar"))
    batch = editor([EditRequest(image, m) for m in masks])
    again = [editor([EditRequest(image, m)])[0] for m in reversed(masks)][::-1]
    fresh = make_editor(ImageConfig(backend="exemplar"))([EditRequest(image, masks[0])])
    for a, b in zip(batch, again, strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(batch[0], fresh[0])


def test_a_small_picture_takes_well_under_a_second():
    image = _photo_like(240, 320, 3)
    mask = box_mask(240, 320, [(100, 80, 90, 70)])
    editor = make_editor(ImageConfig(backend="exemplar"))
    editor([EditRequest(image, mask)])  # warm-up: OpenCV's first calls
    start = time.perf_counter()
    editor([EditRequest(image, mask)])
    assert time.perf_counter() - start < 2.0  # about 0.2 s here, on a loaded 2-core machine


def test_it_keeps_a_texture_that_telea_smears():
    """Stripes around a hole: the exemplar fill draws stripes (its gradients are as strong as
    the picture's), Telea a smooth smear (a fraction of them)."""
    image = _stripes()
    box = (44, 28, 40, 40)
    mask = box_mask(96, 128, [box])
    x, y, w, h = box

    def edge_energy(config: ImageConfig) -> float:
        (out,) = make_editor(config)([EditRequest(image, mask)])
        hole = out[y : y + h, x : x + w].astype(np.float64).mean(axis=2)
        return float(np.abs(np.diff(hole, axis=1)).mean())

    truth = float(np.abs(np.diff(image[y : y + h, x : x + w].mean(axis=2), axis=1)).mean())
    exemplar = edge_energy(ImageConfig(backend="exemplar"))
    telea = edge_energy(ImageConfig(opencv=OpenCVConfig(algorithm="telea")))
    assert exemplar > 0.6 * truth
    assert telea < 0.5 * exemplar


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"patch": 4}, "exemplar_patch must be odd and >= 3, got 4"),
        ({"patch": 1}, "exemplar_patch must be odd and >= 3, got 1"),
        ({"max_side": 10}, "exemplar_max_side must be 0 (native) or >= 14"),
        ({"passes": 0}, "exemplar_passes must be >= 1, got 0"),
        ({"context": -0.5}, "exemplar_context must be >= 0"),
    ],
)
def test_bad_options_are_refused_naming_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ExemplarConfig(**kwargs)


def test_it_is_a_registered_backend_whose_options_other_runs_do_not_record():
    assert "exemplar" in ERASERS and ERASERS["exemplar"].model == ""
    flat = ImageConfig(backend="exemplar").flat()
    assert flat["backend"] == "exemplar" and not any(k.startswith("exemplar_") for k in flat)
    assert not any(k.startswith("exemplar_") for k in ImageConfig().flat())
    changed = ImageConfig.from_flat({"backend": "exemplar", "exemplar_patch": 5})
    assert changed.exemplar.patch == 5 and changed.flat()["exemplar_patch"] == 5
    mask = box_mask(100, 200, [(90, 40, 20, 10)])
    assert edit_region(changed, mask) == (75, 25, 125, 65)  # max(2 * patch, 0.75 * 20) px
