"""One run per OUT, through the command a user types: while a live ``synth`` holds OUT's lock
(a real run in a subprocess, held at its first shard) a second one is refused at once, naming
the holder, on a local folder and on S3; a run of one runner resumes a run of the other, and
the manifest keeps the history of both."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual import fs
from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

pytestmark = pytest.mark.slow

KILLING_RUN = Path(__file__).with_name("killing_run.py")
EXTRA = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 9, seed=4, size=(320, 240))


@pytest.fixture(params=["local", "s3"])
def out(request, tmp_path):
    if request.param == "local":
        return tmp_path / "out"
    return f"{request.getfixturevalue('s3').bucket()}/out"


def test_a_second_run_into_a_locked_out_is_refused_naming_the_holder(coco, out, tmp_path, capsys):
    cmd = [sys.executable, str(KILLING_RUN), "block", "120", *synth_args(coco, out, *EXTRA)]
    log = tmp_path / "holder.log"
    with open(log, "w") as fh:
        holder = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "blocking" not in log.read_text():  # the lock is taken before the first shard
            assert holder.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        lock = json.loads(fs.read_text(fs.join(out, "run.lock")))
        assert (lock["pid"], lock["host"]) == (holder.pid, socket.gethostname())
        start = time.monotonic()
        assert main(synth_args(coco, out, *EXTRA)) == 2
        seconds = time.monotonic() - start
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "is in use by a running synth" in err
        assert f"pid {holder.pid} on host {socket.gethostname()}, runner local" in err
        assert seconds < 5, f"refused after {seconds:.1f} s"
        assert json.loads(fs.read_text(fs.join(out, "run.lock"))) == lock  # left alone
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    # the holder is gone: the next run takes over its lock and makes every shard
    assert main(synth_args(coco, out, *EXTRA)) == 0
    assert f"pid {holder.pid}" in capsys.readouterr().err
    assert not fs.exists(fs.join(out, "run.lock"))
    manifest = json.loads(fs.read_text(fs.join(out, "manifest.json")))
    assert manifest["shards"] == 3 and manifest["shards_resumed"] == 0


@pytest.fixture
def local_ray(tmp_path):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    yield
    ray.shutdown()


def test_a_local_run_resumes_a_ray_run(coco, local_ray, tmp_path):
    clean, out = tmp_path / "clean", tmp_path / "out"
    assert main(synth_args(coco, clean, *EXTRA)) == 0
    ray = ("--runner", "ray", "--num-cpus", "1", "--no-dashboard")
    assert main(synth_args(coco, out, *EXTRA, *ray)) == 0
    for name in ("shard-000002.tar", "shard-000002_stats.json"):  # as if it stopped there
        (out / name).unlink()
    assert main(synth_args(coco, out, *EXTRA)) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runner"] == "local" and manifest["shards_resumed"] == 2
    assert [r["runner"] for r in manifest["runs"]] == ["ray", "local"]
    assert [r["shards_run"] for r in manifest["runs"]] == [3, 1]
    for name in ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar", "status.jsonl"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
