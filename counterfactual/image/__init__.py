"""Image synthesis: erase the removed objects from an image.

Every backend is a small callable behind :class:`ImageEditor`. Images are ``uint8`` RGB arrays
of shape ``(H, W, 3)``; masks are ``uint8`` arrays of shape ``(H, W)`` with 255 = repaint and
0 = keep. Pixels where the mask is 0 come back unchanged, whatever the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

IMAGE_METHODS = ("inpaint", "zero", "mean", "blur")
INPAINT_BACKENDS = ("opencv", "diffusers", "lama")


@dataclass(frozen=True, slots=True)
class EditRequest:
    """One image to edit: ``image`` (H, W, 3) uint8 RGB, ``mask`` (H, W) uint8, 255 = repaint."""

    image: np.ndarray
    mask: np.ndarray
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    seed: int = 0


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """How to erase. ``method`` is one of :data:`IMAGE_METHODS`; ``backend`` picks the
    inpainter when ``method == "inpaint"``. ``device``, ``dtype`` and ``batch_size`` are how the
    backend runs: in a synthesis run they come from :class:`counterfactual.synth.Runtime`."""

    method: str = "inpaint"
    backend: str = "opencv"
    # blur fill
    blur_sigma: float = 15.0
    # OpenCV inpainting
    opencv_algorithm: str = "telea"
    opencv_radius: int = 3
    opencv_max_side: int = 192
    """The padded crop around the mask is inpainted at most this many pixels on its long side
    and scaled back (0 = native resolution)."""
    # LaMa inpainting (TorchScript; ``model`` is the .pt file, ``device`` and ``batch_size`` apply)
    lama_max_side: int = 0
    """A LaMa crop whose long side is larger is inpainted at this size and scaled back
    (0 = native resolution)."""
    # diffusers inpainting
    model: str = "stabilityai/stable-diffusion-2-inpainting"
    device: str = "cpu"
    dtype: str = "float32"
    batch_size: int = 1
    steps: int = 30
    guidance_scale: float = 7.5
    strength: float = 1.0
    prompt: str = "{background}"
    negative_prompt: str = "{removed}"
    resolution: int = 512
    candidates: int = 1
    """diffusers: best-of-n, candidates drawn per image; a zero-shot model keeps the one that
    shows the removed classes least (:mod:`counterfactual.image.best_of_n`)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""

    def __post_init__(self) -> None:
        if self.method not in IMAGE_METHODS:
            raise ValueError(f"image method {self.method!r} is not one of {IMAGE_METHODS}")
        if self.backend not in INPAINT_BACKENDS:
            raise ValueError(f"inpaint backend {self.backend!r} is not one of {INPAINT_BACKENDS}")
        if self.opencv_algorithm not in ("telea", "ns"):
            raise ValueError(f"opencv_algorithm {self.opencv_algorithm!r} is not 'telea' or 'ns'")
        if self.blur_sigma <= 0:
            raise ValueError(f"blur_sigma must be > 0, got {self.blur_sigma}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {self.candidates}")
        if self.candidates > 1 and (self.method != "inpaint" or self.backend != "diffusers"):
            raise ValueError(
                "candidates > 1 (best-of-n) needs --image-method inpaint --inpaint-backend "
                "diffusers: the other methods draw the same picture every time"
            )
        if self.crop_padding < 0:
            raise ValueError(f"crop_padding must be >= 0, got {self.crop_padding}")
        if self.lama_max_side < 0:
            raise ValueError(f"lama_max_side must be >= 0 (0 = native), got {self.lama_max_side}")
        if self.dtype not in ("float32", "float16", "bfloat16"):
            raise ValueError(f"dtype {self.dtype!r} is not float32, float16 or bfloat16")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.resolution < 0 or self.resolution % 8:
            raise ValueError(
                f"resolution must be 0 (native) or a positive multiple of 8, got {self.resolution}"
            )
        if not 0 < self.strength <= 1:
            raise ValueError(f"strength must be in (0, 1], got {self.strength}")
        if not self.guidance_scale >= 0:
            raise ValueError(f"guidance_scale must be >= 0, got {self.guidance_scale}")
        if self.opencv_radius < 1 or self.opencv_max_side < 0:
            raise ValueError(
                f"opencv_radius must be >= 1 and opencv_max_side >= 0 (0 = native), got "
                f"{self.opencv_radius} and {self.opencv_max_side}"
            )


class ImageEditor(Protocol):
    """An image backend: loads what it needs in ``__init__``, edits a batch per call."""

    def describe(self) -> dict[str, Any]:
        """What to record in each sample's metadata (method, model id, parameters)."""
        ...

    def __call__(self, batch: Sequence[EditRequest]) -> list[np.ndarray]:
        """Edited images, one per request, same shape and dtype as the inputs."""
        ...


def make_editor(config: ImageConfig) -> ImageEditor:
    """The editor for ``config``; heavy backends are imported only when chosen."""
    if config.method in ("zero", "mean", "blur"):
        from counterfactual.image.fills import FillEditor

        return FillEditor(config)
    if config.backend == "opencv":
        from counterfactual.image.opencv_inpaint import OpenCVInpainter

        return OpenCVInpainter(config)
    if config.backend == "lama":
        from counterfactual.image.lama import LamaInpainter

        return LamaInpainter(config)
    from counterfactual.image.diffusion import DiffusionInpainter

    return DiffusionInpainter(config)
