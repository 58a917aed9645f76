"""Image synthesis: erase the removed objects from an image.

Every backend is a small callable behind :class:`ImageEditor`. Images are ``uint8`` RGB arrays
of shape ``(H, W, 3)``; masks are ``uint8`` arrays of shape ``(H, W)`` with 255 = repaint and
0 = keep. Pixels where the mask is 0 come back unchanged, whatever the backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

IMAGE_METHODS = ("inpaint", "zero", "mean", "blur")
FILL_METHODS = ("zero", "mean", "blur")
INPAINT_BACKENDS = ("opencv", "diffusers", "lama")
OPENCV_ALGORITHMS = ("telea", "ns")


@dataclass(frozen=True, slots=True)
class EditRequest:
    """One image to edit: ``image`` (H, W, 3) uint8 RGB, ``mask`` (H, W) uint8, 255 = repaint."""

    image: np.ndarray
    mask: np.ndarray
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    seed: int = 0


def _at_least(name: str, value: float, low: float) -> None:
    if not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


@dataclass(frozen=True, slots=True)
class FillConfig:
    """The fills' options (``zero``, ``mean``, ``blur``: :mod:`counterfactual.image.fills`)."""

    blur_sigma: float = 15.0
    """``blur``: the Gaussian's standard deviation, px, > 0."""

    def __post_init__(self) -> None:
        if not self.blur_sigma > 0:
            raise ValueError(f"blur_sigma must be > 0, got {self.blur_sigma}")


@dataclass(frozen=True, slots=True)
class OpenCVConfig:
    """OpenCV's inpainting on a padded crop (:mod:`counterfactual.image.opencv_inpaint`)."""

    algorithm: str = "telea"
    """``telea`` or ``ns`` (Navier-Stokes)."""
    radius: int = 3
    """Neighbourhood of each inpainted pixel, px."""
    max_side: int = 192
    """The padded crop around the mask is inpainted at most this many pixels on its long side
    and scaled back (0 = native resolution)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""

    def __post_init__(self) -> None:
        if self.algorithm not in OPENCV_ALGORITHMS:
            raise ValueError(f"opencv_algorithm {self.algorithm!r} is not 'telea' or 'ns'")
        if self.radius < 1 or self.max_side < 0:
            raise ValueError(
                f"opencv_radius must be >= 1 and opencv_max_side >= 0 (0 = native), got "
                f"{self.radius} and {self.max_side}"
            )
        _at_least("crop_padding", self.crop_padding, 0)


@dataclass(frozen=True, slots=True)
class LamaConfig:
    """A TorchScript LaMa (:mod:`counterfactual.image.lama`); it always runs in float32."""

    model: str = ""
    """The ``.pt`` file (e.g. ``big-lama.pt``); the lama backend needs one."""
    max_side: int = 0
    """A crop whose long side is larger is inpainted at this size and scaled back
    (0 = native resolution)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""

    def __post_init__(self) -> None:
        if self.max_side < 0:
            raise ValueError(f"lama_max_side must be >= 0 (0 = native), got {self.max_side}")
        _at_least("crop_padding", self.crop_padding, 0)


@dataclass(frozen=True, slots=True)
class DiffusersConfig:
    """A diffusers inpainting pipeline (:mod:`counterfactual.image.diffusion`)."""

    model: str = "sd2-community/stable-diffusion-2-inpainting"
    """A hub id or a folder written by ``save_pretrained``."""
    steps: int = 30
    guidance_scale: float = 7.5
    strength: float = 1.0
    prompt: str = "{background}"
    negative_prompt: str = "{removed}"
    resolution: int = 512
    """Working size of a crop's long side, px, a multiple of 8 (0 = native, at least 512)."""
    candidates: int = 1
    """Best-of-n: candidates drawn per image; a zero-shot model keeps the one that shows the
    removed classes least (:mod:`counterfactual.image.best_of_n`)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.resolution < 0 or self.resolution % 8:
            raise ValueError(
                f"resolution must be 0 (native) or a positive multiple of 8, got {self.resolution}"
            )
        if not 0 < self.strength <= 1:
            raise ValueError(f"strength must be in (0, 1], got {self.strength}")
        _at_least("guidance_scale", self.guidance_scale, 0)
        _at_least("candidates", self.candidates, 1)
        _at_least("crop_padding", self.crop_padding, 0)


FLAT_KEYS: dict[str, tuple[str, str]] = {
    "method": ("", "method"),
    "backend": ("", "backend"),
    "blur_sigma": ("fill", "blur_sigma"),
    "opencv_algorithm": ("opencv", "algorithm"),
    "opencv_radius": ("opencv", "radius"),
    "opencv_max_side": ("opencv", "max_side"),
    "lama_max_side": ("lama", "max_side"),
    "model": ("*", "model"),
    "steps": ("diffusers", "steps"),
    "guidance_scale": ("diffusers", "guidance_scale"),
    "strength": ("diffusers", "strength"),
    "prompt": ("diffusers", "prompt"),
    "negative_prompt": ("diffusers", "negative_prompt"),
    "resolution": ("diffusers", "resolution"),
    "candidates": ("diffusers", "candidates"),
    "crop_padding": ("*", "crop_padding"),
}
"""The image options as one flat mapping, in the order runs record them (``manifest.json``,
the dataset card, the fingerprint) and the command line names them: each key's sub-config of
:class:`ImageConfig` and field there (``""``: :class:`ImageConfig` itself; ``"*"``: the
inpaint backend's own, see :func:`flat_owner`)."""


def flat_owner(backend: str, key: str) -> str:
    """The sub-config that holds a ``"*"`` key of :data:`FLAT_KEYS` for ``backend``: the
    backend's own; OpenCV loads no model, so its ``model`` is the diffusers one (the one
    ``--inpaint-model`` always named)."""
    if key == "model" and backend == "opencv":
        return "diffusers"
    return backend


@dataclass(frozen=True, slots=True)
class ImageConfig:
    """How to erase: ``method`` is one of :data:`IMAGE_METHODS`; ``backend`` picks the
    inpainter when ``method == "inpaint"``. Each backend reads its own sub-config; how a model
    runs (device, dtype, batch size) is passed to :func:`make_editor` (in a synthesis run:
    :class:`counterfactual.synth.plan.Runtime`)."""

    method: str = "inpaint"
    backend: str = "opencv"
    fill: FillConfig = field(default_factory=FillConfig)
    opencv: OpenCVConfig = field(default_factory=OpenCVConfig)
    lama: LamaConfig = field(default_factory=LamaConfig)
    diffusers: DiffusersConfig = field(default_factory=DiffusersConfig)

    def __post_init__(self) -> None:
        if self.method not in IMAGE_METHODS:
            raise ValueError(f"image method {self.method!r} is not one of {IMAGE_METHODS}")
        if self.backend not in INPAINT_BACKENDS:
            raise ValueError(f"inpaint backend {self.backend!r} is not one of {INPAINT_BACKENDS}")
        parts = (
            ("fill", FillConfig),
            ("opencv", OpenCVConfig),
            ("lama", LamaConfig),
            ("diffusers", DiffusersConfig),
        )
        for name, kind in parts:
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"ImageConfig.{name} must be a {kind.__name__}")
        if self.diffusers.candidates > 1 and (
            self.method != "inpaint" or self.backend != "diffusers"
        ):
            raise ValueError(
                "candidates > 1 (best-of-n) needs --image-method inpaint --inpaint-backend "
                "diffusers: the other methods draw the same picture every time"
            )

    def flat(self) -> dict[str, Any]:
        """The options as one flat mapping (:data:`FLAT_KEYS`), as runs have always recorded
        them."""
        out: dict[str, Any] = {}
        for key, (part, name) in FLAT_KEYS.items():
            part = flat_owner(self.backend, key) if part == "*" else part
            out[key] = getattr(getattr(self, part) if part else self, name)
        return out

    @classmethod
    def from_flat(cls, options: Mapping[str, Any]) -> ImageConfig:
        """The config of a flat mapping (:meth:`flat`'s keys, the command line's names; a
        missing key takes its default): ``model`` and ``crop_padding`` go to the sub-config of
        the backend (:func:`flat_owner`)."""
        unknown = sorted(set(options) - set(FLAT_KEYS))
        if unknown:
            raise ValueError(f"unknown image option(s) {unknown}; known: {', '.join(FLAT_KEYS)}")
        top = {k: options[k] for k in ("method", "backend") if k in options}
        backend = top.get("backend", "opencv")
        if backend not in INPAINT_BACKENDS:
            raise ValueError(f"inpaint backend {backend!r} is not one of {INPAINT_BACKENDS}")
        parts: dict[str, dict[str, Any]] = {p: {} for p in ("fill", "opencv", "lama", "diffusers")}
        for key, value in options.items():
            part, name = FLAT_KEYS[key]
            if part:
                parts[flat_owner(backend, key) if part == "*" else part][name] = value
        return cls(
            **top,
            fill=FillConfig(**parts["fill"]),
            opencv=OpenCVConfig(**parts["opencv"]),
            lama=LamaConfig(**parts["lama"]),
            diffusers=DiffusersConfig(**parts["diffusers"]),
        )


class ImageEditor(Protocol):
    """An image backend: loads what it needs in ``__init__``, edits a batch per call."""

    def describe(self) -> dict[str, Any]:
        """What to record in each sample's metadata (method, model id, parameters)."""
        ...

    def __call__(self, batch: Sequence[EditRequest]) -> list[np.ndarray]:
        """Edited images, one per request, same shape and dtype as the inputs."""
        ...


def make_editor(
    config: ImageConfig, *, device: str = "cpu", dtype: str = "float32", batch_size: int = 1
) -> ImageEditor:
    """The editor for ``config``, each backend given its own sub-config; heavy backends are
    imported only when chosen. ``device``, ``dtype`` and ``batch_size`` (crops per model call)
    are how a learned inpainter runs; the fills and OpenCV ignore them."""
    if config.method in FILL_METHODS:
        from counterfactual.image.fills import FillEditor

        return FillEditor(config.method, config.fill)
    if config.backend == "opencv":
        from counterfactual.image.opencv_inpaint import OpenCVInpainter

        return OpenCVInpainter(config.opencv)
    if config.backend == "lama":
        from counterfactual.image.lama import LamaInpainter

        return LamaInpainter(config.lama, device=device, batch_size=batch_size)
    from counterfactual.image.diffusion import DiffusionInpainter

    return DiffusionInpainter(config.diffusers, device=device, dtype=dtype, batch_size=batch_size)
