"""A synth run ends gracefully on SIGINT, SIGTERM and SIGHUP, tried as processes: the real
command in a subprocess, the real signal sent once a shard is under way. It exits with 128 +
the signal's number after one line, leaves no lock, no temporary file and no unfinished
upload, records itself in the manifest's ``runs`` as interrupted, and the same command then
resumes and makes what an uninterrupted run makes. The lock's heartbeat is a timer: shards
that outlast its period keep it fresh, and a second driver is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual import fs
from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco
from counterfactual.synth.runlock import LockHeld, RunLock

pytestmark = pytest.mark.slow

KILLING_RUN = Path(__file__).with_name("killing_run.py")
ROOT = Path(__file__).resolve().parents[1]
EXTRA = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0")
LINE = "counterfactual synth: interrupted by {}; rerun the same command to resume"


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 12, seed=4, size=(320, 240))


@pytest.fixture(scope="module")
def clean(coco, tmp_path_factory):
    """An uninterrupted run, to compare the resumed ones with."""
    out = tmp_path_factory.mktemp("clean") / "out"
    assert main(synth_args(coco, out, *EXTRA, "--batch-size", "1")) == 0
    return out


def _env(**extra: str) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": pythonpath, **extra}


def _start(cmd: list[str], log: Path, **env: str) -> subprocess.Popen:
    with open(log, "w") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(**env))


def _wait_for(condition, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before the signal:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def _ended(proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the run did not end within {timeout:.0f} s of the signal")
    return code, log.read_text()


def _quiet(text: str) -> None:
    """Nothing but the run's own lines: no traceback, no Ray chatter or stack dump."""
    for bad in ("Traceback", "KeyboardInterrupt", "retries remaining", "PC: @", "(raylet)"):
        assert bad not in text, text


def _temporary(out) -> list[str]:
    return [name for name in fs.listdir(out) if name.endswith(".tmp")]


def _interrupted_runs(out) -> list[str | None]:
    runs = json.loads(fs.read_text(fs.join(out, "manifest.json")))["runs"]
    return [run.get("interrupted") for run in runs]


def _same_as_clean(out: Path, clean: Path) -> None:
    for name in ("status.jsonl", *sorted(p.name for p in clean.glob("shard-*.tar"))):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_local_run_ends_gracefully_on_a_signal_and_resumes(coco, clean, name, tmp_path):
    out, log = tmp_path / "out", tmp_path / "run.log"
    args = synth_args(coco, out, *EXTRA, "--batch-size", "1")
    proc = _start([sys.executable, str(KILLING_RUN), "slow", "60", *args], log)
    # inside a shard whose tar is open under its temporary name, its first batch written
    _wait_for(lambda: "inside shard" in log.read_text() and _temporary(out), proc, log)
    os.kill(proc.pid, getattr(signal, name))
    code, text = _ended(proc, log, timeout=30)
    assert code == 128 + getattr(signal, name)
    after = text.split("inside shard", 1)[1].splitlines()[1:]
    assert after == [LINE.format(name)], text  # one line, and it is the last
    _quiet(text)
    assert not (out / "run.lock").exists()
    assert _temporary(out) == []
    assert _interrupted_runs(out) == [name]
    committed = len(list(out.glob("shard-*_stats.json")))  # those before the open one
    # the same command resumes
    assert main(args) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards_resumed"] == committed
    assert _interrupted_runs(out) == [name, None]
    _same_as_clean(out, clean)


def test_a_local_run_into_s3_ends_gracefully_on_sigterm(coco, s3, tmp_path):
    out, log = f"{s3.bucket()}/out", tmp_path / "run.log"
    args = synth_args(coco, out, *EXTRA, "--batch-size", "1")
    proc = _start([sys.executable, str(KILLING_RUN), "slow", "60", *args], log)
    _wait_for(lambda: "inside shard" in log.read_text(), proc, log)
    os.kill(proc.pid, signal.SIGTERM)
    code, text = _ended(proc, log, timeout=60)
    assert code == 143 and text.rstrip().endswith(LINE.format("SIGTERM")), text
    _quiet(text)
    assert not fs.exists(fs.join(out, "run.lock"))
    assert _interrupted_runs(out) == ["SIGTERM"]
    bucket = out.removeprefix("s3://").split("/")[0]
    assert s3._fs().call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", []) == []
    assert main(args) == 0
    assert _interrupted_runs(out) == ["SIGTERM", None]


def test_a_rerun_aborts_the_unfinished_uploads_of_its_shards_only(coco, s3):
    """A writer killed mid-upload (SIGKILL, a lost node) leaves a multipart upload that S3
    keeps, and bills, until aborted: the rerun aborts those of its own shard names."""
    bucket = s3.bucket()
    out = f"{bucket}/out"
    store = s3._fs()
    name = bucket.removeprefix("s3://")
    for key in ("out/shard-000001.tar", "out/notes.bin", "out/more/shard-000001.tar"):
        upload = store.call_s3("create_multipart_upload", Bucket=name, Key=key)
        store.call_s3(
            "upload_part",
            Bucket=name,
            Key=key,
            UploadId=upload["UploadId"],
            PartNumber=1,
            Body=b"x" * 1024,
        )
    assert main(synth_args(coco, out, *EXTRA)) == 0
    left = store.call_s3("list_multipart_uploads", Bucket=name).get("Uploads", [])
    assert sorted(u["Key"] for u in left) == ["out/more/shard-000001.tar", "out/notes.bin"]


@pytest.fixture
def no_ray_left():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    yield


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_ray_run_ends_gracefully_on_a_signal_and_resumes(
    coco, clean, name, tmp_path, no_ray_left
):
    out, log = tmp_path / "out", tmp_path / "run.log"
    ray = ("--runner", "ray", "--num-cpus", "1", "--no-dashboard", "--batch-size", "1")
    args = synth_args(coco, out, *EXTRA, *ray)
    tmp = Path(tempfile.mkdtemp(prefix="cft-", dir="/tmp"))  # short enough for Ray's sockets
    proc = _start([sys.executable, "-m", "counterfactual", *args], log, TMPDIR=str(tmp))
    _wait_for(lambda: any(out.glob("shard-*_stats.json")), proc, log)
    os.kill(proc.pid, getattr(signal, name))
    code, text = _ended(proc, log)
    left = os.listdir(tmp)
    shutil.rmtree(tmp, ignore_errors=True)
    assert left == [], left  # Ray's session folder was there, and is gone
    assert code == 128 + getattr(signal, name), text
    assert text.rstrip().splitlines()[-1] == LINE.format(name), text
    assert text.count("interrupted by") == 1
    _quiet(text)
    assert not (out / "run.lock").exists()
    assert _temporary(out) == []
    assert _interrupted_runs(out) == [name]
    assert main(synth_args(coco, out, *EXTRA, "--batch-size", "1")) == 0  # resumed locally
    assert _interrupted_runs(out) == [name, None]
    _same_as_clean(out, clean)


_SECOND = """
import os, signal, sys, time
from counterfactual.synth import signals
with signals.watch():
    try:
        print("ready", flush=True)
        time.sleep(60)
    except signals.Interrupted:
        print("cleaning up", flush=True)
        time.sleep(60)  # a cleanup that takes long: a second signal must not wait for it
        print("cleaned up", flush=True)
        raise
"""


def test_a_second_sigint_exits_at_once(tmp_path):
    log = tmp_path / "run.log"
    proc = _start([sys.executable, "-c", _SECOND], log)
    _wait_for(lambda: "ready" in log.read_text(), proc, log, timeout=30)
    os.kill(proc.pid, signal.SIGINT)
    _wait_for(lambda: "cleaning up" in log.read_text(), proc, log, timeout=30)
    start = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    code, text = _ended(proc, log, timeout=30)
    assert time.monotonic() - start < 10
    assert code == 130 and "cleaned up" not in text
    assert text.rstrip().splitlines()[-1] == LINE.format("SIGINT").split(": ", 1)[1]


def test_the_heartbeat_keeps_a_slow_run_alive_and_a_second_driver_out(coco, tmp_path):
    """Shards that take longer than the stale period (2 s here, 600 by default): the timer
    rewrites the heartbeat meanwhile, so another host's driver is refused, not let in."""
    out, log = tmp_path / "out", tmp_path / "run.log"
    args = synth_args(coco, out, *EXTRA, "--batch-size", "1")
    env = {"COUNTERFACTUAL_LOCK_STALE_AFTER": "2"}
    proc = _start([sys.executable, str(KILLING_RUN), "slow", "60", *args], log, **env)
    try:
        _wait_for(lambda: "inside shard" in log.read_text(), proc, log)
        first = json.loads((out / "run.lock").read_text())
        time.sleep(3)  # longer than the stale period; the shard is still asleep meanwhile
        assert proc.poll() is None
        assert log.read_text().count("inside shard") == 1
        now = json.loads((out / "run.lock").read_text())
        assert now["token"] == first["token"] and now["heartbeat"] > first["heartbeat"]
        elsewhere = RunLock(out, runner="local", stale_after=2)
        elsewhere.host = f"not-{socket.gethostname()}"  # judged by its heartbeat alone
        with pytest.raises(LockHeld, match="is in use by a running synth"):
            elsewhere.acquire()
        assert json.loads((out / "run.lock").read_text())["token"] == first["token"]
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code, text = _ended(proc, log, timeout=30)
    assert code == 143, text
