"""An impossible setup fails with one line that names the stage, the cause and the fix, never a
traceback and never a hang: the real command in a subprocess (a fresh local Ray for the Ray
runner), stopped as hung after ``HANG`` seconds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from bad_coco import synth_args

from counterfactual.readers.generate import generate_coco

pytestmark = pytest.mark.slow

HANG = 150.0
"""Seconds after which a command that has not exited counts as hung: a bound that tells a hang
from a slow start on a loaded machine (a local Ray's start included), not a speed figure (speed
is ``make bench``'s)."""


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 6, seed=1, size=(160, 120))


def synth(coco, out, *extra: str) -> tuple[int, str]:
    """Run ``counterfactual synth`` in a subprocess; ``(exit code, stderr)``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a fresh local Ray
    cmd = [sys.executable, "-m", "counterfactual", *synth_args(coco, out, *extra)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"no answer after {err.timeout:.0f} s: {err.stderr!r}")
    return proc.returncode, proc.stderr


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_gpu_stage_on_a_ray_without_gpus(coco, tmp_path):
    (tmp_path / "sd").mkdir()
    code, err = synth(
        coco,
        tmp_path / "out",
        "--runner",
        "ray",
        "--no-dashboard",
        "--image-method",
        "inpaint",
        "--inpaint-backend",
        "diffusers",
        "--inpaint-model",
        str(tmp_path / "sd"),  # a local model: no hub check, the layout is refused first
        "--device",
        "cuda",
        "--contact-sheet",
        "0",
    )
    assert code == 2, err
    line = last_line(err)
    assert line.startswith("counterfactual synth: error: stage Inpaint"), err
    assert "the cluster has no GPU" in line and "--device cpu" in line, err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "run.lock").exists()  # released on the way out


@pytest.mark.parametrize("runner", ["ray", "local"])
@pytest.mark.parametrize("model", ["missing", "broken"])
def test_a_model_that_does_not_load(coco, tmp_path, runner, model):
    """A model path that does not exist is refused by the driver before anything starts; one
    that exists but does not load is reported by the actor (Ray) or the runner (local)."""
    path = tmp_path / "sd"
    if model == "broken":
        path.mkdir()
        (path / "model_index.json").write_text("{not json")
    ray = ("--runner", "ray", "--model-actors", "1", "--no-dashboard") if runner == "ray" else ()
    code, err = synth(
        coco,
        tmp_path / "out",
        *ray,
        "--image-method",
        "inpaint",
        "--inpaint-backend",
        "diffusers",
        "--inpaint-model",
        str(path),
        "--contact-sheet",
        "0",
    )
    assert code == 2, err
    line = last_line(err)
    assert line.startswith("counterfactual synth: error: Inpaint"), err
    assert str(path) in line and "--inpaint-model" in line, err
    if model == "broken":
        assert "could not start" in line, err
    errors = [x for x in err.splitlines() if "error" in x.lower()]
    assert errors[-1] == line and "Traceback" not in err
    assert not (tmp_path / "out" / "run.lock").exists()
