"""The ``select-cli`` section of ``make bench``."""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

from common import ROOT, Section, coco_statistics_json, seconds_of


def _children_cpu() -> float:
    """User + sys seconds of this process's finished children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_select_cli(work: Path, small: int = 20_000, large: int = 100_000) -> dict[str, float]:
    """``counterfactual select`` as a user runs it: the CLI in a child process (default
    workers), on a ``small`` and a ``large`` file at COCO statistics, for each policy; the
    marginal rate ``(large - small) / (t_large - t_small)`` leaves start-up (imports, process
    launch) out. Runs alternate sizes and policies; best of 3 each. The CPU time (user + sys
    of the child and its workers) is measured too: on a shared machine it moves much less
    than the wall clock."""
    files = {n: coco_statistics_json(work / "select-cli" / f"{n}.json", n) for n in (small, large)}
    out = work / "select-cli" / "plans.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    best: dict[tuple[str, int], float] = {}
    best_cpu: dict[tuple[str, int], float] = {}
    for _ in range(3):
        for policy in ("uniform", "all"):
            for n, path in files.items():
                argv = [sys.executable, "-m", "counterfactual", "select", "--annotations"]
                argv += [str(path), "--policy", policy, "--out", str(out)]
                before = _children_cpu()
                seconds = seconds_of(
                    lambda argv=argv: subprocess.run(argv, env=env, check=True, capture_output=True)
                )
                cpu = _children_cpu() - before
                best[(policy, n)] = min(best.get((policy, n), math.inf), seconds)
                best_cpu[(policy, n)] = min(best_cpu.get((policy, n), math.inf), cpu)
    figures = {"select_cli_small_images": float(small), "select_cli_large_images": float(large)}
    for policy in ("uniform", "all"):
        extra = best[(policy, large)] - best[(policy, small)]
        figures[f"select_cli_{policy}_marginal_images_per_s"] = (large - small) / extra
        figures[f"select_cli_{policy}_large_seconds"] = best[(policy, large)]
        extra_cpu = best_cpu[(policy, large)] - best_cpu[(policy, small)]
        figures[f"select_cli_{policy}_marginal_cpu_us_per_image"] = (
            extra_cpu / (large - small) * 1e6
        )
    figures["select_cli_load_average"] = os.getloadavg()[0]
    return figures


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_select_cli(work)


SECTION = Section(
    "select-cli",
    run,
    args=(),
    note="`counterfactual select` as a user runs it: the CLI in a child process with its default "
    "workers (one per usable core), on files of select_cli_small_images and "
    "select_cli_large_images images at generate_coco's statistics, each policy; "
    "*_marginal_images_per_s = extra images / extra seconds between the two sizes, so "
    "start-up (interpreter, imports, process launch) is left out. Best of 3, alternated. "
    "*_marginal_cpu_us_per_image: the same difference in CPU time (user + sys of the child "
    "and its workers) per extra image, which a loaded machine moves much less than the "
    "wall clock; load_average: the 1-minute load when the section ended.",
    targets={
        "select_cli_uniform_marginal_images_per_s": 20_000,
        "select_cli_all_marginal_images_per_s": 20_000,
    },
)
