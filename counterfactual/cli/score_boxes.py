"""``counterfactual score-boxes``: AIoU, IoU>0.5, IoU>0.7 and Krippendorff's alpha of boxes, or
with ``--intervals`` the 95% confidence intervals of Table 1 (Ustalov et al., 2023)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from counterfactual.cli.options import nonnegative_int, positive_float
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


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "score-boxes",
        help="score predicted boxes against true boxes (Toloka VQA metrics)",
        description="Score predicted boxes against true boxes: AIoU and accuracy at IoU > 0.5\n"
        "and IoU > 0.7, optionally Krippendorff's alpha between annotators.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--truth", metavar="TRUTH.csv", help="true boxes (required to score)")
    parser.add_argument("--pred", metavar="PRED.csv", help="predicted boxes (required to score)")
    parser.add_argument(
        "--annotators",
        nargs="+",
        default=[],
        metavar="A.csv",
        help="two or more annotators' box files for Krippendorff's alpha (default: none)",
    )
    table = parser.add_argument_group("Table 1 (descriptive statistics)")
    table.add_argument(
        "--intervals",
        nargs="+",
        default=[],
        metavar="SUBSET.csv",
        help="print the 95%% confidence intervals of Table 1 for these files instead of scores "
        "(default: none)",
    )
    table.add_argument(
        "--z",
        type=positive_float,
        default=Z_95,
        help=f"normal quantile of the intervals (default {Z_95}: 95%%)",
    )
    table.add_argument(
        "--digits",
        type=nonnegative_int,
        default=0,
        help="decimals of the printed bounds, rounded outwards (default 0, as the paper)",
    )
    table.add_argument("--json", action="store_true", help="exact intervals as JSON")
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
