"""Which torch build this host can run, and why CUDA is not available to the one installed.

``make install`` runs this file with the system Python before the virtual environment exists
(standard library only): it prints the pip arguments of the torch and torchvision pair for the
host (:func:`pick`), or one line naming the ``TORCH=`` to set and exits 2. The rule, from
NVIDIA's driver requirements (a CUDA 13.x build needs driver R580, 580.65.06 or newer; a
CUDA 12.x build R525, 525.60.13 or newer, through CUDA's minor version compatibility):

==================  =========================  =====================================================
host                driver                     build
==================  =========================  =====================================================
x86_64, no GPU      (no ``nvidia-smi``)        PyPI ``torch==2.14.1 torchvision==0.29.1`` (CUDA 13.0
                                               build; it runs on the CPU too)
x86_64              >= 580.65.06               the same PyPI pair (CUDA 13.0)
x86_64              525.60.13 .. 580           ``torch==2.13.0 torchvision==0.28.0`` from the
                                               PyTorch CUDA 12.6 index
x86_64              older                      stop: update the driver, or set ``TORCH=``
aarch64, no GPU     (no ``nvidia-smi``)        PyPI ``torch==2.9.1 torchvision==0.24.1`` (CPU)
aarch64 with GPU    any                        stop: set ``TORCH=`` to a CUDA build for the host
==================  =========================  =====================================================

:func:`cuda_problem` says in one line why ``torch.cuda.is_available()`` is false: a CPU build,
no NVIDIA driver, or a driver older than the build's CUDA needs.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

PYPI_X86 = "torch==2.14.1 torchvision==0.29.1"
"""PyPI's pair on x86_64: a CUDA 13.0 build, which also runs on a CPU."""
CU126_X86 = "torch==2.13.0 torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cu126"
"""The newest pair with a CUDA 12.6 build, for drivers R525 to R575."""
PYPI_ARM = "torch==2.9.1 torchvision==0.24.1"
"""PyPI's pair on aarch64 as installed here: a CPU build."""

MIN_DRIVER_TEXT = {13: "580.65.06", 12: "525.60.13", 11: "450.80.02"}
"""Oldest Linux driver that runs a CUDA major version's builds (minor version compatibility)."""


class DriverError(RuntimeError):
    """``nvidia-smi`` exists but did not report a driver version."""


def version_tuple(text: str) -> tuple[int, ...]:
    """``"550.54.15"`` -> ``(550, 54, 15)``; ``ValueError`` for anything else."""
    parts = text.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"{text!r} is not a driver version")
    return tuple(int(p) for p in parts)


MIN_DRIVER = {major: version_tuple(text) for major, text in MIN_DRIVER_TEXT.items()}


def driver_version(run: Callable[..., Any] = subprocess.run) -> str | None:
    """The NVIDIA driver's version from ``nvidia-smi`` (the first GPU's), or ``None`` when
    there is no ``nvidia-smi``; :class:`DriverError` when it fails or prints no version."""
    if shutil.which("nvidia-smi") is None and run is subprocess.run:
        return None
    try:
        done = run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        return None
    except (OSError, subprocess.SubprocessError) as err:
        raise DriverError(f"nvidia-smi failed: {err}") from err
    lines = [line.strip() for line in (done.stdout or "").splitlines() if line.strip()]
    if done.returncode != 0 or not lines:
        said = " ".join((done.stderr or done.stdout or "").split())[:200]
        raise DriverError(f"nvidia-smi failed (exit {done.returncode}): {said or 'no output'}")
    try:
        version_tuple(lines[0])
    except ValueError as err:
        raise DriverError(f"nvidia-smi printed {lines[0]!r}, not a driver version") from err
    return lines[0]


def pick(machine: str, driver: str | None) -> str:
    """The pip arguments of the torch pair for a host (``platform.machine()``, the driver
    version or ``None`` without a GPU); ``ValueError`` (one line naming ``TORCH=``) when no
    default fits."""
    arm = machine.lower() in ("aarch64", "arm64")
    if driver is None:
        return PYPI_ARM if arm else PYPI_X86
    if arm:
        raise ValueError(
            f"an NVIDIA driver {driver} on {machine}: PyPI's aarch64 torch here is a CPU build; "
            f'set TORCH="torch==2.14.1 torchvision==0.29.1 --index-url '
            f'https://download.pytorch.org/whl/cu130" (or the CUDA build your platform ships)'
        )
    have = version_tuple(driver)
    if have >= MIN_DRIVER[13]:
        return PYPI_X86
    if have >= MIN_DRIVER[12]:
        return CU126_X86
    raise ValueError(
        f"NVIDIA driver {driver} is older than R525 (525.60.13), the oldest current torch CUDA "
        f'builds run on: update the driver, or set TORCH="torch==2.7.1 torchvision==0.22.1 '
        f'--index-url https://download.pytorch.org/whl/cu118" (CUDA 11.8, driver >= 450.80.02)'
    )


def cuda_problem(torch_version: str, torch_cuda: str | None, driver: str | None | Any) -> str:
    """Why a torch (``torch.__version__``, ``torch.version.cuda``) cannot use CUDA on a host
    whose driver is ``driver`` (``None``: no NVIDIA driver; a :class:`DriverError`: what
    ``nvidia-smi`` said), in one line with the fix."""
    if torch_cuda is None:
        return (
            f"torch {torch_version} is a CPU build; install a CUDA build for this host's "
            f"driver (`make install`, or TORCH= as the README's torch table says) or use "
            f"--device cpu"
        )
    if isinstance(driver, BaseException):
        return f"CUDA is not available to torch {torch_version}: {driver}"
    if driver is None:
        return (
            f"no NVIDIA driver on this host (no nvidia-smi), so torch {torch_version} sees no "
            f"GPU; run on a GPU node or use --device cpu"
        )
    major = int(str(torch_cuda).split(".")[0])
    need = MIN_DRIVER.get(major)
    try:
        have = version_tuple(driver)
    except ValueError:
        have = None
    if need is not None and have is not None and have < need:
        return (
            f"torch {torch_version} is built for CUDA {torch_cuda}, which needs NVIDIA driver "
            f">= {MIN_DRIVER_TEXT[major]}, and this host has {driver}; reinstall torch for "
            f"this driver (`rm -rf .venv && make install` picks it) or update the driver"
        )
    return (
        f"torch {torch_version} (CUDA {torch_cuda}) sees no GPU though driver {driver} is "
        f"installed; check CUDA_VISIBLE_DEVICES and that the GPU is not taken or in a bad state "
        f"(nvidia-smi)"
    )


def main() -> int:
    try:
        print(pick(platform.machine(), driver_version()))
    except (ValueError, DriverError) as err:
        print(f"make install: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
