"""Erase objects with a diffusers inpainting pipeline (Stable Diffusion inpainting and kin).

Each request is edited in a square crop around its mask rather than on the whole image: the crop
is the mask's bounding box grown by ``crop_padding`` times its size on each side, made square
where the image allows (context helps the model), and scaled so that its long side is
``resolution`` pixels (a multiple of 8; ``0``: native, the crop's own size, scaled up only when
its long side is under 512). Small crops are scaled *up*: Stable Diffusion models are
trained at 512 px (or 768, 1024) and produce noise at the 50-200 px that a typical COCO object
occupies, so running them at native crop size gives poor fills. The model's output is scaled back
to the crop and pasted into the original only where the mask is > 0; every other pixel is the
input's, byte for byte (the pipeline re-encodes the whole crop through its VAE, which would
otherwise shift colours everywhere).

Prompts are :class:`~counterfactual.image.DiffusersConfig`'s ``prompt`` and ``negative_prompt``
formatted with ``background`` (:data:`BACKGROUND`), ``kept`` and ``removed`` (class names joined
with ``", "``). The defaults, ``"{background}"`` and ``"{removed}"``, ask for an empty background
and steer away from the removed classes: for ``removed=("dog", "frisbee")`` the prompt is
``"empty background, nothing there"`` and the negative prompt ``"dog, frisbee"``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from counterfactual._lazy import require
from counterfactual.image import DiffusersConfig, EditRequest
from counterfactual.image.checks import check_request
from counterfactual.method.masks import mask_bounds

BACKGROUND = "empty background, nothing there"
"""What ``{background}`` in the prompt templates expands to."""

_MULTIPLE = 8
_DTYPES = ("float32", "float16", "bfloat16")


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


@dataclass(frozen=True, slots=True)
class _Job:
    """One non-empty request, cropped and scaled for the pipeline."""

    index: int
    crop: tuple[int, int, int, int]
    size: tuple[int, int]
    image: Image.Image
    mask: Image.Image


class DiffusionInpainter:
    """Inpaint masked regions with a diffusers inpainting pipeline loaded once.

    ``config.model`` is a Hugging Face hub id or a local folder written by ``save_pretrained``;
    it is loaded with ``AutoPipelineForInpainting`` in ``dtype`` on ``device``. Requests are
    processed in chunks of ``batch_size`` that share a working size; each request draws its
    noise from its own generator seeded with ``request.seed``, so its output does not depend on
    what else is in the batch (up to floating-point noise).
    """

    def __init__(
        self,
        config: DiffusersConfig,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 1,
    ) -> None:
        if dtype not in _DTYPES:
            raise ValueError(f"dtype {dtype!r} is not float32, float16 or bfloat16")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if config.steps < 1:
            raise ValueError(f"steps must be >= 1, got {config.steps}")
        if not 0 < config.strength <= 1:
            raise ValueError(f"strength must be in (0, 1], got {config.strength}")
        if config.steps * config.strength < 1:
            raise ValueError(
                f"steps * strength must be >= 1 to run any denoising step, "
                f"got {config.steps} * {config.strength}"
            )
        if config.resolution != 0 and (
            config.resolution < _MULTIPLE or config.resolution % _MULTIPLE
        ):
            raise ValueError(
                f"resolution must be 0 (native) or a positive multiple of {_MULTIPLE}, "
                f"got {config.resolution}"
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
        self.device, self.dtype, self.batch_size = device, dtype, batch_size
        self._torch = require("torch", "models")
        diffusers = require("diffusers", "models")
        torch_dtype = getattr(self._torch, dtype)
        try:
            with warnings.catch_warnings():
                # diffusers >= 0.42 renames torch_dtype to dtype; older ones only know torch_dtype.
                warnings.filterwarnings("ignore", ".*torch_dtype", FutureWarning)
                pipeline = diffusers.AutoPipelineForInpainting.from_pretrained(
                    config.model, torch_dtype=torch_dtype, safety_checker=None
                )
        except (OSError, ValueError) as err:
            raise ValueError(
                f"cannot load inpainting model {config.model!r} (a hub id or a folder with "
                f"model_index.json): {err}"
            ) from err
        self._pipeline = pipeline.to(device)
        self._pipeline.set_progress_bar_config(disable=True)

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
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

    def __call__(self, batch: Sequence[EditRequest]) -> list[np.ndarray]:
        """Edited ``(H, W, 3)`` uint8 images, one per request, in order.

        A request whose mask is all zero comes back as a copy of its image. Raises
        ``ValueError`` if an image is not ``(H, W, 3)`` uint8 or a mask not ``(H, W)`` uint8.
        """
        for index, request in enumerate(batch):
            try:
                check_request(request)
            except ValueError as err:
                raise ValueError(f"request {index}: {err}") from err
        results: list[np.ndarray | None] = [None] * len(batch)
        groups: dict[tuple[int, int], list[_Job]] = {}
        for index, request in enumerate(batch):
            job = self._prepare(index, request)
            if job is None:
                results[index] = request.image.copy()
            else:
                groups.setdefault(job.size, []).append(job)
        step = self.batch_size
        for jobs in groups.values():
            for start in range(0, len(jobs), step):
                chunk = jobs[start : start + step]
                for job, output in zip(chunk, self._run(chunk, batch), strict=True):
                    results[job.index] = self._paste(batch[job.index], job, output)
        return [r for r in results if r is not None]

    def _prepare(self, index: int, request: EditRequest) -> _Job | None:
        box = mask_bounds(request.mask)
        if box is None:
            return None
        height, width = request.mask.shape
        x0, y0, x1, y1 = crop_box(box, self.config.crop_padding, height, width)
        size = work_size(x1 - x0, y1 - y0, self.config.resolution)
        image = Image.fromarray(request.image[y0:y1, x0:x1]).resize(size, Image.Resampling.LANCZOS)
        # Bilinear resampling then "> 0": any pixel touched by the mask is repainted, so the
        # working mask covers every masked pixel after scaling back.
        mask = Image.fromarray(request.mask[y0:y1, x0:x1]).resize(size, Image.Resampling.BILINEAR)
        mask = mask.point(lambda v: 255 if v > 0 else 0)
        return _Job(index=index, crop=(x0, y0, x1, y1), size=size, image=image, mask=mask)

    def _prompts(self, request: EditRequest) -> tuple[str, str]:
        fields = {
            "background": BACKGROUND,
            "kept": ", ".join(request.kept),
            "removed": ", ".join(request.removed),
        }
        return self.config.prompt.format(**fields), self.config.negative_prompt.format(**fields)

    def _run(self, chunk: Sequence[_Job], batch: Sequence[EditRequest]) -> np.ndarray:
        """Pipeline output for jobs of one working size: float array (N, h, w, 3) in [0, 1]."""
        c = self.config
        prompts, negatives = zip(*(self._prompts(batch[job.index]) for job in chunk), strict=True)
        generators = [
            self._torch.Generator(device=self.device).manual_seed(batch[job.index].seed)
            for job in chunk
        ]
        width, height = chunk[0].size
        result = self._pipeline(
            prompt=list(prompts),
            negative_prompt=list(negatives),
            image=[job.image for job in chunk],
            mask_image=[job.mask for job in chunk],
            height=height,
            width=width,
            num_inference_steps=c.steps,
            guidance_scale=c.guidance_scale,
            strength=c.strength,
            generator=generators,
            output_type="np",
        )
        return np.asarray(result.images)

    @staticmethod
    def _paste(request: EditRequest, job: _Job, output: np.ndarray) -> np.ndarray:
        x0, y0, x1, y1 = job.crop
        pixels = (np.clip(output, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        patch = np.asarray(
            Image.fromarray(pixels).resize((x1 - x0, y1 - y0), Image.Resampling.LANCZOS)
        )
        edited = request.image.copy()
        region = edited[y0:y1, x0:x1]
        inside = request.mask[y0:y1, x0:x1] > 0
        region[inside] = patch[inside]
        return edited
