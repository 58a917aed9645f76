"""``counterfactual synth --runner ray`` with a SIGKILL at a fixed point, for the resume tests.

    python killing_run.py driver N SYNTH_ARGS...   the driver kills itself once N shards are
                                                   committed and an item of the next is written
    python killing_run.py worker N SYNTH_ARGS...   the driver kills a CPU-stage worker when its
                                                   first N items are back, then runs on

A kill timed from outside races a fast run on a busy machine; this one lands where the test
says, every time. Only the point of the kill is hooked: the run is the real command.
"""

from __future__ import annotations

import os
import signal
import sys

import psutil

import pipelines.synth as ray_synth
from counterfactual.cli import main


def _kill_a_worker() -> None:
    workers = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any("MapBatches(CpuSteps)" in part for part in (p.info["cmdline"] or []))
    ]
    if not workers:
        sys.exit("no CPU stage worker to kill")
    workers[0].send_signal(signal.SIGKILL)
    print(f"killed worker {workers[0].pid}", file=sys.stderr, flush=True)


def _hook(target: str, n: int):
    deliver = ray_synth.deliver
    seen = 0

    def hooked(assembler, finished):
        nonlocal seen
        done = []
        for item in finished:  # one at a time, so the kill can land inside a shard
            done += deliver(assembler, [item])
            seen += 1
            if target == "driver" and len(assembler.committed) >= n and assembler.pending:
                if any(assembler.out_dir.glob("*.tmp")):
                    os.kill(os.getpid(), signal.SIGKILL)
            if target == "worker" and seen == n:
                _kill_a_worker()
        return done

    return hooked


if __name__ == "__main__":
    target, n, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    ray_synth.deliver = _hook(target, n)
    sys.exit(main(argv))
