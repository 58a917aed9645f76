"""The ``experiment`` section of ``make bench``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import Arg, Section, cli_env


def bench_experiment(work: Path, args: list[str]) -> dict[str, float]:
    """`counterfactual experiment --seeds 1` as a user runs it (a child process, the CLI's
    defaults unless ``args`` says otherwise): seconds in all and per stage, and the arms'
    ODmAP@1 on both query sets."""
    out = work / "experiment"
    command = [sys.executable, "-m", "counterfactual", "experiment", "--out", str(out)]
    start = time.perf_counter()
    subprocess.run([*command, "--seeds", "1", *args], check=True, env=cli_env())
    figures = {"experiment.seconds": time.perf_counter() - start}
    timings = json.loads((out / "timings.json").read_text())
    figures |= {f"experiment.seconds_{k}": v for k, v in timings.items()}
    results = json.loads((out / "results.json").read_text())
    for arm, name in (("D", "d"), ("D+D'", "d_dprime")):
        mean = results["arms"][arm]["mean"]
        figures[f"experiment.{name}_odmap1"] = mean["odmap@1"]
        figures[f"experiment.{name}_clean_odmap1"] = mean["clean_odmap@1"]
        figures[f"experiment.{name}_i2t_r1"] = mean["i2t_r@1"]
    return figures


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_experiment(work, args.experiment_args)


SECTION = Section(
    "experiment",
    run,
    args=(
        Arg(
            "--experiment-args",
            {
                "nargs": argparse.REMAINDER,
                "default": [],
                "help": "options for `counterfactual experiment` (last on the line)",
            },
        ),
    ),
    note="`counterfactual experiment --seeds 1` in a child process with the CLI's "
    "defaults (6,000 scenes of 48 px, 1,500 steps of 128 per arm, one torch thread, one DataLoader worker): "
    "seconds in all (imports included) and per stage (world: the dataset and D's shards; "
    "synth: D' and the queries; train: both arms; eval: both arms on both query sets); "
    "the arms' ODmAP@1 on the pipeline's queries and the clean renders, and i2t R@1. The "
    "issue's budget is 600 s for one seed of both arms on a 2-core machine.",
    max_targets={
        "experiment.seconds": 600,  # one seed of both arms on a 2-core machine
    },
)
