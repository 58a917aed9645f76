"""A run whose ``run.lock`` is taken over by another driver or removed while it works stops with
one line and exit code 2 as soon as its heartbeat timer sees it, inside a shard, tried as a
process (the real command, the lock changed under it): no traceback, none of its temporary files left, the other holder's lock and the folder's records
left alone; the same command then resumes and makes what an undisturbed run makes."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
from bad_coco import synth_args
from test_signals_cli import EXTRA, KILLING_RUN, _ended, _quiet, _start, _wait_for

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 9, seed=4, size=(320, 240))


@pytest.fixture(scope="module")
def clean(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("clean") / "out"
    assert main(synth_args(coco, out, *EXTRA, "--batch-size", "1")) == 0
    return out


@pytest.mark.parametrize("how", ["taken", "removed"])
def test_a_lost_lock_ends_the_run_with_one_line(coco, clean, tmp_path, capsys, how):
    out, log = tmp_path / "out", tmp_path / "run.log"
    args = synth_args(coco, out, *EXTRA, "--batch-size", "1")
    # every batch after a shard's first waits 2 s; the heartbeat looks every 0.5 s
    env = {"COUNTERFACTUAL_LOCK_STALE_AFTER": "2"}
    proc = _start([sys.executable, str(KILLING_RUN), "slow", "2", *args], log, **env)
    try:
        _wait_for(lambda: "inside shard 0" in log.read_text(), proc, log)
    except BaseException:
        proc.kill()
        raise
    lock = out / "run.lock"
    ours = json.loads(lock.read_text())
    other = {**ours, "host": f"not-{socket.gethostname()}", "pid": 12345, "token": "f" * 32}
    if how == "taken":
        lock.write_text(json.dumps(other))
    else:
        lock.unlink()
    code, text = _ended(proc, log, timeout=90)
    assert code == 2, text
    _quiet(text)
    last = text.rstrip().splitlines()[-1]
    who = f"now held by pid 12345 on host not-{socket.gethostname()}" if how == "taken" else ""
    assert last.startswith(f"counterfactual synth: error: {lock} was {who or 'removed'}"), text
    assert last.endswith(
        "this run stopped (its shards so far are kept; rerun the same command to resume once "
        "no other run writes there)"
    )
    assert not list(out.glob("*.tmp"))  # its own temporary files removed
    # it stopped at once, inside its first shard (4 s long), not when the shard ended
    assert not list(out.glob("shard-*_stats.json")), text
    assert not (out / "manifest.json").exists() and not (out / "status.jsonl").exists()
    if how == "taken":  # the other holder's lock stays
        assert json.loads(lock.read_text())["token"] == "f" * 32
        lock.unlink()  # that run is gone: the same command resumes
    else:
        assert not lock.exists()
    capsys.readouterr()
    assert main(args) == 0
    assert "from an earlier run" in capsys.readouterr().out
    for name in ("status.jsonl", *sorted(p.name for p in clean.glob("shard-*.tar"))):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    assert not list(Path(out).glob("*.tmp"))
