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

Batches: each crop goes onto one of a few fixed square canvases (:func:`canvas_side`:
``work_side``, its half, its quarter, ... down to 64 px), mirror-padded at the bottom and right,
or scaled down onto the largest when it is bigger (or onto a canvas it exceeds by at most
:data:`SQUEEZE`); the requests of one canvas run as one forward, ``batch_size`` at a time. A
request's canvas depends on its crop alone, so its output does not depend on the other requests
of its batch. COCO-like crops (grown to at least 256 px, at most 640) land on the 256 and 512
canvases: 8 requests are one or two forwards where grouping by exact padded size made 4 to 7.
``work_side = 0`` keeps the old grouping by exact padded size (native resolution, ``max_side``
aside). The next canvas's padding and tensor are made on a thread while the model runs the
current one, and on CUDA they are copied from pinned memory.

The model always runs in float32, whatever dtype the run asks for: LaMa's Fourier convolutions
(FFC) need float32 FFTs: cuFFT's half-precision transforms only take power-of-two sizes, and
big-lama is trained and released in float32 (IOPaint runs it so). The canvases are powers of two
for the default ``work_side`` all the same.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from counterfactual import fs
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
from counterfactual.image.diffusion import crop_box, feather_field, model_field
from counterfactual.method.masks import mask_bounds
from counterfactual.models.runtime import ModelRuntime
from counterfactual.options import declare

MIN_CROP = 256
"""The least long side, in pixels, of the crop given to the model (the whole image if smaller)."""

PAD_MULTIPLE = 8
"""The model's input height and width are padded up to a multiple of this."""

WORK_SIDE = 512
"""The default largest canvas (``lama_work_side``)."""

SMALLEST_CANVAS = 64
"""The smallest canvas: the halving of ``work_side`` stops here."""

SQUEEZE = 1.125
"""A crop at most this much larger than a canvas is scaled down onto it rather than padded to
the next (crop_box's rounding makes many 257-263 px crops of the 256 px minimum)."""

_PROBE = 64  # side of the blank image the model is tried on when loaded


@dataclass(frozen=True, slots=True)
class LamaConfig:
    """A TorchScript LaMa; it always runs in float32."""

    model: str = model_field("")
    """The ``.pt`` file (e.g. ``big-lama.pt``); the lama backend needs one."""
    max_side: int = declare(
        0,
        help="lama: cap the crop's long side in px, >= 0 (0: native resolution)",
        flags=("--lama-max-side",),
        kind="nonnegative_int",
        metadata=recorded("lama_max_side"),
    )
    """A crop whose long side is larger is inpainted at this size and scaled back
    (0 = native resolution)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""
    feather: int = feather_field()
    """Soft paste: the fill fades into the picture over this many px outside the mask (0: a
    hard paste, only masked pixels change)."""
    work_side: int = declare(
        WORK_SIDE,
        help="lama: the largest square canvas crops are batched on, a multiple of 8 >= 64; the "
        "others are its halves (0: each crop at its own size)",
        flags=("--lama-work-side",),
        kind="nonnegative_int",
        metadata=recorded("lama_work_side", sparse=True),
    )
    """The largest square canvas crops are batched on (:func:`canvas_side`); 0: each crop at
    its own size padded to a multiple of 8, batched only with crops of that exact size."""

    def __post_init__(self) -> None:
        if self.max_side < 0:
            raise ValueError(f"lama_max_side must be >= 0 (0 = native), got {self.max_side}")
        if self.work_side and (self.work_side < SMALLEST_CANVAS or self.work_side % PAD_MULTIPLE):
            raise ValueError(
                f"lama_work_side must be 0 or a multiple of {PAD_MULTIPLE} >= {SMALLEST_CANVAS}, "
                f"got {self.work_side}"
            )
        at_least("crop_padding", self.crop_padding, 0)
        at_least("feather", self.feather, 0)


@dataclass(frozen=True, slots=True)
class _Job:
    """One non-empty request, cropped (and scaled) for the model."""

    index: int
    crop: tuple[int, int, int, int]
    image: np.ndarray  # (h, w, 3) uint8, the model's input before padding
    mask: np.ndarray  # (h, w) uint8, 0 or 255

    canvas: tuple[int, int]  # (height, width) the model sees it padded to


def _ceil(side: int) -> int:
    return -(-side // PAD_MULTIPLE) * PAD_MULTIPLE


def canvases(work_side: int) -> tuple[int, ...]:
    """The square canvas sides for ``work_side``, smallest first: ``work_side`` halved (each
    rounded up to a multiple of 8) while it stays >= :data:`SMALLEST_CANVAS`."""
    sides = [work_side]
    while _ceil(sides[-1] // 2) >= SMALLEST_CANVAS and sides[-1] // 2 > 0:
        sides.append(_ceil(sides[-1] // 2))
    return tuple(reversed(sides))


def canvas_side(long_side: int, work_side: int) -> int:
    """The square canvas a crop of ``long_side`` px goes on: the smallest of
    :func:`canvases` that holds it, or that it exceeds by at most :data:`SQUEEZE` (it is then
    scaled down onto it); the largest when it holds none."""
    sides = canvases(work_side)
    return next((side for side in sides if long_side <= side * SQUEEZE), sides[-1])


class LamaInpainter:
    """Inpaint masked regions with a TorchScript LaMa model loaded once.

    ``config.model`` is the path of the ``.pt`` file, loaded on ``device``; the model is tried
    once on a blank image so that a file with the wrong interface fails here, not on every
    sample. Requests whose crops go on the same canvas run together, ``batch_size`` at a
    time (module docstring). A model error during a call propagates (the caller halves the
    batch on out-of-memory, retries item by item on other errors).
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
        self._sha256 = fs.file_sha256(path)
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
            "work_side": c.work_side,
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
                groups.setdefault(job.canvas, []).append(job)
        step = self.batch_size
        chunks = [jobs[i : i + step] for jobs in groups.values() for i in range(0, len(jobs), step)]
        for chunk, fills in zip(chunks, self._forwards(chunks), strict=True):
            for job, fill in zip(chunk, fills, strict=True):
                h, w = job.mask.shape
                failure = output_failure(fill[:h, :w], "LaMa's fill")
                if failure is not None:
                    results[job.index] = failure
                    continue
                out = results[job.index]
                assert isinstance(out, np.ndarray)
                self._paste(out, batch[job.index].mask, job, fill, self.config.feather)
        return results

    def _forwards(self, chunks: Sequence[Sequence[_Job]]) -> Iterator[np.ndarray]:
        """The model's output per chunk (uint8 ``(N, ch, cw, 3)``, still padded), the next
        chunk's inputs made on a thread while the model runs the current one."""
        if not chunks:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="lama-inputs") as pool:
            ahead: Future[tuple[Any, Any]] = pool.submit(self._inputs, chunks[0])
            for i in range(len(chunks)):
                image, mask = ahead.result()
                if i + 1 < len(chunks):
                    ahead = pool.submit(self._inputs, chunks[i + 1])
                yield self._forward_tensors(image, mask)

    def _inputs(self, chunk: Sequence[_Job]) -> tuple[Any, Any]:
        """A chunk's padded images and masks as uint8 tensors ``(N, H, W, 3)`` and ``(N, H, W)``
        on the model's device (through pinned memory on CUDA)."""
        ph, pw = chunk[0].canvas
        images = np.stack([_pad(job.image, ph, pw) for job in chunk])
        masks = np.stack([_pad(job.mask, ph, pw) for job in chunk])
        return self._to_device(images), self._to_device(masks)

    def _to_device(self, array: np.ndarray) -> Any:
        tensor = self._torch.from_numpy(array)
        if self.device.type != "cuda":
            return tensor
        return tensor.pin_memory().to(self.device, non_blocking=True)

    def _prepare(self, index: int, request: EditRequest) -> _Job | None:
        crop = region(self.config, request.mask)
        if crop is None:
            return None
        x0, y0, x1, y1 = crop
        image = request.image[y0:y1, x0:x1]
        mask = np.where(request.mask[y0:y1, x0:x1] > 0, 255, 0).astype(np.uint8)
        long_side = max(x1 - x0, y1 - y0)
        target = long_side
        if self.config.max_side:
            target = min(target, self.config.max_side)
        side = canvas_side(target, self.config.work_side) if self.config.work_side else 0
        if side:
            target = min(target, side)
        if target < long_side:
            scale = target / long_side
            size = (max(1, round((x1 - x0) * scale)), max(1, round((y1 - y0) * scale)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
            # any pixel touched by the mask is a hole, so the fill covers every masked pixel
            mask = cv2.resize(mask, size, interpolation=cv2.INTER_AREA)
            mask = np.where(mask > 0, 255, 0).astype(np.uint8)
        h, w = mask.shape
        canvas = (side, side) if side else (_ceil(h), _ceil(w))
        return _Job(index=index, crop=(x0, y0, x1, y1), image=image, mask=mask, canvas=canvas)

    def _forward(self, images: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Run the model on padded (N, H, W, 3) uint8 images and (N, H, W) uint8 masks; uint8
        (N, H, W, 3) out."""
        return self._forward_tensors(self._to_device(images), self._to_device(masks))

    def _forward_tensors(self, images: Any, masks: Any) -> np.ndarray:
        """:meth:`_forward` on uint8 tensors already on the model's device."""
        torch = self._torch
        n, h, w = masks.shape
        with torch.inference_mode(), torch.jit.optimized_execution(False):
            # optimized_execution(False): no re-specialisation for every new crop size
            image = images.permute(0, 3, 1, 2).float() / 255.0
            mask = (masks > 0).float().unsqueeze(1)
            try:
                out = self._model(image, mask)
            except torch.jit.Error as err:  # raised by the script itself: not a RuntimeError
                raise RuntimeError(str(err)) from err
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
    build=_build,
    summary="lama (a TorchScript LaMa)",
    model="model",
    region=region,
    model_file=True,
)
