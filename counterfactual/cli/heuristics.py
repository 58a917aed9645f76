"""``counterfactual heuristics``: heuristic baselines for person grounding with masked names."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactual.cli.filter_captions import INPUT_FORMAT
from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.tools.grounding.persons import (
    evaluate_heuristics,
    read_predictions,
    read_samples,
)

EPILOG = (
    INPUT_FORMAT
    + """
--pred: JSON Lines {"id": ..., "pred": {"<person id>": box index}} from a model; samples it
leaves out score as wrong, ids not in --input are ignored.

The persons, in caption order of first mention, take boxes one each in the order of
  random          a seeded random permutation (--seed)
  big_to_small    decreasing area w*h
  lr_all          increasing upper-left x, all boxes
  lr_largest      increasing upper-left x over the d = min(#boxes, #persons) largest boxes
                  (the paper writes max, but the max(#boxes, #names) largest boxes are all
                  boxes, which would repeat lr_all; its Table 2 shows the two differ)
Accuracy = correct true links / all true links. Δr = accuracy - Random accuracy; Δh =
accuracy - best heuristic accuracy (shown for the best heuristic and --pred only), as in
Table 2 of Luo et al. (2022). --format json gives fractions; table gives percent.
"""
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeuristicsOptions:
    """``counterfactual heuristics``'s options."""

    input: str = declare(help="samples with truth", metavar="IN.jsonl")
    pred: str | None = declare(
        None, help="model predictions (default: the heuristics only)", metavar="PRED.jsonl"
    )
    seed: int = declare(0, help="seed of the Random row (default 0)", kind="nonnegative_int")
    format: str = declare("table", help="output (default: table)", choices=("table", "json"))


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "heuristics",
        help="accuracy of the Random, Big->Small and L->R heuristic baselines (and a model)",
        description="Heuristic baselines for person grounding with masked names: accuracy, "
        "gain over random and gain over the best heuristic (Luo et al., 2022, Table 2).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, declared(HeuristicsOptions))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    samples = read_samples(args.input)
    predictions = read_predictions(args.pred) if args.pred else None
    label = Path(args.pred).stem if args.pred else "predictions"
    report = evaluate_heuristics(samples, args.seed, predictions, prediction_label=label)
    if args.format == "json":
        print(json.dumps(report.as_dict(), indent=2, ensure_ascii=False))
    else:
        print(report.table())
    return 0
