"""Erase objects with a diffusers inpainting pipeline (Stable Diffusion 1.5/2, SDXL, RORem, ...).

Any inpainting pipeline loads through one path (:func:`load_pipeline`): ``AutoPipelineForInpainting``
(which also turns a text-to-image checkpoint into its inpainting pipeline), else the class its
``model_index.json`` names, checked to take a ``mask_image``. In half precision the ``fp16``
weight variant is read where the model has one (half the download). A recipe
(:data:`RECIPES`, ``--inpaint-recipe``) sets a published model's own settings: ``rorem`` is
RORem (Li et al. 2025, an SDXL-inpainting fine-tune for object removal) as its authors run it.

Each request is edited in a square crop around its mask rather than on the whole image: the crop
is the mask's bounding box grown by ``crop_padding`` times its size on each side, made square
where the image allows (context helps the model), and scaled so that its long side is
``resolution`` pixels (a multiple of 8; ``0``: native, the crop's own size, scaled up only when
its long side is under 512), then mirrored at the bottom and right onto a square canvas of a few
fixed sizes (:func:`canvas_side`: ``resolution`` itself, or with ``0`` the next of
:data:`NATIVE_CANVASES`), so that every crop of a batch shares one working size and a batch is
one pipeline call (and ``torch.compile`` sees one shape). Small crops are scaled *up*: Stable Diffusion models are
trained at 512 px (or 768, 1024) and produce noise at the 50-200 px that a typical COCO object
occupies, so running them at native crop size gives poor fills. The model's output is scaled back
to the crop and pasted into the original only where the mask is > 0 (with ``feather``, faded
into the picture over that many pixels outside the mask); every other pixel is the input's, byte
for byte (the pipeline re-encodes the whole crop through its VAE, which would otherwise shift
colours everywhere). An output with a NaN or inf, or blank (one colour), is that request's
``SampleError`` (``non-finite-output``, ``blank-output``) and is never pasted.

Prompts are :class:`~counterfactual.image.DiffusersConfig`'s ``prompt`` and ``negative_prompt``
formatted with ``background`` (:data:`BACKGROUND`), ``kept`` and ``removed`` (class names joined
with ``", "``). The defaults, ``"{background}"`` and ``"{removed}"``, ask for an empty background
and steer away from the removed classes: for ``removed=("dog", "frisbee")`` the prompt is
``"empty background, nothing there"`` and the negative prompt ``"dog, frisbee"``.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from counterfactual._lazy import require
from counterfactual.image.base import (
    Edited,
    EditRequest,
    Eraser,
    at_least,
    output_failure,
    recorded,
)
from counterfactual.image.checks import check_request, paste
from counterfactual.method.masks import mask_bounds
from counterfactual.models.runtime import ModelRuntime
from counterfactual.models.trust import check_diffusers, read_json, weight_errors, weights_failure
from counterfactual.options import declare

BACKGROUND = "empty background, nothing there"
"""What ``{background}`` in the prompt templates expands to."""

_MULTIPLE = 8

ROREM_PROMPT = (
    "4K, high quality, masterpiece, Highly detailed, Sharp focus, Professional, "
    "photorealistic, realistic"
)
ROREM_NEGATIVE = (
    "low quality, worst, bad proportions, blurry, extra finger, Deformed, disfigured, "
    "unclear background"
)
RECIPES: dict[str, dict[str, Any]] = {
    "rorem": {
        "model": "LetsThink/RORem",
        "steps": 50,
        "guidance_scale": 1.0,
        "strength": 0.99,
        "prompt": ROREM_PROMPT,
        "negative_prompt": ROREM_NEGATIVE,
        "resolution": 512,
        "grow": 20,
    },
    "sdxl": {
        "model": "diffusers/stable-diffusion-xl-1.0-inpainting-0.1",
        "steps": 20,
        "guidance_scale": 8.0,
        "strength": 0.99,
        "resolution": 1024,
    },
}
"""Published models with their authors' settings (``--inpaint-recipe``); options given
explicitly win. ``rorem``: the RORem README's inference (fp16 variant, 512 px, 50 steps (15-30
also work), strength 0.99 ("below 1.0"), guidance 1.0, i.e. no classifier-free guidance, so the
negative prompt is not used; its masks are dilated with a 20x20 kernel at 512 px, ``grow``,
at the working size, not at the picture's). ``sdxl``:
the SDXL inpainting 0.1 model card (1024 px, 20 steps, guidance 8.0, strength 0.99)."""


def model_field(default: str) -> Any:
    """The learned inpainter's weights, ``--inpaint-model`` (one flat key, ``model``, shared by
    diffusers and LaMa): a field of their configs with ``default``."""
    return declare(
        default,
        help="diffusers: a hub id or folder; lama: a TorchScript .pt file (e.g. big-lama.pt)",
        flags=("--inpaint-model",),
    )


def feather_field() -> Any:
    """The feathered paste, ``--feather``, an option of every learned inpainter (one flat key,
    shared): a field of their configs, 0 by default."""
    return declare(
        0,
        help="diffusers, lama: fade the fill into the picture over N px outside the mask, >= 0 "
        "(0: a hard paste, only masked pixels change)",
        flags=("--feather",),
        kind="nonnegative_int",
        metadata=recorded(sparse=True),
    )


@dataclass(frozen=True, slots=True)
class DiffusersConfig:
    """A diffusers inpainting pipeline and how it is run."""

    model: str = model_field("sd2-community/stable-diffusion-2-inpainting")
    """A hub id or a folder written by ``save_pretrained``."""
    steps: int = declare(
        30, help="diffusers: denoising steps, >= 1", flags=("--steps",), kind="positive_int"
    )
    guidance_scale: float = declare(
        7.5,
        help="diffusers: classifier-free guidance scale, >= 0 (<= 1: none)",
        flags=("--guidance-scale",),
        kind="nonnegative_float",
    )
    strength: float = declare(
        1.0,
        help="diffusers: how far the masked area is noised, in (0, 1]",
        flags=("--strength",),
        kind="positive_fraction",
    )
    prompt: str = declare(
        "{background}",
        help="diffusers: the prompt template; {background} is 'empty background, nothing "
        "there', {kept} and {removed} the class names",
        flags=("--prompt",),
    )
    negative_prompt: str = declare(
        "{removed}",
        help="diffusers: the negative prompt template, same fields as --prompt",
        flags=("--negative-prompt",),
    )
    resolution: int = declare(
        512,
        help="diffusers: working size in px, >= 0 (0: native, the crop's size, at least 512)",
        flags=("--resolution",),
        kind="nonnegative_int",
    )
    """Working size of a crop's long side, px, a multiple of 8 (0 = native, at least 512)."""
    candidates: int = declare(
        1,
        help="diffusers: best-of-n, draw N seeded candidates per image and keep the one the "
        "verifier's model (--verify-model) sees the removed classes least in (1: no "
        "best-of-n)",
        flags=("--candidates",),
        kind="positive_int",
    )
    """Best-of-n: candidates drawn per image; a zero-shot model keeps the one that shows the
    removed classes least (:mod:`counterfactual.image.best_of_n`)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""
    recipe: str = declare(
        "",
        help="diffusers: a published model with its authors' settings, which the options given "
        "override: " + ", ".join(RECIPES),
        flags=("--inpaint-recipe",),
        choices=tuple(RECIPES),
        metadata=recorded(sparse=True),
    )
    """The :data:`RECIPES` entry whose settings the other fields took (``""``: none)."""
    feather: int = feather_field()
    """Soft paste: the fill fades into the picture over this many px outside the mask (0: a
    hard paste, only masked pixels change)."""
    compile: bool = declare(
        False,
        help="diffusers: torch.compile the denoiser (slow first batch)",
        flags=("--compile",),
        kind="flag",
        metadata=recorded(runtime=True),
    )
    """``torch.compile`` the denoiser (a slow first batch, faster after; one working size per
    run keeps it from recompiling)."""
    grow: int = declare(
        0,
        help="diffusers: dilate the working mask by an N x N square kernel at the working size, "
        "repaint that and record it as the sample's mask (RORem's recipe: 20 at 512 px; 0: "
        "the mask as it is)",
        flags=("--inpaint-grow",),
        kind="nonnegative_int",
        metadata=recorded(sparse=True),
    )
    """The working mask dilated by a ``grow`` x ``grow`` square kernel at the working size (RORem's
    README: 20 at 512 px, ``cv2.dilate(mask, np.ones((20, 20)))``); the grown region is what
    is repainted and pasted back. 0: the mask as it is."""
    channels_last: bool = declare(
        False,
        help="diffusers: denoiser and VAE in channels-last memory format",
        flags=("--channels-last",),
        kind="flag",
        metadata=recorded(runtime=True),
    )
    """Denoiser and VAE in channels-last memory format (often faster convolutions on GPUs)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.resolution < 0 or self.resolution % 8:
            raise ValueError(
                f"resolution must be 0 (native) or a positive multiple of 8, got {self.resolution}"
            )
        if not 0 < self.strength <= 1:
            raise ValueError(f"strength must be in (0, 1], got {self.strength}")
        if self.recipe and self.recipe not in RECIPES:
            raise ValueError(f"recipe {self.recipe!r} is not one of {', '.join(RECIPES)}")
        at_least("guidance_scale", self.guidance_scale, 0)
        at_least("candidates", self.candidates, 1)
        at_least("crop_padding", self.crop_padding, 0)
        at_least("feather", self.feather, 0)
        at_least("grow", self.grow, 0)

    @classmethod
    def from_recipe(cls, recipe: str, **options: Any) -> DiffusersConfig:
        """``recipe``'s settings (:data:`RECIPES`) under ``options``; ``""``: the defaults."""
        if recipe and recipe not in RECIPES:
            raise ValueError(f"recipe {recipe!r} is not one of {', '.join(RECIPES)}")
        return cls(**{**RECIPES.get(recipe, {}), **options, "recipe": recipe})


def _grow(lo: int, hi: int, size: int, limit: int) -> tuple[int, int]:
    """Grow ``[lo, hi)`` to ``min(size, limit)`` about its centre, shifted into ``[0, limit)``."""
    size = min(max(size, hi - lo), limit)
    lo -= (size - (hi - lo)) // 2
    lo = min(max(lo, 0), limit - size)
    return lo, lo + size


def crop_box(
    box: tuple[int, int, int, int], padding: float, height: int, width: int
) -> tuple[int, int, int, int]:
    """The crop ``(x0, y0, x1, y1)`` (exclusive ends) to inpaint for a mask box.

    ``box`` grows by ``padding`` times its width and height on each side, then the shorter side
    grows to the longer one; the result is shifted to lie inside the ``height`` x ``width`` image
    and clipped where the image is smaller than the crop. Always contains ``box``.
    """
    x0, y0, x1, y1 = box
    if not (0 <= x0 < x1 <= width and 0 <= y0 < y1 <= height):
        raise ValueError(f"box {box} is empty or outside a {width}x{height} image")
    side = max(
        (x1 - x0) + 2 * math.ceil(padding * (x1 - x0)),
        (y1 - y0) + 2 * math.ceil(padding * (y1 - y0)),
    )
    cx0, cx1 = _grow(x0, x1, side, width)
    cy0, cy1 = _grow(y0, y1, side, height)
    return cx0, cy0, cx1, cy1


NATIVE_MIN = 512
"""With ``resolution=0`` (native), crops whose long side is below this are still scaled up to
it: the models give noise at the size of a typical object."""


def work_size(crop_width: int, crop_height: int, resolution: int) -> tuple[int, int]:
    """``(width, height)`` at which a crop is inpainted: long side ``resolution``, aspect ratio
    kept, both sides rounded to a multiple of 8 (at least 8). ``resolution=0`` is native: the
    crop's own size, never scaled down, scaled up to :data:`NATIVE_MIN` when smaller."""
    long_side = max(crop_width, crop_height)
    target = max(long_side, NATIVE_MIN) if resolution == 0 else resolution
    scale = target / long_side

    def snap(side: int) -> int:
        return max(_MULTIPLE, round(side * scale / _MULTIPLE) * _MULTIPLE)

    return snap(crop_width), snap(crop_height)


NATIVE_CANVASES = (512, 768, 1024, 1536, 2048)
"""The canvas sides of ``resolution=0``: a crop's scaled size goes onto the smallest that holds
it (beyond the last, the next multiple of 512), so native crops of a batch share few sizes."""


def canvas_side(size: tuple[int, int], resolution: int) -> int:
    """The side of the square canvas a crop of working ``size`` (:func:`work_size`) is run on:
    ``resolution``, or with ``0`` (native) the smallest of :data:`NATIVE_CANVASES` that holds
    it."""
    if resolution:
        return resolution
    long_side = max(size)
    for side in NATIVE_CANVASES:
        if long_side <= side:
            return side
    return -(-long_side // 512) * 512


@dataclass(frozen=True, slots=True)
class _Job:
    """One non-empty request, cropped, scaled (to ``size``) and mirrored onto its square
    canvas (``side``) for the pipeline."""

    index: int
    crop: tuple[int, int, int, int]
    size: tuple[int, int]
    side: int
    image: Image.Image
    mask: Image.Image
    paste_mask: np.ndarray | None = None
    """The crop's mask at source scale grown as the working mask was (``grow``), else
    ``None``: the request's mask."""


class DiffusionInpainter:
    """Inpaint masked regions with a diffusers inpainting pipeline loaded once.

    ``config.model`` is a Hugging Face hub id or a local folder written by ``save_pretrained``,
    loaded by :func:`load_pipeline` in ``dtype`` on ``device``. Requests are processed in chunks
    of ``batch_size`` that share a canvas (one canvas per run unless ``resolution=0``), one
    pipeline call per chunk; each request draws its noise from its own generator seeded with
    ``request.seed``, so its output does not depend on what else is in the batch (up to
    floating-point noise).
    """

    def __init__(
        self,
        config: DiffusersConfig,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 1,
    ) -> None:
        runtime = ModelRuntime.of(device, dtype, batch_size)
        if config.steps * config.strength < 1:
            raise ValueError(
                f"steps * strength must be >= 1 to run any denoising step, "
                f"got {config.steps} * {config.strength}"
            )
        for name in ("prompt", "negative_prompt"):
            template: str = getattr(config, name)
            try:
                template.format(background="", kept="", removed="")
            except (KeyError, IndexError, ValueError) as err:
                raise ValueError(
                    f"{name} {template!r} may only use {{background}}, {{kept}} and {{removed}}"
                ) from err

        self.config = config
        self._torch = require("torch", "models")
        self.device = runtime.torch_device()
        self.dtype = str(runtime.torch_dtype(self.device)).removeprefix("torch.")
        self.batch_size = runtime.batch_size
        self._pipeline, self.variant = load_pipeline(config.model, self.dtype)
        self._pipeline = self._pipeline.to(self.device)
        self._pipeline.set_progress_bar_config(disable=True)
        denoiser = _denoiser(self._pipeline)
        if config.channels_last:
            for module in (denoiser, getattr(self._pipeline, "vae", None)):
                if module is not None:
                    module.to(memory_format=self._torch.channels_last)
        if config.compile:
            if denoiser is None:
                raise ValueError(f"{config.model!r}: no unet or transformer to torch.compile")
            name = "unet" if getattr(self._pipeline, "unet", None) is denoiser else "transformer"
            setattr(self._pipeline, name, self._torch.compile(denoiser))

    def describe(self) -> dict[str, Any]:
        c = self.config
        out = {
            "method": "inpaint",
            "backend": "diffusers",
            "model": c.model,
            "pipeline": type(self._pipeline).__name__,
            "steps": c.steps,
            "guidance_scale": c.guidance_scale,
            "strength": c.strength,
            "resolution": c.resolution,
            "crop_padding": c.crop_padding,
            "dtype": self.dtype,
            "prompt": c.prompt,
            "negative_prompt": c.negative_prompt,
            "background": BACKGROUND,
        }
        extra = {
            "recipe": c.recipe,
            "feather": c.feather,
            "variant": self.variant,
            "compile": c.compile,
            "channels_last": c.channels_last,
        }
        out.update({k: v for k, v in extra.items() if v})  # as before when unused
        return out

    def __call__(self, batch: Sequence[EditRequest]) -> list[Edited]:
        """Edited ``(H, W, 3)`` uint8 images, one per request, in order; a request whose output
        is non-finite or blank gets that ``SampleError`` instead, nothing pasted.

        A request whose mask is all zero comes back as a copy of its image. Raises
        ``ValueError`` if an image is not ``(H, W, 3)`` uint8 or a mask not ``(H, W)`` uint8.
        """
        for index, request in enumerate(batch):
            try:
                check_request(request)
            except ValueError as err:
                raise ValueError(f"request {index}: {err}") from err
        results: list[Edited | None] = [None] * len(batch)
        groups: dict[int, list[_Job]] = {}
        for index, request in enumerate(batch):
            job = self._prepare(index, request)
            if job is None:
                results[index] = request.image.copy()
            else:
                groups.setdefault(job.side, []).append(job)
        step = self.batch_size
        for jobs in groups.values():
            for start in range(0, len(jobs), step):
                chunk = jobs[start : start + step]
                for job, output in zip(chunk, self._run(chunk, batch), strict=True):
                    width, height = job.size
                    output = output[:height, :width]  # the mirrored margin cut off
                    failure = output_failure(output, f"{type(self._pipeline).__name__} output")
                    results[job.index] = failure or self._paste(batch[job.index], job, output)
        return [r for r in results if r is not None]

    def _prepare(self, index: int, request: EditRequest) -> _Job | None:
        crop = region(self.config, request.mask)
        if crop is None:
            return None
        x0, y0, x1, y1 = crop
        size = work_size(x1 - x0, y1 - y0, self.config.resolution)
        side = canvas_side(size, self.config.resolution)
        image = np.asarray(
            Image.fromarray(request.image[y0:y1, x0:x1]).resize(size, Image.Resampling.LANCZOS)
        )
        # Bilinear resampling then "> 0": any pixel touched by the mask is repainted, so the
        # working mask covers every masked pixel after scaling back.
        mask, paste_mask = working_masks(request.mask[y0:y1, x0:x1], size, self.config.grow)
        # onto the square canvas: the picture mirrored at the bottom and right, kept (mask 0)
        rows, cols = side - size[1], side - size[0]
        image = np.pad(image, ((0, rows), (0, cols), (0, 0)), mode="symmetric")
        mask = np.pad(mask, ((0, rows), (0, cols)))
        return _Job(
            index=index,
            crop=(x0, y0, x1, y1),
            size=size,
            side=side,
            image=Image.fromarray(image),
            mask=Image.fromarray(mask),
            paste_mask=paste_mask,
        )

    def _prompts(self, request: EditRequest) -> tuple[str, str]:
        fields = {
            "background": BACKGROUND,
            "kept": ", ".join(request.kept),
            "removed": ", ".join(request.removed),
        }
        return self.config.prompt.format(**fields), self.config.negative_prompt.format(**fields)

    def _run(self, chunk: Sequence[_Job], batch: Sequence[EditRequest]) -> np.ndarray:
        """Pipeline output for jobs of one canvas: float array (N, side, side, 3), in [0, 1]
        unless the model failed (NaN, inf)."""
        c = self.config
        prompts, negatives = zip(*(self._prompts(batch[job.index]) for job in chunk), strict=True)
        generators = [
            self._torch.Generator(device=self.device).manual_seed(batch[job.index].seed)
            for job in chunk
        ]
        side = chunk[0].side
        with warnings.catch_warnings():
            # a NaN output warns in the cast to uint8 inside diffusers; it is checked here
            warnings.filterwarnings("ignore", "invalid value encountered", RuntimeWarning)
            result = self._pipeline(
                prompt=list(prompts),
                negative_prompt=list(negatives),
                image=[job.image for job in chunk],
                mask_image=[job.mask for job in chunk],
                height=side,
                width=side,
                num_inference_steps=c.steps,
                guidance_scale=c.guidance_scale,
                strength=c.strength,
                generator=generators,
                output_type="np",
            )
        return np.asarray(result.images)

    def _paste(self, request: EditRequest, job: _Job, output: np.ndarray) -> np.ndarray:
        x0, y0, x1, y1 = job.crop
        pixels = (np.clip(output, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        patch = np.asarray(
            Image.fromarray(pixels).resize((x1 - x0, y1 - y0), Image.Resampling.LANCZOS)
        )
        edited = request.image.copy()
        paste(
            edited[y0:y1, x0:x1],
            np.ascontiguousarray(patch),
            np.ascontiguousarray(
                request.mask[y0:y1, x0:x1] if job.paste_mask is None else job.paste_mask
            ),
            self.config.feather,
        )
        return edited


def working_masks(
    crop_mask: np.ndarray, size: tuple[int, int], grow: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(working mask, paste mask)`` of a crop's mask (``uint8``, 255 = repaint) scaled to
    ``size`` (width, height): the working mask is every pixel the scaled mask touches, grown by
    ``grow`` (:func:`grow_mask`); the paste mask is ``None`` without ``grow``, else the grown
    working mask scaled back to the crop, with the crop's own mask: the pixels repainted."""
    # Bilinear resampling then "> 0": any pixel touched by the mask is repainted, so the
    # working mask covers every masked pixel after scaling back.
    mask = Image.fromarray(crop_mask).resize(size, Image.Resampling.BILINEAR)
    mask = np.where(np.asarray(mask) > 0, 255, 0).astype(np.uint8)
    if not grow:
        return mask, None
    mask = grow_mask(mask, grow)
    height, width = crop_mask.shape[:2]
    back = Image.fromarray(mask).resize((width, height), Image.Resampling.BILINEAR)
    return mask, np.where(np.asarray(back) > 0, 255, crop_mask).astype(np.uint8)


def grown_region(config: DiffusersConfig, mask: np.ndarray) -> np.ndarray:
    """The picture's mask (``uint8``, 255 = repaint) as :class:`DiffusionInpainter` repaints it:
    with ``grow``, the crop's grown paste mask in place (a new array); without, ``mask``
    itself. What a sample records as its mask."""
    crop = region(config, mask) if config.grow else None
    if crop is None:
        return mask
    x0, y0, x1, y1 = crop
    size = work_size(x1 - x0, y1 - y0, config.resolution)
    _, paste_mask = working_masks(mask[y0:y1, x0:x1], size, config.grow)
    out = mask.copy()
    out[y0:y1, x0:x1] = paste_mask
    return out


def grow_mask(mask: np.ndarray, side: int) -> np.ndarray:
    """``mask`` (``uint8``, 255 = repaint) dilated by a ``side`` x ``side`` square kernel, as
    RORem's README grows its 512 px masks (``side`` 20)."""
    import cv2

    return cv2.dilate(mask, np.ones((side, side), np.uint8), iterations=1)


def region(config: DiffusersConfig, mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """The crop the inpainter edits for ``mask`` (:func:`crop_box` of its bounds, the padding
    at least ``feather``), ``None`` for an empty mask."""
    box = mask_bounds(mask)
    if box is None:
        return None
    height, width = mask.shape
    long_side = max(box[2] - box[0], box[3] - box[1])
    padding = max(config.crop_padding, config.feather / long_side)
    return crop_box(box, padding, height, width)


def _denoiser(pipeline: Any) -> Any:
    """The pipeline's denoising network: its ``unet``, else its ``transformer``."""
    return getattr(pipeline, "unet", None) or getattr(pipeline, "transformer", None)


def load_pipeline(model: str, dtype: str = "float32") -> tuple[Any, str]:
    """The inpainting pipeline of ``model`` (a hub id or a ``save_pretrained`` folder) in
    ``dtype``, and the weight variant read (``"fp16"`` or ``""``).

    ``AutoPipelineForInpainting`` loads it (an SD 1.5/2, SDXL or other checkpoint it maps to
    its inpainting pipeline); a class it does not map is loaded as the class
    ``model_index.json`` names, which must take a ``mask_image``. In float16 and bfloat16 the
    ``fp16`` weight files are read where the model has them (:func:`_variants`: the rule pull
    follows, at the cache's pinned commit). Any failure is a ``ValueError`` naming the
    model."""
    torch = require("torch", "models")
    diffusers = require("diffusers", "models")
    try:
        index_path = _index_file(diffusers, model)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"cannot load inpainting model {model!r} (a hub id or a folder with "
            f"model_index.json): {err}"
        ) from err
    index = read_json(index_path)
    check_diffusers(model, index, index_path)
    kwargs: dict[str, Any] = {"torch_dtype": getattr(torch, dtype), "trust_remote_code": False}
    if "safety_checker" in index:
        kwargs["safety_checker"] = None  # the run judges its outputs itself (blank-output)
    last: Exception | None = None
    for variant, revision in _variants(model, dtype):
        extra = {"variant": variant} if variant else {}
        if revision:
            extra["revision"] = revision
        for loader in (diffusers.AutoPipelineForInpainting, diffusers.DiffusionPipeline):
            try:
                with warnings.catch_warnings():
                    # diffusers >= 0.42 renames torch_dtype to dtype; older ones know torch_dtype
                    warnings.filterwarnings("ignore", ".*torch_dtype", FutureWarning)
                    pipeline = loader.from_pretrained(model, **kwargs, **extra)
            except (OSError, ValueError, KeyError, *weight_errors()) as err:
                refused = weights_failure(err, model)  # refused or broken weights: no retry
                if refused is not None:
                    raise ValueError(f"inpainting model {model!r}: {refused}") from err
                last = err
                continue
            if "mask_image" not in inspect.signature(pipeline.__call__).parameters:
                raise ValueError(
                    f"{model!r} loads as {type(pipeline).__name__}, which takes no mask_image: "
                    "not an inpainting pipeline"
                )
            return pipeline, variant
    raise ValueError(
        f"cannot load inpainting model {model!r} ({index.get('_class_name', '?')}): {last}"
    )


def _index_file(diffusers: Any, model: str) -> str:
    """The local path of ``model``'s ``model_index.json`` (a folder's, or a hub id's from the
    cache or the hub); ``OSError``/``ValueError`` when it has none."""
    if os.path.isdir(model):
        path = os.path.join(model, "model_index.json")
        if not os.path.isfile(path):
            raise ValueError(f"{path} does not exist")
        return path
    from huggingface_hub import hf_hub_download

    return str(hf_hub_download(model, diffusers.DiffusionPipeline.config_name))


def _variants(model: str, dtype: str) -> list[tuple[str, str | None]]:
    """The (variant, revision) to load ``model`` with: the rule :func:`pull` downloads by
    (:func:`~counterfactual.models.hub.weight_variant`), decided by the files of the folder or
    cached snapshot where it has them (the variant the manifest records), at the commit the
    cache pins (``models pull`` wrote it); a model not on this machine tries the variant, then
    the plain files, from the Hub."""
    from counterfactual.models.hub import ModelRef, chosen_variant, locate, weight_variant

    wanted = weight_variant(dtype)
    found = locate(ModelRef("inpainter", "--inpaint-model", "hub", model, wanted))
    if found.files:
        revision = found.revision if found.source == "cache" else None
        return [(chosen_variant(found.files, wanted) or "", revision)]
    return [(wanted, None), ("", None)] if wanted else [("", None)]


def _build(config: DiffusersConfig, *, device: str, dtype: str, batch_size: int, **_: Any) -> Any:
    return DiffusionInpainter(config, device=device, dtype=dtype, batch_size=batch_size)


ERASER = Eraser(
    name="diffusers",
    config=DiffusersConfig,
    build=_build,
    summary="diffusers (any diffusers inpainting pipeline: SD 1.5/2, SDXL, RORem)",
    model="model",
    seeded=True,
    region=region,
    candidates="candidates",
)
