"""``OUT/run.lock``: one run per output folder, stale locks taken over, foreign locks kept."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from counterfactual import fs
from counterfactual.synth import runlock
from counterfactual.synth.runlock import LockHeld, LockLost, RunLock

HOST = socket.gethostname()
T0 = 1_795_460_400.0  # 2026-11-23T19:00:00Z
LINUX_PROC = Path("/proc/self/stat").exists()


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def lock_record(pid: int, *, host: str = HOST, heartbeat: str = "2026-11-23T19:00:00Z") -> dict:
    return {
        "host": host,
        "pid": pid,
        "pid_start": None,
        "runner": "ray",
        "started": "2026-11-23T19:00:00Z",
        "heartbeat": heartbeat,
        "token": uuid.uuid4().hex,
        "command": "counterfactual synth --out x",
    }


def write_lock(out: Path | str, record: dict) -> None:
    fs.write_text(fs.join(out, "run.lock"), json.dumps(record))


def read_lock(out: Path | str) -> dict:
    return json.loads(fs.read_text(fs.join(out, "run.lock")))


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_acquire_writes_the_lock_and_release_removes_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with RunLock(out, runner="local", clock=FakeClock()) as lock:
        record = read_lock(out)
        assert record["host"] == HOST
        assert record["pid"] == os.getpid()
        assert record["runner"] == "local"
        assert record["started"] == record["heartbeat"] == "2026-11-23T19:00:00Z"
        assert record["token"] == lock.token
        assert isinstance(record["command"], str)
        assert lock.took_over is None and lock.message is None
        assert [p.name for p in out.iterdir()] == ["run.lock"]  # no temporary left
    assert not (out / "run.lock").exists()


def test_a_second_run_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    with RunLock(tmp_path, runner="ray"):
        with pytest.raises(LockHeld, match=f"pid {os.getpid()} on host {HOST}, runner ray"):
            RunLock(tmp_path, runner="local").acquire()
        assert (tmp_path / "run.lock").exists()


def test_refused_while_a_live_process_holds_it(tmp_path: Path) -> None:
    child = sleeper()
    try:
        record = lock_record(child.pid)
        if LINUX_PROC:
            record["pid_start"] = runlock._proc_stat(child.pid)[1]
        write_lock(tmp_path, record)
        lock = RunLock(tmp_path, runner="local")
        with pytest.raises(LockHeld) as info:
            lock.acquire()
        assert str(info.value) == (
            f"{tmp_path} is in use by a running synth (pid {child.pid} on host {HOST}, runner "
            "ray, since 2026-11-23T19:00:00Z); wait for it to end, or use another --out"
        )
        assert isinstance(info.value, ValueError)
        assert read_lock(tmp_path) == record  # untouched
        assert not lock.held
    finally:
        child.kill()
        child.wait()


def test_lock_of_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    child = sleeper()
    child.kill()
    child.wait()  # reaped: its pid names no process
    old = lock_record(child.pid)
    write_lock(tmp_path, old)
    lock = RunLock(tmp_path, runner="local")
    assert lock.acquire() == old
    assert lock.took_over == old
    assert lock.message is not None and f"pid {child.pid} on host {HOST}" in lock.message
    assert read_lock(tmp_path)["token"] == lock.token
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.lock"]
    lock.release()


@pytest.mark.skipif(not LINUX_PROC, reason="zombies are seen through /proc")
def test_lock_of_a_zombie_is_taken_over(tmp_path: Path) -> None:
    child = sleeper()
    try:
        os.kill(child.pid, signal.SIGKILL)
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        assert runlock._proc_stat(child.pid)[0] == "Z"
        write_lock(tmp_path, lock_record(child.pid))
        with RunLock(tmp_path, runner="local") as lock:
            assert lock.took_over is not None and lock.took_over["pid"] == child.pid
    finally:
        child.wait()


@pytest.mark.skipif(not LINUX_PROC, reason="process start times come from /proc")
def test_a_reused_pid_does_not_keep_a_lock_alive(tmp_path: Path) -> None:
    record = lock_record(os.getpid())  # a live pid, but another process's start time
    record["pid_start"] = runlock._proc_stat(os.getpid())[1] - 1
    write_lock(tmp_path, record)
    with RunLock(tmp_path, runner="local") as lock:
        assert lock.took_over == record


def test_another_hosts_lock_lives_while_its_heartbeat_is_fresh(tmp_path: Path) -> None:
    record = lock_record(1, host="other-node", heartbeat="2026-11-23T19:00:00Z")
    write_lock(tmp_path, record)
    clock = FakeClock(T0 + 600)  # exactly stale_after old: still alive
    with pytest.raises(LockHeld, match="on host other-node") as info:
        RunLock(tmp_path, runner="ray", clock=clock, stale_after=600).acquire()
    assert "heartbeat, now 2026-11-23T19:00:00Z, is 600 s old" in str(info.value)
    clock.now = T0 + 601
    with RunLock(tmp_path, runner="ray", clock=clock, stale_after=600) as lock:
        assert lock.took_over == record
        assert read_lock(tmp_path)["host"] == HOST


def test_heartbeat_rewrites_the_time(tmp_path: Path) -> None:
    clock = FakeClock()
    with RunLock(tmp_path, runner="ray", clock=clock, stale_after=600) as lock:
        clock.now = T0 + 149
        assert lock.heartbeat_if_due() is False
        clock.now = T0 + 150  # a quarter of stale_after
        assert lock.heartbeat_if_due() is True
        record = read_lock(tmp_path)
        assert record["heartbeat"] == "2026-11-23T19:02:30Z"
        assert record["started"] == "2026-11-23T19:00:00Z"
        clock.now = T0 + 200
        lock.heartbeat()
        assert read_lock(tmp_path)["heartbeat"] == "2026-11-23T19:03:20Z"


def test_release_keeps_a_foreign_lock(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, runner="ray")
    lock.acquire()
    foreign = lock_record(12345, host="other-node")  # another driver took it over
    write_lock(tmp_path, foreign)
    with pytest.raises(LockLost, match="now held by pid 12345 on host other-node"):
        lock.heartbeat()
    assert lock.release() is False
    assert read_lock(tmp_path) == foreign
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.lock"]


def test_removal_checks_the_token(tmp_path: Path) -> None:
    record = lock_record(1)
    write_lock(tmp_path, record)
    lock = RunLock(tmp_path, runner="ray")
    assert lock._remove_if("not-its-token") is False
    assert read_lock(tmp_path) == record
    assert lock._remove_if(record["token"]) is True
    assert not (tmp_path / "run.lock").exists()


def test_a_file_that_is_not_a_lock_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run.lock").write_text("hello")
    with pytest.raises(LockHeld, match="is not a run lock"):
        RunLock(tmp_path, runner="ray").acquire()


def test_only_one_of_many_creators_wins(tmp_path: Path) -> None:
    path = tmp_path / "run.lock"
    barrier = threading.Barrier(8)
    won: list[int] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            runlock._create_local(path, f"{i}".encode())
        except FileExistsError:
            return
        won.append(i)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert path.read_text() == str(won[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.lock"]


@pytest.mark.parametrize("kwargs", [{"runner": ""}, {"runner": "ray", "stale_after": 0}])
def test_bad_configuration(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RunLock(tmp_path, **kwargs)


def test_on_a_url_without_conditional_writes(tmp_path: Path) -> None:
    out = f"memory://runlock-{uuid.uuid4().hex}/out"
    clock = FakeClock()
    with RunLock(out, runner="ray", clock=clock) as lock:
        assert read_lock(out)["token"] == lock.token
        with pytest.raises(LockHeld, match=f"{out} is in use"):
            RunLock(out, runner="ray", clock=clock).acquire()
    assert not fs.exists(fs.join(out, "run.lock"))


def test_on_s3(s3) -> None:  # noqa: ANN001 - the tests/s3server.py fixture
    out = s3.bucket() + "/out"
    clock = FakeClock()
    with RunLock(out, runner="ray", clock=clock) as lock:
        with pytest.raises(FileExistsError):  # the conditional put refuses a second lock
            lock._create(b"{}")
        with pytest.raises(LockHeld, match=f"{out} is in use"):
            RunLock(out, runner="ray", clock=clock).acquire()
        clock.now += 60
        lock.heartbeat()
        assert read_lock(out)["heartbeat"] == "2026-11-23T19:01:00Z"
    assert not fs.exists(fs.join(out, "run.lock"))
    stale = lock_record(1, host="other-node")
    write_lock(out, stale)
    clock.now += 601
    with RunLock(out, runner="ray", clock=clock) as lock:
        assert lock.took_over == stale


def test_a_full_disk_while_taking_the_lock_is_the_disk_full_error(tmp_path, monkeypatch):
    import errno

    from counterfactual.fs import OutputError

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OutputError) as err, RunLock(tmp_path, runner="local"):
        pass
    assert str(err.value).startswith(f"disk full while writing {tmp_path / 'run.lock'}")
    assert list(tmp_path.iterdir()) == []  # no temporary file left


def test_a_create_whose_answer_was_lost_is_our_lock(tmp_path, monkeypatch):
    """A conditional put that landed but whose answer timed out is retried and refused (the
    object exists): the lock found is this run's own, so the run holds it, not refuses itself."""
    create = RunLock._create

    def lost_answer(self, data):
        create(self, data)
        raise FileExistsError(str(self.path))  # the retry, refused

    monkeypatch.setattr(RunLock, "_create", lost_answer)
    lock = RunLock(tmp_path, runner="local")
    assert lock.acquire() is None and lock.held
    assert json.loads((tmp_path / "run.lock").read_text())["token"] == lock.token
    assert lock.release() and not (tmp_path / "run.lock").exists()


def test_the_heartbeat_timer_beats_without_being_asked(tmp_path):
    clock = [1_000_000.0]
    lock = RunLock(tmp_path, runner="local", clock=lambda: clock[0], stale_after=0.2)
    lock.acquire()
    first = json.loads((tmp_path / "run.lock").read_text())["heartbeat"]
    clock[0] += 60
    lock.start_heartbeat()
    deadline = time.monotonic() + 10
    while json.loads((tmp_path / "run.lock").read_text())["heartbeat"] == first:
        assert time.monotonic() < deadline, "no beat in 10 s (every 0.05 s asked)"
        time.sleep(0.01)
    (tmp_path / "run.lock").unlink()  # another driver's doing: the timer notices
    deadline = time.monotonic() + 10
    while lock.lost is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(LockLost):
        lock.check()
    assert not lock.release()
