"""Where and in what sizes a model computes: device, weights dtype, batch size, checked here once.

Every model backend (detector, inpainters, captioner, verifier, embedders, trainer) takes its
runtime as a :class:`ModelRuntime` or builds one from its ``device``/``dtype``/``batch_size``
arguments, so a bad value gets the same one-line ``ValueError`` wherever it is given.
:data:`DTYPES` is the one list of weight dtypes. torch is imported only when a device or dtype
is resolved (:func:`resolve_device`, :func:`resolve_dtype`), never at import time.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from counterfactual._lazy import require

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "float16", "bfloat16")
"""The weight dtypes a model may run in, by torch's names."""


def check_dtype(dtype: object) -> str:
    """``dtype`` if it is one of :data:`DTYPES`, else a ``ValueError`` naming it."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return dtype


def check_batch_size(value: object, name: str = "batch_size") -> int:
    """``value`` if it is a whole number >= 1 (not a bool), else a ``ValueError`` naming
    ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return int(value)


def check_device(device: object) -> str:
    """``device`` if it is a non-blank name (``cpu``, ``cuda:1``), else a ``ValueError``;
    whether torch knows it is :func:`resolve_device`'s to say."""
    if not isinstance(device, str) or not device.strip():
        raise ValueError(f"device must be a torch device name, got {device!r}")
    return device


def dtype_name(dtype: str | torch.dtype | None) -> str | None:
    """A torch dtype by its name (``torch.float16`` -> ``"float16"``); a name or ``None`` as
    it is."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True, slots=True)
class ModelRuntime:
    """Where one model runs and how many items it takes per call: none of it decides what an
    output is (a device or dtype changes the floats, not what is removed or written).

    ``device``: a torch device name; ``None`` is CUDA when available, else CPU. ``dtype``: the
    weights' dtype, one of :data:`DTYPES`; ``None`` is float16 on CUDA, float32 elsewhere.
    ``batch_size``: items per model call, >= 1.
    """

    device: str | None = "cpu"
    dtype: str | None = "float32"
    batch_size: int = 1

    def __post_init__(self) -> None:
        if self.device is not None:
            check_device(self.device)
        if self.dtype is not None:
            check_dtype(self.dtype)
        check_batch_size(self.batch_size)

    @classmethod
    def of(
        cls,
        device: str | torch.device | None,
        dtype: str | torch.dtype | None,
        batch_size: Any,
        name: str = "batch_size",
    ) -> ModelRuntime:
        """A runtime from a backend's arguments (torch devices and dtypes by their names);
        ``name``: how a bad batch size is named in the error."""
        check_batch_size(batch_size, name)
        return cls(None if device is None else str(device), dtype_name(dtype), batch_size)

    def torch_device(self) -> torch.device:
        """:attr:`device` as a ``torch.device`` (:func:`resolve_device`)."""
        return resolve_device(self.device)

    def torch_dtype(self, device: torch.device | None = None) -> torch.dtype:
        """:attr:`dtype` as a torch dtype; ``None`` resolved for ``device`` (default: this
        runtime's)."""
        return resolve_dtype(self.dtype, self.torch_device() if device is None else device)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``; ``None`` means ``cuda`` when available, else ``cpu``.
    A CUDA device this torch cannot use is a ``ValueError`` saying why (:func:`check_cuda`)."""
    torch = require("torch", "models")
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device {device!r} is not a torch device") from err
    if resolved.type == "cuda":
        check_cuda(str(device))
    return resolved


def check_cuda(device: str = "cuda") -> None:
    """Raise a one-line ``ValueError`` when torch cannot use CUDA, saying why: a CPU build of
    torch, no NVIDIA driver on this host, a driver older than the one torch's CUDA needs
    (:func:`counterfactual.torch_build.cuda_problem`), or no GPU visible."""
    torch = require("torch", "models")
    if torch.cuda.is_available():
        return
    from counterfactual.torch_build import DriverError, cuda_problem, driver_version

    try:
        driver: str | None | DriverError = driver_version()
    except DriverError as err:
        driver = err
    why = cuda_problem(torch.__version__, torch.version.cuda, driver)
    raise ValueError(f"--device {device}: {why}")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``dtype`` (one of :data:`DTYPES` or a torch dtype) as a torch dtype; ``None`` means
    float16 on CUDA and float32 elsewhere."""
    torch = require("torch", "models")
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        return getattr(torch, check_dtype(dtype))
    if dtype_name(dtype) not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not float32, float16 or bfloat16")
    return dtype
