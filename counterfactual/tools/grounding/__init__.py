"""Grounding: box metrics and person grounding with masked names.

* :mod:`~counterfactual.tools.grounding.metrics` (Toloka VQA, Ustalov et al., 2023): IoU, AIoU,
  accuracy at IoU thresholds and Krippendorff's alpha with distance ``1 - IoU``. Boxes are
  ``xyxy`` pixels: ``(left, top, right, bottom)``.
* :mod:`~counterfactual.tools.grounding.intervals`: the paper's Table 1, 95% confidence intervals of
  image, box and question sizes per subset.
* :mod:`~counterfactual.tools.grounding.persons` (Luo et al., 2022, debiasing *Who's Waldo*):
  caption-context filters and the heuristic baselines of person grounding. Boxes are ``xywh``
  pixels: ``(x, y, width, height)`` with ``(x, y)`` the top-left corner.

Importing this package loads neither spaCy nor a model: :class:`CaptionFilter` takes a spaCy
pipeline loaded by the caller (e.g. :func:`counterfactual.text.nlp.load_spacy`).
"""

from counterfactual.tools.grounding.intervals import (
    TABLE1_COLUMNS,
    Interval,
    SubsetIntervals,
    format_table1,
    mean_interval,
    subset_intervals,
    table1_values,
)
from counterfactual.tools.grounding.metrics import (
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
from counterfactual.tools.grounding.persons import (
    FIRST_NAMES,
    NAME_TOKEN,
    CaptionFilter,
    DropReason,
    FilterConfig,
    FilterDecision,
    FilterSummary,
    Heuristic,
    HeuristicReport,
    MethodScore,
    NamedCaption,
    PersonBox,
    PersonSample,
    assign,
    box_order,
    count_correct,
    evaluate_heuristics,
    expected_random_correct,
    parse_sample,
    read_predictions,
    read_samples,
    substitute_names,
    summarize,
)

__all__ = [
    "FIRST_NAMES",
    "NAME_TOKEN",
    "TABLE1_COLUMNS",
    "Interval",
    "SubsetIntervals",
    "format_table1",
    "mean_interval",
    "subset_intervals",
    "table1_values",
    "AlignedBoxes",
    "CaptionFilter",
    "DropReason",
    "FilterConfig",
    "FilterDecision",
    "FilterSummary",
    "GroundingScores",
    "Heuristic",
    "HeuristicReport",
    "MethodScore",
    "NamedCaption",
    "PersonBox",
    "PersonSample",
    "TolokaFile",
    "TolokaRow",
    "TolokaScores",
    "align_boxes",
    "annotator_boxes",
    "assign",
    "box_order",
    "count_correct",
    "evaluate_heuristics",
    "expected_random_correct",
    "grounding_scores",
    "iou",
    "krippendorff_alpha_iou",
    "pairwise_iou",
    "parse_sample",
    "read_predictions",
    "read_samples",
    "read_toloka_csv",
    "score_toloka_files",
    "substitute_names",
    "summarize",
]
