"""``counterfactual synth --runner ray`` with a SIGKILL at a fixed point, for the resume tests.

    python killing_run.py driver N SYNTH_ARGS...   the driver kills itself once N shards are
                                                   committed and a worker is inside another
    python killing_run.py worker N SYNTH_ARGS...   the driver kills a shard worker once N
                                                   shards are back, then runs on
    python killing_run.py local N SYNTH_ARGS...    (--runner local) the process kills itself
                                                   inside the (N+1)-th shard, when its second
                                                   batch starts, with N shards committed
    python killing_run.py block S SYNTH_ARGS...    (--runner local) the first shard waits S
                                                   seconds before it starts (a live run that
                                                   holds OUT's lock)
    python killing_run.py slow S SYNTH_ARGS...     (--runner local) every batch but a shard's
                                                   first waits S seconds, after printing
                                                   "inside shard N" (its tar is open: a run
                                                   to signal, or whose shards outlast the
                                                   lock's heartbeat period)

A kill timed from outside races a fast run on a busy machine; this one lands where the test
says, every time. Only the point of the kill is hooked: the run is the real command.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil

import counterfactual.pipelines.synth as ray_synth  # the runner calls its map_unordered
from counterfactual.cli import main


def _kill_a_worker() -> None:
    """SIGKILL one shard worker of this run's Ray (its raylet's ``--gcs-address`` is the
    driver's), never one of another Ray on the same machine (a test running in parallel)."""
    import ray

    flag = f"--gcs-address={ray.get_runtime_context().gcs_address}"
    workers = []
    for p in psutil.process_iter(["cmdline"]):
        if not any("ShardWorker" in part for part in (p.info["cmdline"] or [])):
            continue
        with contextlib.suppress(psutil.Error):
            raylet = p.parent()
            if raylet is not None and any(flag in part.split() for part in raylet.cmdline()):
                workers.append(p)
    if not workers:
        sys.exit("no shard worker to kill")
    workers[0].send_signal(signal.SIGKILL)
    print(f"killed worker {workers[0].pid}", file=sys.stderr, flush=True)


def _hook(target: str, n: int, out: Path):
    run = ray_synth.map_unordered

    def hooked(workers, tasks, in_flight, *rest):
        for seen, done in enumerate(run(workers, tasks, in_flight, *rest), 1):
            yield done
            if target == "worker" and seen == n:
                _kill_a_worker()
            if target == "driver" and seen >= n:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # a worker is inside a shard
                    if any(out.glob("*.tmp")):
                        os.kill(os.getpid(), signal.SIGKILL)
                    time.sleep(0.005)

    return hooked


def _hook_local(target: str, n: int) -> None:
    """Wrap :meth:`ShardMaker.__call__`, which both runners use to make each shard."""
    from counterfactual.synth import tasks

    make = tasks.ShardMaker.__call__
    started = 0

    def hooked(self, task):
        nonlocal started
        started += 1
        if target == "block" and started == 1:
            print(f"blocking for {n} s", file=sys.stderr, flush=True)
            time.sleep(n)
        if target == "slow":
            process, calls = self.__dict__.setdefault("unslowed", self.process), 0

            def slow(batch):
                nonlocal calls
                calls += 1
                if calls >= 2:  # the first batch's samples are in the shard's open tar
                    print(f"inside shard {task.index}", file=sys.stderr, flush=True)
                    time.sleep(n)
                return process(batch)

            self.process = slow
        if target == "local" and started == n + 1:
            process, calls = self.process, 0

            def killing(batch):
                nonlocal calls
                calls += 1
                if calls == 2:  # the first batch's samples are in the shard's open tar
                    os.kill(os.getpid(), signal.SIGKILL)
                return process(batch)

            self.process = killing
        return make(self, task)

    tasks.ShardMaker.__call__ = hooked


if __name__ == "__main__":
    target, n, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if target in ("local", "block", "slow"):
        _hook_local(target, n)
    else:
        ray_synth.map_unordered = _hook(target, n, Path(argv[argv.index("--out") + 1]))
    sys.exit(main(argv))
