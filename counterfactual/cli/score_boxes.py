"""``counterfactual score-boxes``: AIoU, IoU>0.5, IoU>0.7 and Krippendorff's alpha of boxes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from counterfactual.grounding.metrics import score_toloka_files

EPILOG = """\
Files are CSV with the header of the Toloka VQA benchmark:
  image,width,height,left,top,right,bottom,question
boxes in xyxy pixels (left, top, right, bottom). Rows are matched by (image, question); every
truth row needs exactly one prediction row and vice versa. Annotator files may leave rows out.
Prints one JSON object: {"n", "aiou" (mean IoU x 100), "iou_gt_0.5", "iou_gt_0.7"} and, with
--annotators, "krippendorff_alpha" (distance 1 - IoU) and "annotators".
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
    parser.add_argument("--truth", required=True, metavar="TRUTH.csv", help="true boxes")
    parser.add_argument("--pred", required=True, metavar="PRED.csv", help="predicted boxes")
    parser.add_argument(
        "--annotators",
        nargs="+",
        default=[],
        metavar="A.csv",
        help="two or more annotators' box files for Krippendorff's alpha",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = score_toloka_files(args.truth, args.pred, args.annotators)
    print(json.dumps(result.as_dict(), indent=2))
    return 0
