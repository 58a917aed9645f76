"""``counterfactual experiment``: the whole loop on the controlled world (world, synth, train
of a small dual encoder from scratch on D and on D ∪ D', eval), with results.json, a plot and
a Markdown table."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from counterfactual.cli.common import OutFolder
from counterfactual.cli.options import add_options, build
from counterfactual.messages import short
from counterfactual.options import declare, declared
from counterfactual.world.experiment import ExperimentConfig


def _ratios(text: str) -> tuple[float, ...]:
    """``0,0.025,0.1``: numbers >= 0, comma-separated."""
    try:
        values = tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{short(text)} is not a comma-separated list of numbers"
        ) from None
    bad = [v for v in values if not 0 <= v < float("inf")]
    if bad:
        raise argparse.ArgumentTypeError(f"ratios must be finite numbers >= 0, got {bad[0]:g}")
    return values


def _names(text: str) -> tuple[str, ...]:
    """``inpaint,blur``: names, comma-separated (checked by the config)."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{short(text)} has an empty name")
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentOptions:
    """The options of ``counterfactual experiment`` besides :class:`ExperimentConfig`'s:
    ``--natural-ratio`` (its ``ratio`` unset) and the studies."""

    natural_ratio: None = declare(
        None,
        help="D' drawn at its natural ratio: as many as synth made (about 0.19 per original)",
        kind="const",
        dest="ratio",
    )
    ratios: tuple[float, ...] = declare(
        (),
        help="the ratio sweep: one D ∪ D'_sub arm per |D'_sub| / |D| (0: D alone), D'_sub a "
        "seeded subset of D' made with every caption rewritten, e.g. 0,0.025,0.05,0.1,0.2,0.4 "
        "(default: none, no sweep)",
        parse=_ratios,
        metavar="R,R,...",
    )
    image_methods: tuple[str, ...] = declare(
        (),
        help="the grid's image methods (inpaint, blur, zero, mean; default: --image-method)",
        parse=_names,
        metavar="M,M,...",
    )
    text_methods: tuple[str, ...] = declare(
        (),
        help="the grid's text methods (np-removal, prompt; default: --text-method); captioner: "
        "no trained captioning model offline",
        parse=_names,
        metavar="M,M,...",
    )


STUDIES = ("ratios", "image_methods", "text_methods")
"""The studies' options, which :class:`ExperimentConfig` takes as given."""


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
    add_options(p, declared(OutFolder))
    top = ("seeds", "seed", "cooccurrence", "steps", "batch_size", "images", "test", "device")
    add_options(p, declared(ExperimentConfig, *top))
    more = ("threads", "workers", "text_method", "image_method", "policy")
    add_options(p, declared(ExperimentConfig, *more))
    r = p.add_mutually_exclusive_group()
    add_options(r, declared(ExperimentConfig, "ratio"))
    add_options(r, declared(ExperimentOptions, "natural_ratio"))
    add_options(p, declared(ExperimentConfig, "partner_contrast", "caption_style"))
    s = p.add_argument_group(
        "studies",
        "the ratio sweep and the synthesis grid share the world, the queries and arm D; each "
        "adds one trained arm per seed and row (one arm of the defaults: about 3 minutes on 2 "
        "cores; reduce with --steps and --images)",
    )
    add_options(s, declared(ExperimentOptions, *STUDIES))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from counterfactual.world.experiment import run_experiment
    from counterfactual.world.results import table

    studies = {k: getattr(args, k) for k in ("ratios", "image_methods", "text_methods")}
    config = build(ExperimentConfig, args, **studies)
    results = run_experiment(config, args.out)
    print(table(results))
    return 0
