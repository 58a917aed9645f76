"""Grounding metrics (Toloka VQA, Ustalov et al., 2023): IoU, AIoU, accuracy at IoU thresholds
and Krippendorff's alpha with distance ``1 - IoU``. Boxes are ``xyxy`` pixels throughout."""

from counterfactual.grounding.metrics import (
    AlignedBoxes,
    GroundingScores,
    TolokaFile,
    TolokaRow,
    TolokaScores,
    align_boxes,
    annotator_boxes,
    grounding_scores,
    iou,
    krippendorff_alpha_iou,
    pairwise_iou,
    read_toloka_csv,
    score_toloka_files,
)

__all__ = [
    "AlignedBoxes",
    "GroundingScores",
    "TolokaFile",
    "TolokaRow",
    "TolokaScores",
    "align_boxes",
    "annotator_boxes",
    "grounding_scores",
    "iou",
    "krippendorff_alpha_iou",
    "pairwise_iou",
    "read_toloka_csv",
    "score_toloka_files",
]
