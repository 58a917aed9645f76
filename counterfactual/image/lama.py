"""Erase objects with a LaMa-style removal inpainter exported to TorchScript.

The model is a local TorchScript file such as ``big-lama.pt`` (lama-cleaner / IOPaint) called as
``model(image, mask)``: ``image`` float32 ``(N, 3, H, W)`` RGB in [0, 1], ``mask`` float32
``(N, 1, H, W)`` with 1 = hole and 0 = keep, H and W multiples of 8; it returns ``(N, 3, H, W)``
RGB in [0, 1]. This is IOPaint's convention: the input is padded at the bottom and right to a
multiple of 8 by mirroring (``numpy.pad(mode="symmetric")``) and the output cropped back.

Each request is inpainted at native resolution in a crop around its mask: the square crop of
:func:`~counterfactual.image.diffusion.crop_box` with ``crop_padding``, grown to at least
:data:`MIN_CROP` pixels (LaMa's training crop size) where the image allows, since LaMa fills
from context and a tight crop starves it. With ``max_side > 0`` (:class:`LamaConfig`) a crop
whose long side is larger is scaled down to it for the model and the fill scaled back. Only
pixels where the mask is > 0 are pasted into the original; every other pixel is the input's,
byte for byte. There is no randomness: the same request gives the same output
(``EditRequest.seed`` is not used).

The model always runs in float32, whatever dtype the run asks for: LaMa's Fourier convolutions
need float32 FFTs (half-precision FFTs on CUDA only take power-of-two sizes).
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from counterfactual._lazy import require
from counterfactual.image.base import (
    Edited,
    EditRequest,
    Eraser,
    Option,
    at_least,
    output_failure,
)
from counterfactual.image.checks import check_request, paste
from counterfactual.image.diffusion import FEATHER_OPTION, MODEL_OPTION, crop_box
from counterfactual.method.masks import mask_bounds
from counterfactual.models.runtime import ModelRuntime

MIN_CROP = 256
"""The least long side, in pixels, of the crop given to the model (the whole image if smaller)."""

PAD_MULTIPLE = 8
"""The model's input height and width are padded up to a multiple of this."""

_PROBE = 64  # side of the blank image the model is tried on when loaded


@dataclass(frozen=True, slots=True)
class LamaConfig:
    """A TorchScript LaMa; it always runs in float32."""

    model: str = ""
    """The ``.pt`` file (e.g. ``big-lama.pt``); the lama backend needs one."""
    max_side: int = 0
    """A crop whose long side is larger is inpainted at this size and scaled back
    (0 = native resolution)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""
    feather: int = 0
    """Soft paste: the fill fades into the picture over this many px outside the mask (0: a
    hard paste, only masked pixels change)."""

    def __post_init__(self) -> None:
        if self.max_side < 0:
            raise ValueError(f"lama_max_side must be >= 0 (0 = native), got {self.max_side}")
        at_least("crop_padding", self.crop_padding, 0)
        at_least("feather", self.feather, 0)


@dataclass(frozen=True, slots=True)
class _Job:
    """One non-empty request, cropped (and scaled) for the model."""

    index: int
    crop: tuple[int, int, int, int]
    image: np.ndarray  # (h, w, 3) uint8, the model's input before padding
    mask: np.ndarray  # (h, w) uint8, 0 or 255

    @property
    def padded(self) -> tuple[int, int]:
        h, w = self.mask.shape
        return _ceil(h), _ceil(w)


def _ceil(side: int) -> int:
    return -(-side // PAD_MULTIPLE) * PAD_MULTIPLE


class LamaInpainter:
    """Inpaint masked regions with a TorchScript LaMa model loaded once.

    ``config.model`` is the path of the ``.pt`` file, loaded on ``device``; the model is tried
    once on a blank image so that a file with the wrong interface fails here, not on every
    sample. Requests whose padded crops have the same size run together, ``batch_size`` at a
    time. A model error during a call propagates (the caller retries item by item).
    """

    def __init__(self, config: LamaConfig, device: str = "cpu", batch_size: int = 1) -> None:
        runtime = ModelRuntime.of(device, "float32", batch_size)
        path = Path(config.model).expanduser()
        if not config.model or not path.is_file():
            raise ValueError(_missing_model_message(config.model, path))
        self.config = config
        self.batch_size = runtime.batch_size
        self._torch = require("torch", "models")
        self.device = runtime.torch_device()
        try:
            with warnings.catch_warnings():
                # torch >= 2.10 deprecates TorchScript, the format LaMa's exports ship in
                warnings.filterwarnings("ignore", ".*torch.jit", DeprecationWarning)
                model = self._torch.jit.load(str(path), map_location=self.device)
        except (RuntimeError, ValueError, OSError) as err:
            raise ValueError(
                f"cannot load {config.model!r} as a TorchScript model on {self.device}: {err}"
            ) from err
        self._model = model.eval()
        self._sha256 = _sha256(path)
        self._probe()

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "method": "inpaint",
            "backend": "lama",
            "model": c.model,
            "model_sha256": self._sha256,
            "crop_padding": c.crop_padding,
            "min_crop": MIN_CROP,
            "max_side": c.max_side,
            "dtype": "float32",
            **({"feather": c.feather} if c.feather else {}),  # as before when unused
        }

    def __call__(self, batch: Sequence[EditRequest]) -> list[Edited]:
        """Edited ``(H, W, 3)`` uint8 images, one per request, in order; a request whose fill
        is non-finite or blank (:func:`~counterfactual.image.base.output_failure`) gets that
        ``SampleError`` instead, nothing pasted.

        A request whose mask is all zero comes back as a copy of its image. Raises
        ``ValueError`` if an image is not ``(H, W, 3)`` uint8, a mask not ``(H, W)`` uint8, or
        the model's output is not ``(N, 3, H, W)``.
        """
        for index, request in enumerate(batch):
            try:
                check_request(request)
            except ValueError as err:
                raise ValueError(f"request {index}: {err}") from err
        results: list[Edited] = [request.image.copy() for request in batch]
        groups: dict[tuple[int, int], list[_Job]] = {}
        for index, request in enumerate(batch):
            job = self._prepare(index, request)
            if job is not None:
                groups.setdefault(job.padded, []).append(job)
        step = self.batch_size
        for jobs in groups.values():
            for start in range(0, len(jobs), step):
                chunk = jobs[start : start + step]
                for job, fill in zip(chunk, self._run(chunk), strict=True):
                    h, w = job.mask.shape
                    failure = output_failure(fill[:h, :w], "LaMa's fill")
                    if failure is not None:
                        results[job.index] = failure
                        continue
                    out = results[job.index]
                    assert isinstance(out, np.ndarray)
                    self._paste(out, batch[job.index].mask, job, fill, self.config.feather)
        return results

    def _prepare(self, index: int, request: EditRequest) -> _Job | None:
        crop = region(self.config, request.mask)
        if crop is None:
            return None
        x0, y0, x1, y1 = crop
        image = request.image[y0:y1, x0:x1]
        mask = np.where(request.mask[y0:y1, x0:x1] > 0, 255, 0).astype(np.uint8)
        max_side = self.config.max_side
        if max_side and max(x1 - x0, y1 - y0) > max_side:
            scale = max_side / max(x1 - x0, y1 - y0)
            size = (max(1, round((x1 - x0) * scale)), max(1, round((y1 - y0) * scale)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            # any pixel touched by the mask is a hole, so the fill covers every masked pixel
            mask = cv2.resize(mask, size, interpolation=cv2.INTER_AREA)
            mask = np.where(mask > 0, 255, 0).astype(np.uint8)
        return _Job(index=index, crop=(x0, y0, x1, y1), image=image, mask=mask)

    def _run(self, chunk: Sequence[_Job]) -> np.ndarray:
        """The model's output for jobs of one padded size: uint8 (N, ph, pw, 3), still padded
        (each job's crop may be smaller than the padded size)."""
        ph, pw = chunk[0].padded
        images = np.stack([_pad(job.image, ph, pw) for job in chunk])
        masks = np.stack([_pad(job.mask, ph, pw) for job in chunk])
        return self._forward(images, masks)

    def _forward(self, images: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Run the model on padded (N, H, W, 3) uint8 images and (N, H, W) uint8 masks; uint8
        (N, H, W, 3) out."""
        torch = self._torch
        n, h, w = masks.shape
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            # optimized_execution(False): no re-specialisation for every new crop size
            image = torch.from_numpy(images).to(self.device).permute(0, 3, 1, 2).float() / 255.0
            mask = (torch.from_numpy(masks).to(self.device) > 0).float().unsqueeze(1)
            out = self._model(image, mask)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (n, 3, h, w):
                shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise ValueError(
                    f"LaMa model {self.config.model!r} returned {shape} for inputs "
                    f"{(n, 3, h, w)} and {(n, 1, h, w)}; expected {(n, 3, h, w)}"
                )
            pixels = (out.float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8)
            return pixels.permute(0, 2, 3, 1).cpu().numpy()

    def _probe(self) -> None:
        image = np.zeros((1, _PROBE, _PROBE, 3), np.uint8)
        mask = np.zeros((1, _PROBE, _PROBE), np.uint8)
        mask[:, _PROBE // 4 : -_PROBE // 4, _PROBE // 4 : -_PROBE // 4] = 255
        try:
            self._forward(image, mask)
        except (RuntimeError, TypeError) as err:
            raise ValueError(
                f"{self.config.model!r} does not work as a LaMa model called as "
                f"model(image (N, 3, H, W), mask (N, 1, H, W)): {err}"
            ) from err

    @staticmethod
    def _paste(
        out: np.ndarray, mask: np.ndarray, job: _Job, fill: np.ndarray, feather: int
    ) -> None:
        x0, y0, x1, y1 = job.crop
        h, w = job.mask.shape
        fill = np.ascontiguousarray(fill[:h, :w])  # the padding cropped off
        if (h, w) != (y1 - y0, x1 - x0):
            fill = cv2.resize(fill, (x1 - x0, y1 - y0), interpolation=cv2.INTER_CUBIC)
        paste(out[y0:y1, x0:x1], fill, mask[y0:y1, x0:x1], feather)


def region(config: LamaConfig, mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """The crop LaMa edits for ``mask``: :func:`crop_box` of its bounds grown to at least
    :data:`MIN_CROP` px and by ``feather``; ``None`` for an empty mask."""
    box = mask_bounds(mask)
    if box is None:
        return None
    height, width = mask.shape
    long_side = max(box[2] - box[0], box[3] - box[1])
    # crop_box grows each side by ceil(padding * side): this padding reaches MIN_CROP
    padding = max(config.crop_padding, (MIN_CROP - long_side) / (2 * long_side))
    padding = max(padding, config.feather / long_side)  # the fill covers the band
    return crop_box(box, padding, height, width)


def _pad(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """``array`` mirrored at the bottom and right to ``height`` x ``width`` (IOPaint's
    ``pad_img_to_modulo``)."""
    rows, cols = height - array.shape[0], width - array.shape[1]
    pad = ((0, rows), (0, cols)) + ((0, 0),) * (array.ndim - 2)
    return np.pad(array, pad, mode="symmetric")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _missing_model_message(model: str, path: Path) -> str:
    hint = (
        "the lama backend loads a local TorchScript file (e.g. big-lama.pt from the "
        "lama-cleaner / IOPaint releases); download it and pass its path as the model "
        "(--inpaint-model PATH)"
    )
    if not model:
        return f"no LaMa model given: {hint}"
    if path.is_dir():
        return f"LaMa model {model!r} is a folder, not a TorchScript file: {hint}"
    looks_like_hub_id = "/" in model and not model.startswith((".", "/", "~")) and not path.suffix
    if looks_like_hub_id:
        return f"LaMa model {model!r} looks like a hub id, which is not supported: {hint}"
    return f"LaMa model file {model!r} does not exist: {hint}"


def _build(config: LamaConfig, *, device: str, batch_size: int, **runtime: Any) -> LamaInpainter:
    return LamaInpainter(config, device=device, batch_size=batch_size)


ERASER = Eraser(
    name="lama",
    config=LamaConfig,
    options=(
        MODEL_OPTION,
        Option(
            "max_side",
            "lama_max_side",
            "lama: cap the crop's long side in px, >= 0 (0: native resolution)",
            cli="--lama-max-side",
            kind="nonnegative_int",
        ),
        Option("crop_padding", "crop_padding", "context around the mask box, fraction of its size"),
        FEATHER_OPTION,
    ),
    build=_build,
    summary="lama (a TorchScript LaMa)",
    model="model",
    region=region,
)
