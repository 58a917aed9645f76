"""The torch build `make install` picks for a host, and the one line a run on ``--device cuda``
gives when its torch cannot see the GPU (tested with torch as it is here: no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from counterfactual import torch_build
from counterfactual.torch_build import (
    CU126_X86,
    PYPI_ARM,
    PYPI_X86,
    DriverError,
    cuda_problem,
    driver_version,
    pick,
)

SCRIPT = Path(torch_build.__file__)


@pytest.mark.parametrize(
    "machine, driver, expected",
    [
        ("x86_64", None, PYPI_X86),  # no GPU: PyPI's pair, which runs on a CPU too
        ("x86_64", "580.65.06", PYPI_X86),
        ("x86_64", "590.44.01", PYPI_X86),
        ("x86_64", "580.159.04", PYPI_X86),  # an H100 node, nvidia-smi as it printed
        ("x86_64", "580.65.05", CU126_X86),
        ("x86_64", "575.57.08", CU126_X86),
        ("x86_64", "535.183.01", CU126_X86),
        ("x86_64", "525.60.13", CU126_X86),
        ("aarch64", None, PYPI_ARM),
        ("arm64", None, PYPI_ARM),
    ],
)
def test_the_build_for_each_host(machine, driver, expected):
    assert pick(machine, driver) == expected


@pytest.mark.parametrize(
    "machine, driver, says",
    [
        ("x86_64", "470.256.02", "older than R525 (525.60.13)"),
        ("x86_64", "525.60.12", "older than R525"),
        ("aarch64", "580.95.05", "aarch64"),
    ],
)
def test_a_host_no_build_fits_stops_with_the_torch_to_set(machine, driver, says):
    with pytest.raises(ValueError) as info:
        pick(machine, driver)
    line = str(info.value)
    assert says in line and 'TORCH="torch==' in line and "\n" not in line


def _smi(stdout="", returncode=0, stderr=""):
    def run(cmd, **kwargs):
        assert cmd[0] == "nvidia-smi"
        return SimpleNamespace(stdout=stdout, stderr=stderr, returncode=returncode)

    return run


def test_driver_version_reads_nvidia_smi():
    assert driver_version(_smi("550.54.15\n550.54.15\n")) == "550.54.15"
    with pytest.raises(DriverError, match="exit 9"):
        driver_version(_smi("", 9, "NVIDIA-SMI has failed because it couldn't communicate"))
    with pytest.raises(DriverError, match="not a driver version"):
        driver_version(_smi("N/A\n"))


def test_make_install_keeps_this_hosts_build():
    """This machine has no NVIDIA driver: the script prints PyPI's 2.14.1 pair, as before."""
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "torch==2.14.1 torchvision==0.29.1"


@pytest.mark.parametrize(
    "cuda, driver, says",
    [
        (None, None, "is a CPU build"),
        ("13.0", None, "no NVIDIA driver on this host"),
        ("13.0", "550.54.15", "needs NVIDIA driver >= 580.65.06, and this host has 550.54.15"),
        ("12.6", "550.54.15", "sees no GPU though driver 550.54.15 is installed"),
        ("12.6", DriverError("nvidia-smi failed (exit 9): no devices"), "nvidia-smi failed"),
    ],
)
def test_why_cuda_is_not_available(cuda, driver, says):
    line = cuda_problem("2.14.1", cuda, driver)
    assert says in line and "\n" not in line


def test_resolve_device_cuda_says_why_on_this_host(monkeypatch):
    """Here torch is PyPI's CUDA build and there is no GPU: the error names the cause instead
    of a model-load error later; a CPU build is named as such."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    from counterfactual.models.embed import resolve_device

    monkeypatch.setattr(torch_build, "driver_version", lambda: None)
    with pytest.raises(ValueError) as info:
        resolve_device("cuda:0")
    assert str(info.value).startswith("--device cuda:0: ")
    if torch.version.cuda is not None:
        assert "no NVIDIA driver on this host" in str(info.value)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(ValueError, match="is a CPU build"):
        resolve_device("cuda")
    assert resolve_device("cpu").type == "cpu"


@pytest.mark.slow
def test_synth_on_cuda_without_a_gpu_ends_in_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    from bad_coco import synth_args

    from counterfactual.readers.generate import generate_coco

    files = generate_coco(tmp_path / "coco", 3, seed=1, size=(64, 48))
    lama = tmp_path / "lama.pt"
    lama.write_bytes(b"not needed: the device is checked first")
    args = synth_args(
        files,
        tmp_path / "out",
        "--inpaint-backend",
        "lama",
        "--inpaint-model",
        str(lama),
        "--device",
        "cuda",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("counterfactual synth: error: --device cuda: "), line


def test_a_model_step_on_cuda_is_checked_before_it_loads():
    """The Ray actors and the local runner start their steps through ``start_steps``: a CUDA
    device this torch cannot use is named there, before the model file is even looked at."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    from counterfactual.image import ImageConfig, LamaConfig
    from counterfactual.synth.plan import Runtime, SynthConfig
    from counterfactual.synth.staging import SetupError, start_steps

    lama = ImageConfig(backend="lama", lama=LamaConfig(model="/nowhere/big-lama.pt"))
    with pytest.raises(SetupError, match=r"^Inpaint could not start: --device cuda: "):
        start_steps(SynthConfig(image=lama), ["edit"], runtime=Runtime(device="cuda"))
