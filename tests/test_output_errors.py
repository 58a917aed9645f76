"""An output that cannot be written ends the run with one line naming the file, exit 2, from
either runner: the error a shard worker meets comes back to the driver as itself, not as
Ray's traceback. Run as a user runs it: a process, its stderr read back."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.readers.generate import generate_coco

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 6, seed=3, size=(96, 72))


def _synth(files, out, *extra):
    args = synth_args(files, out, "--image-method", "blur", "--contact-sheet", "0", *extra)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=out.parent,
        timeout=300,
    )


@pytest.mark.parametrize("runner", ["local", "ray"])
def test_a_shard_that_cannot_be_written_is_one_line(coco, tmp_path, runner):
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-000001.tar").mkdir()  # the worker's rename onto it fails
    extra = ["--images-per-shard", "2", "--runner", runner]
    if runner == "ray":
        extra += ["--num-cpus", "2", "--no-dashboard"]
    done = _synth(coco, out, *extra)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("counterfactual synth: error:"), done.stderr
    assert "shard-000001.tar" in errors[0]
    assert "Traceback" not in done.stderr and "RayTaskError" not in done.stderr
    assert not list(out.glob("*.tmp*")), sorted(p.name for p in out.iterdir())
    # the other shards are committed; once the path is free the same command finishes the run
    (out / "shard-000001.tar").rmdir()
    done = _synth(coco, out, *extra)
    assert done.returncode == 0, done.stderr
    assert (out / "shard-000001_stats.json").exists()
    assert "from an earlier run" in done.stdout
