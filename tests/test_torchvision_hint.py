"""A torchvision that is installed but fails at import (PyPI's CUDA build beside a CPU torch)
is named in one line with the fix, before transformers fails on it in a way that does not name
it; an absent torchvision is fine. The broken one is a fake package put first on the path of
a subprocess, so nothing is installed here."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual._lazy import (
    check_torchvision,
    install_hint,
    matching_torchvision,
    require,
)
from counterfactual.readers.generate import generate_coco

REPO = Path(__file__).resolve().parents[1]
NMS = "operator torchvision::nms does not exist"


def fake_torchvision(folder: Path, body: str, version: str | None = "0.28.0") -> Path:
    """A ``torchvision`` package whose ``__init__`` is ``body``, with a dist-info of
    ``version`` (``None``: no version in it); returns the folder to put on ``PYTHONPATH``."""
    package = folder / "torchvision"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body, encoding="utf-8")
    # a dist-info first on the path, so a real torchvision's further down is not the one read;
    # ``version=None``: one without a Version line
    info = folder / f"torchvision-{version or 'unknown'}.dist-info"
    info.mkdir()
    line = f"Version: {version}\n" if version is not None else ""
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torchvision\n{line}", encoding="utf-8"
    )
    return folder


def run(code: str, path: Path | None) -> subprocess.CompletedProcess[str]:
    """``python -c code`` with ``path`` (if any) first on the import path."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [*([str(path)] if path else []), str(REPO), str(REPO / "tests")]
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )


REQUIRE = """
from counterfactual._lazy import BrokenDependency, require
try:
    require("transformers", "models")
except BrokenDependency as err:
    print("BROKEN", err)
else:
    print("OK")
"""


@pytest.mark.parametrize(
    ("torch", "expected"),
    [
        ("2.13.0+cpu", "0.28.*"),
        ("2.13.1", "0.28.*"),
        ("2.0.1+cu118", "0.15.*"),
        ("2.9.0+cu128", "0.24.*"),
        ("1.13.1", None),
        (None, None),
    ],
)
def test_matching_torchvision(torch, expected):
    assert matching_torchvision(torch) == expected


@pytest.mark.parametrize(
    ("torch", "expected"),
    [
        (
            "2.13.0+cpu",
            "pip install 'torchvision==0.28.*' --index-url https://download.pytorch.org/whl/cpu",
        ),
        (
            "2.9.0+cu128",
            "pip install 'torchvision==0.24.*' --index-url https://download.pytorch.org/whl/cu128",
        ),
        ("2.13.0", "pip install 'torchvision==0.28.*'"),  # PyPI's torch: PyPI's torchvision
        ("2.13.0+git1234", "pip install 'torchvision==0.28.*'"),
        (None, "pip install torchvision"),
    ],
)
def test_install_hint(torch, expected):
    assert install_hint(torch) == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    "body",
    [
        f"raise RuntimeError({NMS!r})",
        "raise OSError('libcudart.so.12: cannot open shared object file')",
        "import torchvision._C_missing_extension",  # a ModuleNotFoundError, not for torchvision
    ],
)
def test_broken_torchvision_is_named_in_one_line(tmp_path, body):
    proc = run(REQUIRE, fake_torchvision(tmp_path / "site", body))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out.startswith("BROKEN ") and "\n" not in out, out
    torch = importlib.metadata.version("torch")
    assert f"torchvision 0.28.0 is installed but does not work with torch {torch} (" in out
    assert f"({install_hint(torch)})" in out and "pip uninstall torchvision" in out
    if "nms" in body:
        assert f"({NMS})" in out


@pytest.mark.slow
def test_unknown_version_still_gives_the_hint(tmp_path):
    site = fake_torchvision(tmp_path / "site", f"raise RuntimeError({NMS!r})", version=None)
    out = run(REQUIRE, site).stdout.strip()
    assert out.startswith("BROKEN torchvision (version unknown) is installed"), out


@pytest.mark.slow
def test_a_working_or_absent_torchvision_is_left_alone(tmp_path):
    site = fake_torchvision(tmp_path / "site", "__version__ = '0.28.0'\n")
    assert run(REQUIRE, site).stdout.strip() == "OK"
    # and as this environment has it (none, or one that works): no hint
    proc = run(
        REQUIRE + "import importlib.util; print(importlib.util.find_spec('torchvision'))", None
    )
    assert proc.stdout.split()[0] == "OK", proc.stderr
    check_torchvision()  # in process as well
    assert require("transformers", "models").__name__ == "transformers"


@pytest.mark.slow
def test_synth_with_a_broken_torchvision_fails_in_one_line(tmp_path):
    files = generate_coco(tmp_path / "coco", 4, seed=1, size=(64, 48))
    (tmp_path / "owl").mkdir()  # a local folder: torchvision fails before it is read
    owl = str(tmp_path / "owl")
    args = synth_args(files, tmp_path / "out", "--boxes", "detector", "--detector-model", owl)
    site = fake_torchvision(tmp_path / "site", f"raise RuntimeError({NMS!r})")
    proc = run(f"import sys\nfrom counterfactual.cli import main\nsys.exit(main({args!r}))", site)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith(
        "counterfactual synth: error: Detect could not start: BrokenDependency: "
        "torchvision 0.28.0 is installed but does not work with torch"
    ), proc.stderr
    assert NMS in lines[-1]
