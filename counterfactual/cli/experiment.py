"""``counterfactual experiment``: the whole loop on the controlled world (world, synth, train
of a small dual encoder from scratch on D and on D ∪ D', eval), with results.json, a plot and
a Markdown table."""

from __future__ import annotations

import argparse
from pathlib import Path

from counterfactual.cli.common import nonnegative_int, positive_float, positive_int
from counterfactual.world.experiment import (
    IMAGE_METHODS,
    POLICIES,
    TEXT_METHODS,
    ExperimentConfig,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    d = ExperimentConfig.__dataclass_fields__
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
    p.add_argument(
        "--seeds",
        type=positive_int,
        default=d["seeds"].default,
        help="seeds S, S+1, ... (default: %(default)s)",
    )
    p.add_argument(
        "--seed",
        type=nonnegative_int,
        default=d["seed"].default,
        help="S: the world's, synth's and the first training seed (default: %(default)s)",
    )
    p.add_argument(
        "--cooccurrence",
        type=float,
        default=d["cooccurrence"].default,
        help="p(partner | anchor) in train, in [0.5, 1) (default: %(default)s)",
    )
    p.add_argument(
        "--steps",
        type=positive_int,
        default=d["steps"].default,
        help="training steps per arm (default: %(default)s)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=d["batch_size"].default,
        help="(default: %(default)s)",
    )
    p.add_argument(
        "--images",
        type=positive_int,
        default=d["images"].default,
        help="scenes in the world (default: %(default)s)",
    )
    p.add_argument(
        "--test",
        type=positive_int,
        default=d["test"].default,
        help="test scenes, the queries' source (default: %(default)s)",
    )
    p.add_argument(
        "--device", default=d["device"].default, help="torch device (default: %(default)s)"
    )
    p.add_argument(
        "--threads",
        type=positive_int,
        default=d["threads"].default,
        help="torch CPU threads (default: %(default)s)",
    )
    p.add_argument(
        "--text-method",
        choices=TEXT_METHODS,
        default=d["text_method"].default,
        help="synth's (default: %(default)s)",
    )
    p.add_argument(
        "--image-method",
        choices=IMAGE_METHODS,
        default=d["image_method"].default,
        help="synth's; inpaint is OpenCV's (default: %(default)s)",
    )
    p.add_argument(
        "--policy",
        choices=POLICIES,
        default=d["policy"].default,
        help="synth's plan policy on the train split (the queries: uniform) (default: %(default)s)",
    )
    r = p.add_mutually_exclusive_group()
    r.add_argument(
        "--ratio",
        type=positive_float,
        default=d["ratio"].default,
        help="D' drawn at this many per original sample (train --mix ratio) (default: %(default)s)",
    )
    r.add_argument(
        "--natural-ratio",
        dest="ratio",
        action="store_const",
        const=None,
        help="D' drawn at its natural ratio: as many as synth made (about 0.19 per original)",
    )
    p.add_argument(
        "--partner-contrast",
        type=positive_float,
        default=None,
        help="contrast of the partner classes in (0, 1] (default: the world's, 0.65): how hard "
        "the co-occurring object is to see",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from counterfactual.cli import main
    from counterfactual.world.experiment import run_experiment
    from counterfactual.world.results import table

    config = ExperimentConfig(
        seeds=args.seeds,
        seed=args.seed,
        cooccurrence=args.cooccurrence,
        steps=args.steps,
        batch_size=args.batch_size,
        images=args.images,
        test=args.test,
        device=args.device,
        threads=args.threads,
        text_method=args.text_method,
        image_method=args.image_method,
        policy=args.policy,
        ratio=args.ratio,
        partner_contrast=args.partner_contrast,
    )
    results = run_experiment(config, args.out, main)
    print(table(results))
    return 0
