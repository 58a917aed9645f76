"""Masks and fills: outside the mask nothing changes; inside, zero is zero and mean is the mean."""

import numpy as np
import pytest

from counterfactual.image import (
    FLAT_KEYS,
    DiffusersConfig,
    EditRequest,
    FillConfig,
    ImageConfig,
    LamaConfig,
    OpenCVConfig,
    make_editor,
)
from counterfactual.image.fills import blur
from counterfactual.method.masks import MaskConfig, box_mask, dilate, plan_mask
from counterfactual.method.selection import SelectionConfig, select
from counterfactual.records import ImageRecord, ObjectAnnotation

METHODS = [
    ImageConfig(method="zero"),
    ImageConfig(method="mean"),
    ImageConfig(method="blur"),
    ImageConfig(method="blur", fill=FillConfig(blur_sigma=3)),
    ImageConfig(method="inpaint", backend="opencv"),
    ImageConfig(method="inpaint", backend="opencv", opencv=OpenCVConfig(algorithm="ns")),
    ImageConfig(method="inpaint", backend="opencv", opencv=OpenCVConfig(max_side=0)),
]
IDS = ["zero", "mean", "blur", "blur-small-sigma", "telea", "ns", "telea-native"]


def photo(h=120, w=160, seed=0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 // w, yy * 255 // h, (xx + yy) % 256], -1)
    return np.clip(base + rng.integers(-20, 20, (h, w, 3)), 0, 255).astype(np.uint8)


MASKS = {
    "middle": [(40, 30, 50, 40)],
    "corner": [(0, 0, 30, 25)],
    "edge-and-fraction": [(130.5, 90.2, 40, 40), (10, 100, 20, 20)],
}


@pytest.mark.parametrize("config", METHODS, ids=IDS)
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_outside_the_mask_nothing_changes(config, mask_name):
    image = photo()
    mask = box_mask(*image.shape[:2], MASKS[mask_name])
    (out,) = make_editor(config)([EditRequest(image, mask)])
    assert out.shape == image.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out[mask == 0], image[mask == 0])
    assert (out[mask > 0] != image[mask > 0]).any()


@pytest.mark.parametrize("config", METHODS, ids=IDS)
def test_empty_mask_returns_the_image(config):
    image = photo()
    (out,) = make_editor(config)([EditRequest(image, np.zeros(image.shape[:2], np.uint8))])
    np.testing.assert_array_equal(out, image)


def test_zero_is_zero_and_mean_is_the_mean():
    image = photo()
    mask = box_mask(*image.shape[:2], [(10, 10, 20, 30), (25, 20, 30, 10)])
    (zero,) = make_editor(ImageConfig(method="zero"))([EditRequest(image, mask)])
    assert (zero[mask > 0] == 0).all()
    (mean,) = make_editor(ImageConfig(method="mean"))([EditRequest(image, mask)])
    expected = np.round(image[mask > 0].mean(axis=0)).astype(np.uint8)
    assert (mean[mask > 0] == expected).all()


def test_blur_at_reduced_scale_is_close_to_the_full_blur():
    import cv2

    image = photo(200, 200)
    full = cv2.GaussianBlur(image, (0, 0), 15).astype(float)
    fast = blur(image, 15).astype(float)
    # compare away from the borders, where padding conventions differ
    assert np.abs(full - fast)[45:-45, 45:-45].mean() < 2.0


def test_bad_inputs_are_value_errors():
    editor = make_editor(ImageConfig(method="zero"))
    image = photo()
    with pytest.raises(ValueError, match="mask"):
        editor([EditRequest(image, np.zeros((5, 5), np.uint8))])
    with pytest.raises(ValueError, match="image"):
        editor([EditRequest(image.astype(np.float32), np.zeros(image.shape[:2], np.uint8))])
    with pytest.raises(ValueError, match="method"):
        ImageConfig(method="erase")
    with pytest.raises(ValueError, match="backend"):
        ImageConfig(backend="lama-cloud")
    with pytest.raises(ValueError, match="ImageConfig.lama must be a LamaConfig"):
        ImageConfig(lama=DiffusersConfig())  # type: ignore[arg-type]


FORMAT2_KEYS = [
    *("method", "backend", "blur_sigma", "opencv_algorithm", "opencv_radius", "opencv_max_side"),
    *("lama_max_side", "model", "steps", "guidance_scale", "strength", "prompt"),
    *("negative_prompt", "resolution", "candidates", "crop_padding"),
]
"""The image options as every run since format 2 records them, in that order."""


def test_each_backend_reads_its_own_part():
    """The flat options (the command line's and the manifest's names) land in the part of the
    backend that reads them, and come back flat in the order runs record them."""
    lama = ImageConfig.from_flat({"backend": "lama", "model": "big-lama.pt", "lama_max_side": 512})
    assert lama.lama == LamaConfig(model="big-lama.pt", max_side=512)
    assert lama.diffusers == DiffusersConfig()
    flat = lama.flat()
    assert list(flat) == FORMAT2_KEYS  # the options added since only when set
    assert list(FLAT_KEYS)[: len(FORMAT2_KEYS)] == FORMAT2_KEYS
    assert (flat["model"], flat["lama_max_side"], flat["crop_padding"]) == (
        "big-lama.pt",
        512,
        0.25,
    )
    sd = ImageConfig.from_flat({"backend": "diffusers", "model": "sd", "steps": 4, "candidates": 2})
    assert sd.diffusers == DiffusersConfig(model="sd", steps=4, candidates=2)
    assert sd.lama == LamaConfig()
    # OpenCV loads no model: its ``model`` is the diffusers one, as --inpaint-model always was
    opencv = ImageConfig.from_flat({"model": "other", "opencv_radius": 5, "blur_sigma": 2.0})
    assert opencv.diffusers.model == "other" and opencv.opencv.radius == 5
    assert opencv.fill == FillConfig(blur_sigma=2.0)
    for config in (lama, sd, opencv, ImageConfig(), ImageConfig(method="zero")):
        assert ImageConfig.from_flat(config.flat()) == config
    assert ImageConfig().flat()["model"] == DiffusersConfig().model
    with pytest.raises(ValueError, match=r"unknown image option\(s\) \['device'\]"):
        ImageConfig.from_flat({"device": "cuda"})
    with pytest.raises(TypeError):
        ImageConfig(device="cuda")  # type: ignore[call-arg]  # the runtime is make_editor's


def test_box_mask_rounds_outwards_and_clips():
    mask = box_mask(10, 10, [(1.5, 2.2, 2.0, 1.0), (8, 8, 5, 5)])
    assert mask.dtype == np.uint8 and set(np.unique(mask)) == {0, 255}
    assert mask[2:4, 1:4].all() and mask[2:4, 1:4].size == mask[:8, :8].astype(bool).sum()
    assert mask[8:, 8:].all()


def test_plan_mask_box_segmentation_and_dilation():
    poly = ((10.0, 10.0, 30.0, 10.0, 10.0, 30.0),)  # a triangle inside its box
    record = ImageRecord(
        "1",
        "1.jpg",
        100,
        50,
        (
            ObjectAnnotation((10, 10, 20, 20), "a", segmentation=poly),
            ObjectAnnotation((60, 10, 20, 20), "b"),
        ),
        (),
    )
    plan = next(p for p in select(record, SelectionConfig(policy="all")).plans if p.target == "a")
    boxed = plan_mask(record, plan, 50, 100, MaskConfig())
    segmented = plan_mask(record, plan, 50, 100, MaskConfig(source="segmentation"))
    assert boxed.astype(bool).sum() == 400
    assert 150 < segmented.astype(bool).sum() < 300
    assert not segmented[28, 28]  # outside the triangle, inside the box
    grown = plan_mask(record, plan, 50, 100, MaskConfig(dilate=3))
    assert grown.astype(bool).sum() > 400 and grown[10:30, 10:30].all()
    # decoded at twice the annotated size: boxes scale
    assert plan_mask(record, plan, 100, 200, MaskConfig()).astype(bool).sum() == 1600
    assert dilate(boxed, 0) is boxed
    with pytest.raises(ValueError, match="source"):
        MaskConfig(source="sam")
