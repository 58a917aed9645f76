"""``counterfactual score-boxes``: AIoU, IoU>0.5, IoU>0.7 and Krippendorff's alpha of boxes, or
with ``--intervals`` the 95% confidence intervals of Table 1 (Ustalov et al., 2023)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.tools.grounding.intervals import Z_95, format_table1, subset_intervals
from counterfactual.tools.grounding.metrics import score_toloka_files

EPILOG = """\
Files are CSV with the header of the Toloka VQA benchmark:
  image,width,height,left,top,right,bottom,question
boxes in xyxy pixels (left, top, right, bottom). Rows are matched by (image, question); every
truth row needs exactly one prediction row and vice versa. Annotator files may leave rows out.
Prints one JSON object: {"n", "aiou" (mean IoU x 100), "iou_gt_0.5", "iou_gt_0.7"} and, with
--annotators, "krippendorff_alpha" (distance 1 - IoU) and "annotators".

--intervals SUBSET.csv ... prints Table 1 of the paper instead (no --truth/--pred): per file, the
number of rows and the interval mean +- z * sd / sqrt(n) (sd over n - 1, z = 1.96) of image
width and height, box width (right - left) and height (bottom - top) and question length in
characters, bounds rounded outwards to --digits decimals as the paper prints them (0: whole
numbers); with --json, exact means, sds and bounds as JSON.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScoreBoxesOptions:
    """``counterfactual score-boxes``'s options: the files to score, and Table 1's."""

    truth: str | None = declare(None, help="true boxes (required to score)", metavar="TRUTH.csv")
    pred: str | None = declare(None, help="predicted boxes (required to score)", metavar="PRED.csv")
    annotators: list[str] = declare(
        [],
        help="two or more annotators' box files for Krippendorff's alpha (default: none)",
        nargs="+",
        metavar="A.csv",
    )
    intervals: list[str] = declare(
        [],
        help="print the 95%% confidence intervals of Table 1 for these files instead of scores "
        "(default: none)",
        nargs="+",
        metavar="SUBSET.csv",
    )
    z: float = declare(
        Z_95,
        help=f"normal quantile of the intervals (default {Z_95}: 95%%)",
        kind="positive_float",
    )
    digits: int = declare(
        0,
        help="decimals of the printed bounds, rounded outwards (default 0, as the paper)",
        kind="nonnegative_int",
    )
    json: bool = declare(False, help="exact intervals as JSON", kind="flag")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "score-boxes",
        help="score predicted boxes against true boxes (Toloka VQA metrics)",
        description="Score predicted boxes against true boxes: AIoU and accuracy at IoU > 0.5\n"
        "and IoU > 0.7, optionally Krippendorff's alpha between annotators.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, declared(ScoreBoxesOptions, "truth", "pred", "annotators"))
    table = parser.add_argument_group("Table 1 (descriptive statistics)")
    add_options(table, declared(ScoreBoxesOptions, "intervals", "z", "digits", "json"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.intervals:
        given = [name for name in ("truth", "pred", "annotators") if getattr(args, name)]
        if given:
            raise ValueError(f"--intervals takes no --{given[0]}: it describes files, not scores")
        rows = [subset_intervals(path, args.z) for path in args.intervals]
        if args.json:
            print(json.dumps([row.as_dict() for row in rows], indent=2))
        else:
            print(format_table1(rows, args.digits))
        return 0
    if args.truth is None or args.pred is None:
        raise ValueError("score-boxes needs --truth and --pred (or --intervals FILE...)")
    result = score_toloka_files(args.truth, args.pred, args.annotators)
    print(json.dumps(result.as_dict(), indent=2))
    return 0
