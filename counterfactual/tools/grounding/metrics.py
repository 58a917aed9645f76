"""Box-grounding metrics of the Toloka VQA benchmark (Ustalov et al., 2023, section 5).

All boxes are ``xyxy`` in image pixels: ``(left, top, right, bottom)`` with ``right >= left``
and ``bottom >= top``, as ``float64`` arrays of shape ``(N, 4)``. IoU uses the continuous
convention, area = ``(right - left) * (bottom - top)``; it reproduces the paper's crowd baseline
on the private test (AIoU 87.154, IoU>0.5 0.954, IoU>0.7 0.914), while the inclusive
"+1 pixel" convention would give 87.419 / 0.956 / 0.918.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

TOLOKA_COLUMNS = ("image", "width", "height", "left", "top", "right", "bottom", "question")

_PAIRWISE_CHUNK = 4_000_000
"""Most IoU values held at once while summing all pairs for Krippendorff's alpha."""


def _as_boxes(boxes: ArrayLike, name: str) -> np.ndarray:
    """``boxes`` as a validated ``(N, 4)`` float64 array."""
    array = np.asarray(boxes, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f"{name} must have shape (N, 4) (xyxy boxes), got {array.shape}")
    bad = ~np.isfinite(array).all(axis=1)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name} row {row} has a non-finite coordinate: {array[row].tolist()}")
    inverted = (array[:, 2] < array[:, 0]) | (array[:, 3] < array[:, 1])
    if inverted.any():
        row = int(np.flatnonzero(inverted)[0])
        raise ValueError(
            f"{name} row {row} is not xyxy (right < left or bottom < top): {array[row].tolist()}"
        )
    return array


def _area(boxes: np.ndarray) -> np.ndarray:
    return (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])


def _iou_broadcast(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of validated boxes ``a[..., 4]`` and ``b[..., 4]`` under numpy broadcasting.

    Two boxes whose union has zero area (both degenerate) score 1 when identical, else 0.
    """
    inter_w = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    inter_h = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = inter_w * inter_h
    union = _area(a) + _area(b) - inter
    positive = union > 0
    out = np.divide(inter, union, out=np.zeros_like(inter), where=positive)
    both_empty = ~positive & (a == b).all(axis=-1)
    if both_empty.any():
        out[both_empty] = 1.0
    return out


def iou(pred: ArrayLike, truth: ArrayLike) -> np.ndarray:
    """IoU of each row of ``pred`` with the same row of ``truth``; both ``(N, 4)`` xyxy pixels.

    Returns ``(N,)`` float64 in ``[0, 1]``. Boxes that only touch score 0.
    """
    p = _as_boxes(pred, "pred")
    t = _as_boxes(truth, "truth")
    if p.shape != t.shape:
        raise ValueError(f"pred has {len(p)} boxes but truth has {len(t)}")
    return _iou_broadcast(p, t)


def pairwise_iou(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """IoU of every box in ``a`` ``(N, 4)`` with every box in ``b`` ``(M, 4)``: ``(N, M)``."""
    x = _as_boxes(a, "a")
    y = _as_boxes(b, "b")
    return _iou_broadcast(x[:, None, :], y[None, :, :])


@dataclass(frozen=True, slots=True)
class GroundingScores:
    """``aiou`` is the mean IoU x 100; ``acc_50``/``acc_70`` are the fractions of samples with
    IoU strictly above 0.5 / 0.7 (the paper's "IoU > 50" and "IoU > 70")."""

    n: int
    aiou: float
    acc_50: float
    acc_70: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "aiou": self.aiou,
            "iou_gt_0.5": self.acc_50,
            "iou_gt_0.7": self.acc_70,
        }


def grounding_scores(pred: ArrayLike, truth: ArrayLike) -> GroundingScores:
    """AIoU and accuracies of predicted boxes against true boxes, row by row (xyxy pixels)."""
    values = iou(pred, truth)
    if len(values) == 0:
        raise ValueError("no boxes to score: pred and truth are empty")
    return GroundingScores(
        n=len(values),
        aiou=float(values.mean() * 100.0),
        acc_50=float((values > 0.5).mean()),
        acc_70=float((values > 0.7).mean()),
    )


def krippendorff_alpha_iou(boxes_by_annotator: ArrayLike) -> float:
    """Krippendorff's alpha between annotators' boxes with distance ``1 - IoU``.

    ``boxes_by_annotator`` has shape ``(A, U, 4)``: annotator ``a``'s xyxy box for unit ``u``,
    or a row of four NaN where that annotator gave none. Only units with two or more boxes
    count (Krippendorff's "pairable" values). With ``n`` pairable boxes and ``m_u`` boxes in
    unit ``u``, summing over ordered pairs of distinct boxes::

        D_o = 1/n * sum_u 1/(m_u - 1) * sum_{i != j in u} d(b_i, b_j)
        D_e = 1/(n (n - 1)) * sum_{i != j, any units} d(b_i, b_j)
        alpha = 1 - D_o / D_e

    which is the general form that the nominal/interval alphas specialise. Raises
    ``ValueError`` when no unit has two boxes or all boxes are identical (alpha undefined).
    """
    data = np.asarray(boxes_by_annotator, dtype=np.float64)
    if data.ndim != 3 or data.shape[2] != 4:
        raise ValueError(
            f"boxes_by_annotator must have shape (annotators, units, 4), got {data.shape}"
        )
    nan = np.isnan(data)
    missing = nan.all(axis=2)
    partial = nan.any(axis=2) & ~missing
    if partial.any():
        a, u = (int(i[0]) for i in np.nonzero(partial))
        raise ValueError(
            f"annotator {a} unit {u} has some but not all coordinates missing: {data[a, u].tolist()}"
        )
    for a in range(data.shape[0]):
        _as_boxes(data[a][~missing[a]], f"annotator {a}")

    present = ~missing
    counts = present.sum(axis=0)
    pairable = counts >= 2
    n = int(counts[pairable].sum())
    if n == 0:
        raise ValueError("no unit has boxes from two or more annotators; alpha is undefined")

    weight = np.zeros(data.shape[1])
    weight[pairable] = 2.0 / (counts[pairable] - 1)  # 2: each unordered pair twice
    observed = 0.0
    for a in range(data.shape[0]):
        for b in range(a + 1, data.shape[0]):
            both = present[a] & present[b]
            if both.any():
                d = 1.0 - _iou_broadcast(data[a, both], data[b, both])
                observed += float((weight[both] * d).sum())
    d_o = observed / n

    values = data.transpose(1, 0, 2)[pairable][present.T[pairable]]
    # d is symmetric with d(b, b) = 0: sum rows [start, end) against columns [start, n) once,
    # counting the pairs right of the diagonal square twice and the square (both orders) once.
    step = max(1, _PAIRWISE_CHUNK // len(values))
    expected = 0.0
    for start in range(0, len(values), step):
        end = min(start + step, len(values))
        block = 1.0 - _iou_broadcast(values[start:end, None, :], values[None, start:, :])
        width = end - start
        expected += float(2.0 * block[:, width:].sum() + block[:, :width].sum())
    d_e = expected / (n * (n - 1))
    if d_e == 0.0:
        raise ValueError("all pairable boxes are identical; alpha is undefined (no variation)")
    return 1.0 - d_o / d_e


# --- Toloka CSV files ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TolokaRow:
    """One answer: the xyxy pixel ``box`` for ``question`` about ``image``; ``line`` is the
    1-based line of the CSV file it came from."""

    image: str
    question: str
    width: int
    height: int
    box: tuple[float, float, float, float]
    line: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.image, self.question)


@dataclass(frozen=True, slots=True)
class TolokaFile:
    """A parsed Toloka CSV file; ``(image, question)`` is unique across ``rows``."""

    path: Path
    rows: tuple[TolokaRow, ...]

    def by_key(self) -> dict[tuple[str, str], TolokaRow]:
        return {row.key: row for row in self.rows}


def _cell_number(record: dict[str | None, Any], column: str, where: str) -> float:
    cell = record.get(column)
    if cell is None:
        raise ValueError(f"{where}: no value in column {column!r}")
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"{where}: column {column!r} is not a number: {cell!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: column {column!r} is not a finite number: {cell!r}")
    return value


def _parse_row(record: dict[str | None, Any], where: str, line: int) -> TolokaRow:
    if record.get(None):
        raise ValueError(f"{where}: more cells than the {len(record) - 1} header columns")
    for column in ("image", "question"):
        if record.get(column) is None:
            raise ValueError(f"{where}: no value in column {column!r}")
    left, top, right, bottom = (
        _cell_number(record, c, where) for c in ("left", "top", "right", "bottom")
    )
    if right < left:
        raise ValueError(f"{where}: right {right:g} < left {left:g}")
    if bottom < top:
        raise ValueError(f"{where}: bottom {bottom:g} < top {top:g}")
    size = {}
    for column in ("width", "height"):
        value = _cell_number(record, column, where)
        if value <= 0 or not value.is_integer():
            raise ValueError(
                f"{where}: {column} must be a positive integer, got {record[column]!r}"
            )
        size[column] = int(value)
    return TolokaRow(
        image=record["image"],
        question=record["question"],
        width=size["width"],
        height=size["height"],
        box=(left, top, right, bottom),
        line=line,
    )


def read_toloka_csv(path: str | Path) -> TolokaFile:
    """Read a Toloka VQA CSV (columns ``image, width, height, left, top, right, bottom,
    question``; extra columns are ignored). Raises ``ValueError`` naming the file and line for a
    missing column, a non-numeric cell, an inverted box or a repeated ``(image, question)``."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames
        if header is None:
            raise ValueError(f"{path}: empty file, expected the header {','.join(TOLOKA_COLUMNS)}")
        absent = [c for c in TOLOKA_COLUMNS if c not in header]
        if absent:
            raise ValueError(f"{path} line 1: header lacks column(s) {', '.join(absent)}")
        rows: list[TolokaRow] = []
        first_line: dict[tuple[str, str], int] = {}
        for record in reader:
            line = reader.line_num
            where = f"{path} line {line}"
            row = _parse_row(record, where, line)
            if row.key in first_line:
                raise ValueError(
                    f"{where}: duplicate of line {first_line[row.key]} "
                    f"(image {row.image!r}, question {row.question!r})"
                )
            first_line[row.key] = line
            rows.append(row)
    return TolokaFile(path=path, rows=tuple(rows))


@dataclass(frozen=True, slots=True)
class AlignedBoxes:
    """Truth and prediction boxes matched by ``(image, question)``, in truth-file order."""

    keys: tuple[tuple[str, str], ...]
    truth: np.ndarray
    pred: np.ndarray


def _missing_error(truth: TolokaFile, other: TolokaFile, rows: list[TolokaRow]) -> ValueError:
    row = rows[0]
    more = f" and {len(rows) - 1} more" if len(rows) > 1 else ""
    return ValueError(
        f"{other.path}: no row for image {row.image!r}, question {row.question!r} "
        f"({truth.path} line {row.line}){more}"
    )


def _extra_error(truth: TolokaFile, other: TolokaFile, rows: list[TolokaRow]) -> ValueError:
    row = rows[0]
    more = f" ({len(rows) - 1} more rows like it)" if len(rows) > 1 else ""
    return ValueError(
        f"{other.path} line {row.line}: image {row.image!r}, question {row.question!r} "
        f"is not in {truth.path}{more}"
    )


def align_boxes(truth: TolokaFile, pred: TolokaFile) -> AlignedBoxes:
    """Pair every truth row with the prediction row of the same ``(image, question)``.

    A truth row without a prediction, or a prediction without a truth row, is a ``ValueError``
    naming the file and line."""
    predicted = pred.by_key()
    missing = [row for row in truth.rows if row.key not in predicted]
    if missing:
        raise _missing_error(truth, pred, missing)
    known = truth.by_key()
    extra = [row for row in pred.rows if row.key not in known]
    if extra:
        raise _extra_error(truth, pred, extra)
    return AlignedBoxes(
        keys=tuple(row.key for row in truth.rows),
        truth=np.array([row.box for row in truth.rows], dtype=np.float64).reshape(-1, 4),
        pred=np.array([predicted[row.key].box for row in truth.rows], dtype=np.float64).reshape(
            -1, 4
        ),
    )


def annotator_boxes(truth: TolokaFile, annotators: Sequence[TolokaFile]) -> np.ndarray:
    """``(A, U, 4)`` boxes of each annotator file for the truth file's units (its rows, in
    order), NaN where an annotator has no row. Input for :func:`krippendorff_alpha_iou`.

    An annotator row whose ``(image, question)`` is not in ``truth`` is a ``ValueError`` naming
    the file and line."""
    index = {row.key: u for u, row in enumerate(truth.rows)}
    out = np.full((len(annotators), len(truth.rows), 4), np.nan)
    for a, annotator in enumerate(annotators):
        extra = [row for row in annotator.rows if row.key not in index]
        if extra:
            raise _extra_error(truth, annotator, extra)
        for row in annotator.rows:
            out[a, index[row.key]] = row.box
    return out


@dataclass(frozen=True, slots=True)
class TolokaScores:
    """Scores of a prediction file, and the annotators' alpha when annotator files were given."""

    scores: GroundingScores
    krippendorff_alpha: float | None = None
    annotators: int = 0

    def as_dict(self) -> dict[str, Any]:
        out = self.scores.as_dict()
        if self.krippendorff_alpha is not None:
            out["krippendorff_alpha"] = self.krippendorff_alpha
            out["annotators"] = self.annotators
        return out


def score_toloka_files(
    truth: str | Path, pred: str | Path, annotators: Sequence[str | Path] = ()
) -> TolokaScores:
    """Score ``pred`` against ``truth`` (Toloka CSVs matched by ``(image, question)``) and, with
    two or more ``annotators`` files, their Krippendorff's alpha (distance ``1 - IoU``) over the
    truth file's units; an annotator may leave units out."""
    if len(annotators) == 1:
        raise ValueError(f"alpha needs two or more annotator files, got one: {annotators[0]}")
    truth_file = read_toloka_csv(truth)
    aligned = align_boxes(truth_file, read_toloka_csv(pred))
    scores = grounding_scores(aligned.pred, aligned.truth)
    if not annotators:
        return TolokaScores(scores=scores)
    boxes = annotator_boxes(truth_file, [read_toloka_csv(path) for path in annotators])
    return TolokaScores(
        scores=scores,
        krippendorff_alpha=krippendorff_alpha_iou(boxes),
        annotators=len(annotators),
    )
