"""The eraser declarations and what follows from them, any diffusers inpainting pipeline (SD and
a tiny SDXL saved and loaded back), recipes, full batches on one canvas, model outputs that are
not pictures, and the feathered paste."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arrays import random_image, rect_mask

from counterfactual.cli import build_parser
from counterfactual.cli.synth import build_config, build_runtime
from counterfactual.image import (
    ERASERS,
    FLAT_KEYS,
    DiffusersConfig,
    EditRequest,
    Eraser,
    ImageConfig,
    cli_options,
    make_editor,
)
from counterfactual.image.base import output_failure, recorded
from counterfactual.image.checks import feather_alpha, paste
from counterfactual.image.diffusion import RECIPES, canvas_side, crop_box, work_size
from counterfactual.options import declare, declared

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


# --- declarations (no model) ---------------------------------------------------------------


def test_every_declared_option_is_a_flat_key_a_part_field_and_a_flag():
    parser = build_parser()
    synth = parser._subparsers._group_actions[0].choices["synth"]  # type: ignore[union-attr]
    flags = {s for a in synth._actions for s in a.option_strings}
    config = ImageConfig()
    for eraser in ERASERS.values():
        part = getattr(config, eraser.name)
        assert isinstance(part, eraser.config)
        assert [o.field for o in eraser.options] == [f.name for f in fields(eraser.config)]
        for option in eraser.options:
            assert FLAT_KEYS[option.flat][1] == option.field
            assert hasattr(part, option.field)
            if option.cli:
                assert option.cli in flags, option
        # the command line's options of a part are the ones its config declares
        assert [d.field for d in declared(eraser.config)] == [
            o.field for o in eraser.options if o.cli
        ]
    shown = [d.flags[0] for d in cli_options().values()]
    assert shown == sorted(
        {o.cli for e in ERASERS.values() for o in e.options if o.cli}, key=shown.index
    )
    assert {k: d.dest for k, d in cli_options().items() if k != d.dest} == {
        "model": "inpaint_model",
        "recipe": "inpaint_recipe",
        "grow": "inpaint_grow",
    }


def test_an_eraser_declaration_is_checked():
    fill = ERASERS["fill"]

    @dataclass(frozen=True)
    class Twice:
        a: int = field(default=1, metadata=recorded("x"))
        b: int = field(default=2, metadata=recorded("x"))

    with pytest.raises(ValueError, match=r"two fields are recorded as \['x'\]"):
        Eraser("x", Twice, fill.build, "x")
    with pytest.raises(ValueError, match="model field 'weights' is not a field"):
        Eraser("x", fill.config, fill.build, "x", model="weights")
    with pytest.raises(ValueError, match="must be a dataclass"):
        Eraser("x", dict, fill.build, "x")
    with pytest.raises(ValueError, match="option kind 'number'"):
        declare(1.0, help="h", kind="number")


def test_new_options_are_recorded_only_when_set_and_runtime_ones_never():
    plain = ImageConfig(backend="diffusers")
    assert "feather" not in plain.flat() and "recipe" not in plain.flat()
    soft = ImageConfig(backend="diffusers", diffusers=DiffusersConfig(feather=4, compile=True))
    flat = soft.flat()
    assert flat["feather"] == 4 and "compile" not in flat
    assert ImageConfig.from_flat(flat).diffusers.feather == 4
    # a shared key goes to the chosen backend's part
    lama = ImageConfig.from_flat({"backend": "lama", "model": "big-lama.pt", "feather": 3})
    assert lama.lama.feather == 3 and lama.diffusers.feather == 0


def test_the_rorem_recipe_and_explicit_options_over_it():
    rorem = ImageConfig.from_flat({"backend": "diffusers", "recipe": "rorem", "steps": 20})
    d = rorem.diffusers
    assert (d.model, d.guidance_scale, d.strength, d.resolution) == (
        "LetsThink/RORem",
        1.0,
        0.99,
        512,
    )
    assert d.steps == 20 and d.recipe == "rorem" and "masterpiece" in d.prompt
    assert rorem.flat()["recipe"] == "rorem"
    assert ImageConfig.from_flat(rorem.flat()) == rorem
    with pytest.raises(ValueError, match="recipe 'rorem2' is not one of rorem, sdxl"):
        DiffusersConfig(recipe="rorem2")
    # the command line: a recipe's values where no option is given, the option where one is
    args = build_parser().parse_args(
        ["synth", "--out", "/tmp/x", "--dataset", "coco", "--root", "/tmp/r"]
        + ["--inpaint-backend", "diffusers", "--inpaint-recipe", "rorem", "--steps", "30"]
    )
    cli = build_config(args).image.diffusers
    assert cli == DiffusersConfig.from_recipe("rorem", steps=30)
    fingerprint = build_config(args).fingerprint()["image"]
    assert fingerprint["recipe"] == "rorem" and fingerprint["model"] == "LetsThink/RORem"
    assert build_runtime(args).dtype == "float32"
    assert set(RECIPES) == {"rorem", "sdxl"}


# --- working sizes: one canvas, one call ---------------------------------------------------


def _sweep(n: int = 16) -> list[EditRequest]:
    """Boxes of many sizes and places on one 640x480 picture: their crops have several shapes
    (5 working sizes among the first 8 before the canvas)."""
    image = random_image(480, 640, seed=5)
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        w, h = int(rng.integers(16, 600)), int(rng.integers(16, 460))
        x, y = int(rng.integers(0, 640 - w)), int(rng.integers(0, 480 - h))
        out.append(EditRequest(image, rect_mask(480, 640, y, y + h, x, x + w), ("dog",), (), i))
    return out


def test_a_sweep_of_boxes_has_many_crop_sizes_but_one_canvas():
    sizes, sides = set(), set()
    for request in _sweep():
        y, x = np.nonzero(request.mask)
        box = (int(x.min()), int(y.min()), int(x.max()) + 1, int(y.max()) + 1)
        x0, y0, x1, y1 = crop_box(box, 0.25, 480, 640)
        size = work_size(x1 - x0, y1 - y0, 512)
        sizes.add(size)
        sides.add(canvas_side(size, 512))
    assert len(sizes) >= 4 and sides == {512}
    assert canvas_side((600, 200), 0) == 768 and canvas_side((3000, 8), 0) == 3072


# --- feathered paste and output checks (no model) ------------------------------------------


def test_feathered_paste_touches_nothing_beyond_the_band():
    dst = random_image(40, 50, seed=1)
    src = random_image(40, 50, seed=2)
    mask = rect_mask(40, 50, 15, 25, 20, 30)
    hard, soft = dst.copy(), dst.copy()
    paste(hard, src, mask)
    paste(soft, src, mask, feather=4)
    inside = mask > 0
    np.testing.assert_array_equal(soft[inside], src[inside])
    alpha = feather_alpha(mask, 4)
    far = alpha == 0
    np.testing.assert_array_equal(soft[far], dst[far])  # outside mask + 4 px: unchanged
    # changed: the 10x10 mask, four 10x4 strips, four rounded corners of 13 pixels (a, b in
    # 1..4 with a^2 + b^2 < 25)
    assert (~far).sum() == 100 + 4 * 40 + 4 * 13
    band = (alpha > 0) & (alpha < 1)
    assert np.any(soft[band] != dst[band]) and np.all(hard[band] == dst[band])
    assert alpha[20, 30] == pytest.approx(4 / 5) and alpha[20, 33] == pytest.approx(1 / 5)


def test_output_checks():
    ok = np.linspace(0, 1, 48).reshape(4, 4, 3)
    assert output_failure(ok, "x") is None
    nan = ok.copy()
    nan[0, 0, 0] = np.nan
    assert output_failure(nan, "x").reason == "non-finite-output"  # type: ignore[union-attr]
    assert output_failure(np.zeros((4, 4, 3)), "x").reason == "blank-output"  # type: ignore[union-attr]
    assert output_failure(np.full((4, 4, 3), 7, np.uint8), "x").reason == "blank-output"  # type: ignore[union-attr]


# --- real pipelines, tiny and random, saved and loaded back --------------------------------

torch = pytest.importorskip("torch")
if importlib.util.find_spec("diffusers") is None:  # not imported here: collection stays light
    pytest.skip("diffusers is not installed", allow_module_level=True)


class _Counting:
    """The pipeline, with the number of images each call got recorded."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline
        self.calls: list[tuple[int, int, int]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append((len(kwargs["image"]), kwargs["width"], kwargs["height"]))
        return self.pipeline(**kwargs)


@pytest.fixture(scope="module")
def sdxl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from counterfactual.testing import build_tiny_sdxl_inpaint_pipeline

    return build_tiny_sdxl_inpaint_pipeline(tmp_path_factory.mktemp("sdxl") / "pipeline")


def _sdxl(path: Path, batch_size: int = 8, **options: Any):
    diffusers = DiffusersConfig(model=str(path), steps=1, resolution=32, **options)
    return make_editor(ImageConfig(backend="diffusers", diffusers=diffusers), batch_size=batch_size)


@pytest.mark.slow
def test_sdxl_loads_through_the_one_path_and_a_batch_is_one_call(sdxl: Path):
    editor = _sdxl(sdxl)
    assert editor.describe()["pipeline"] == "StableDiffusionXLInpaintPipeline"
    counting = _Counting(editor._pipeline)  # type: ignore[attr-defined]
    editor._pipeline = counting  # type: ignore[attr-defined]
    requests = _sweep(8)
    outputs = editor(requests)
    assert counting.calls == [(8, 32, 32)]  # 8 crops of many shapes: one pipeline call
    for request, out in zip(requests, outputs, strict=True):
        assert isinstance(out, np.ndarray) and out.shape == request.image.shape
        outside = request.mask == 0
        np.testing.assert_array_equal(out[outside], request.image[outside])
        assert np.any(out[~outside] != request.image[~outside])


@pytest.mark.slow
def test_a_nan_or_blank_output_is_a_failure_and_is_not_pasted(sdxl: Path, tmp_path: Path):
    from test_stages import records

    from counterfactual.synth.plan import SynthConfig
    from counterfactual.synth.runner import run_local

    editor = _sdxl(sdxl, batch_size=2)
    request = _sweep(1)[0]
    unet = editor._pipeline.unet  # type: ignore[attr-defined]
    with torch.no_grad():
        unet.conv_out.bias.fill_(float("nan"))  # the real model, broken as fp16 overflows break it
    (out,) = editor([request])
    assert getattr(out, "reason", None) == "non-finite-output"
    config = SynthConfig(image=ImageConfig(backend="diffusers"), images_per_shard=10)
    result = run_local(records(tmp_path, 3), tmp_path / "out", config, editor=editor)
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "status.jsonl").read_text().splitlines()
    ]
    failed = [r for r in rows if r["status"] == "failed"]
    assert failed and {r["reason"] for r in failed} == {"non-finite-output"}
    assert result.written == 0
    vae = editor._pipeline.vae  # type: ignore[attr-defined]
    with torch.no_grad():
        unet.conv_out.bias.zero_()
        vae.decoder.conv_out.weight.zero_()
        vae.decoder.conv_out.bias.fill_(-10.0)  # every pixel black
    (out,) = editor([request])
    assert getattr(out, "reason", None) == "blank-output"


@pytest.mark.slow
def test_feather_and_channels_last_on_the_real_pipeline(sdxl: Path):
    editor = _sdxl(sdxl, feather=3, channels_last=True)
    info = editor.describe()
    assert info["feather"] == 3 and info["channels_last"] is True
    request = _sweep(2)[1]
    (out,) = editor([request])
    alpha = feather_alpha(request.mask, 3)
    np.testing.assert_array_equal(out[alpha == 0], request.image[alpha == 0])
    band = (alpha > 0) & (alpha < 1)
    assert np.any(out[band] != request.image[band])


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["diffusers", "lama"])
def test_an_edit_sent_as_crops_gives_the_same_pictures(
    backend: str, sdxl: Path, tmp_path: Path
) -> None:
    """What a Ray worker does for Edit's actor pool (crop_for_edit, Edit on the crops,
    paste_edit) gives the whole-picture Edit's bytes, and sends a fraction of the pixels; with
    ``--pairs`` each job gets its whole original back for Encode's ``orig.jpg``."""
    from PIL import Image
    from test_stages import records
    from tiny_lama import build_tiny_lama

    from counterfactual.image import LamaConfig
    from counterfactual.synth.job import Job
    from counterfactual.synth.plan import SynthConfig, plan
    from counterfactual.synth.steps import Decode, Edit, crop_for_edit, paste_edit

    recs = records(tmp_path, 4)
    for i in range(len(recs)):  # noise, so that no fill is blank
        Image.fromarray(random_image(60, 80, seed=i)).save(tmp_path / f"{i}.jpg", quality=95)
    if backend == "lama":
        lama = LamaConfig(model=str(build_tiny_lama(tmp_path / "lama.pt")), feather=2)
        image = ImageConfig(backend="lama", lama=lama)
    else:
        diffusers = DiffusersConfig(model=str(sdxl), steps=1, resolution=32, feather=2)
        image = ImageConfig(backend="diffusers", diffusers=diffusers)
    config = SynthConfig(image=image, pairs=True)
    items = [item for out in plan(recs, config) if isinstance(out, list) for item in out]

    def jobs() -> list[Job]:
        return Decode(config)([Job(0, i, item) for i, item in enumerate(items)])

    edit = Edit(config)
    whole = edit(jobs())
    sent = jobs()
    full = sum(job.image.size for job in sent if job.image is not None)
    cuts = crop_for_edit(sent, config)
    assert all(cut is not None for cut in cuts)
    sent_pixels = sum(job.image.size for job in sent if job.image is not None)
    # LaMa's crop is at least 256 px: on these 80x60 pictures, the picture itself
    assert sent_pixels < full if backend == "diffusers" else sent_pixels == full
    cropped = edit(sent)
    paste_edit(cropped, cuts)
    assert [j.ok for j in cropped] == [j.ok for j in whole] and any(j.ok for j in whole)
    for a, b in zip(whole, cropped, strict=True):
        if a.ok:
            np.testing.assert_array_equal(a.edited, b.edited)
            np.testing.assert_array_equal(a.mask, b.mask)
            assert a.image is not None and a.image.shape[:2] == a.mask.shape
            np.testing.assert_array_equal(a.image, b.image)
