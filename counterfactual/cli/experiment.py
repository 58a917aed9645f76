"""``counterfactual experiment``: the whole loop on the controlled world (world, synth, train
of a small dual encoder from scratch on D and on D ∪ D', eval), with results.json, a plot and
a Markdown table."""

from __future__ import annotations

import argparse
from pathlib import Path

from counterfactual.cli.options import add_options, build
from counterfactual.options import declared
from counterfactual.world.experiment import ExperimentConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "experiment",
        help="the whole loop on the controlled world: does D ∪ D' lower a model's reliance on "
        "co-occurring objects?",
        description="Write the controlled world (counterfactual world), make D' from its train "
        "split and the ODmAP@k queries from its test split (counterfactual synth: alpha rules, "
        "an eraser without weights), render the queries again without the removed objects "
        "(clean renders), train a small CLIP-style dual encoder from scratch on D and on D ∪ D' "
        "(counterfactual train --recipe scratch: same steps, seed and initial weights) and "
        "evaluate both (counterfactual eval) on both query sets. Writes OUT/results.json, "
        "OUT/results.png and OUT/results.md; a rerun reuses the world, the synth runs and the "
        "trained arms it finds.",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    top = ("seeds", "seed", "cooccurrence", "steps", "batch_size", "images", "test", "device")
    add_options(p, declared(ExperimentConfig, *top))
    more = ("threads", "workers", "text_method", "image_method", "policy")
    add_options(p, declared(ExperimentConfig, *more))
    r = p.add_mutually_exclusive_group()
    add_options(r, declared(ExperimentConfig, "ratio"))
    r.add_argument(
        "--natural-ratio",
        dest="ratio",
        action="store_const",
        const=None,
        help="D' drawn at its natural ratio: as many as synth made (about 0.19 per original)",
    )
    add_options(p, declared(ExperimentConfig, "partner_contrast"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from counterfactual.cli import main
    from counterfactual.world.experiment import run_experiment
    from counterfactual.world.results import table

    config = build(ExperimentConfig, args)
    results = run_experiment(config, args.out, main)
    print(table(results))
    return 0
