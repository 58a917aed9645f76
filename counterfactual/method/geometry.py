"""Exact areas of unions and intersections of axis-aligned boxes, and exact ratio tests.

The plane is cut into the cells of the grid spanned by all box edges (coordinate compression);
each box covers a set of whole cells, so a union or an intersection of unions is a set of cells
and its area is a sum of cell areas: overlapping boxes are counted once, not summed.

Coordinates are integers in snapping units (:meth:`counterfactual.boxtable.BoxTable.snapped`),
so every cell area is an integer and every area below ``2**52``: float64 sums of them are exact
in any order, and a matrix product gives the same bits on every BLAS kernel, SIMD width, thread
count and batch shape. A ratio of two such areas is one correctly rounded division, so it is
the same everywhere too and never exceeds 1 when the numerator does not exceed the denominator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from counterfactual.boxtable import SNAP_BITS


def class_cells(boxes: np.ndarray, group: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The cell grid of each image in a batch, with the union of each class's boxes as cells.

    ``boxes`` is ``(n, m, 4)`` ``xyxy`` float64 holding integers (snapping units; ``n`` images
    of ``m`` boxes; padding boxes of zero size cover nothing), ``group`` ``(n, m)`` the class
    of each box in ``range(k)`` (any other value for none). Returns ``cover`` ``(n, k, cells)``
    float64, 1 where a box of class ``c`` of image ``i`` covers the cell, else 0, and
    ``cell_area`` ``(n, cells)`` (integers, in squared units), so that the area of a set of
    cells is ``cell_area @ cells``, exactly.
    """
    n, m = boxes.shape[:2]
    xs = np.sort(boxes[:, :, 0::2].reshape(n, -1), axis=1)
    ys = np.sort(boxes[:, :, 1::2].reshape(n, -1), axis=1)
    cx = (xs[:, :-1] + xs[:, 1:]) * 0.5
    cy = (ys[:, :-1] + ys[:, 1:]) * 0.5
    in_x = (boxes[:, :, 0:1] < cx[:, None, :]) & (cx[:, None, :] < boxes[:, :, 2:3])
    in_y = (boxes[:, :, 1:2] < cy[:, None, :]) & (cy[:, None, :] < boxes[:, :, 3:4])
    # boxes of class c covering cell (x, y): sum over b of [group b = c] in_x[b, x] in_y[b, y],
    # one batched product; counts are small integers, exact in float32
    onehot = group[:, None, :] == np.arange(k)[None, :, None]
    columns = (onehot[:, :, :, None] & in_x[:, None, :, :]).astype(np.float32)
    count = columns.transpose(0, 1, 3, 2).reshape(n, -1, m) @ in_y.astype(np.float32)
    cover = (count.reshape(n, k, -1) > 0).astype(np.float64)
    cell_area = (np.diff(xs)[:, :, None] * np.diff(ys)[:, None, :]).reshape(n, -1)
    return cover, cell_area


SWEEP_CELLS = 1 << 20
"""Cells of one image's grid that :func:`class_overlaps` holds at a time, per class."""


@dataclass(frozen=True, slots=True)
class Overlaps:
    """Exact areas (squared snapping units, integers in float64) of one image's class unions:
    ``inter[c, d]`` = area(B_c ∩ B_d) (its diagonal: area(B_c)); with unions ``U`` asked for,
    ``union_inter[u, d]`` = area(B_U ∩ B_d) and ``union_area[u]`` = area(B_U), where
    ``B_U`` is the union of the boxes of the classes ``U`` marks."""

    inter: np.ndarray
    union_inter: np.ndarray
    union_area: np.ndarray


def class_overlaps(
    boxes: np.ndarray,
    group: np.ndarray,
    k: int,
    unions: np.ndarray | None = None,
    budget: int = SWEEP_CELLS,
) -> Overlaps:
    """The areas :func:`class_cells` gives, for one image, in memory linear in its boxes.

    ``boxes`` is ``(m, 4)`` ``xyxy`` float64 holding integers (snapping units), ``group``
    ``(m,)`` each box's class in ``range(k)`` (any other value, or an empty box: none);
    ``unions`` ``(u, k)`` bool, the class sets whose union's overlaps are wanted. The grid of
    box edges is swept a block of columns at a time, each column's coverage of every class
    kept as a running difference along ``y``: at most ``max(budget, k * rows)`` cells are held
    at once (``rows`` < ``2 m``), never ``m x m``. Time grows with the cells, ``m**2``. Every
    area is a sum of integer cell areas, so the result is the same bits as the dense grid's.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    group = np.asarray(group).reshape(-1)
    unions = np.zeros((0, k), dtype=bool) if unions is None else np.asarray(unions, dtype=bool)
    inter = np.zeros((k, k))
    union_inter = np.zeros((len(unions), k))
    union_area = np.zeros(len(unions))
    real = (group >= 0) & (group < k) & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    boxes, group = boxes[real], group[real].astype(np.intp)
    if not len(boxes):
        return Overlaps(inter, union_inter, union_area)
    xs, ys = np.unique(boxes[:, 0::2]), np.unique(boxes[:, 1::2])
    x0, x1 = np.searchsorted(xs, boxes[:, 0]), np.searchsorted(xs, boxes[:, 2])
    y0, y1 = np.searchsorted(ys, boxes[:, 1]), np.searchsorted(ys, boxes[:, 3])
    rows = len(ys) - 1
    # a box opens at column x0 and closes at x1: +1 / -1 on its rows, as a difference along y
    column = np.concatenate([x0, x1])
    sign = np.concatenate([np.ones(len(x0), np.int32), -np.ones(len(x1), np.int32)])
    cls, lo, hi = np.tile(group, 2), np.tile(y0, 2), np.tile(y1, 2)
    order = np.argsort(column, kind="stable")
    column, sign, cls, lo, hi = column[order], sign[order], cls[order], lo[order], hi[order]
    width, height = np.diff(xs), np.diff(ys)
    running = np.zeros((k, rows + 1), dtype=np.int32)
    union_set = unions.astype(np.float64)
    step = max(1, budget // (k * (rows + 1)))
    for start in range(0, len(xs) - 1, step):
        stop = min(start + step, len(xs) - 1)
        a, b = np.searchsorted(column, [start, stop])
        events = np.zeros((k, stop - start, rows + 1), dtype=np.int32)
        np.add.at(events, (cls[a:b], column[a:b] - start, lo[a:b]), sign[a:b])
        np.add.at(events, (cls[a:b], column[a:b] - start, hi[a:b]), -sign[a:b])
        diff = running[:, None, :] + np.cumsum(events, axis=1)
        running = diff[:, -1]
        cover = (np.cumsum(diff, axis=2)[:, :, :rows] > 0).reshape(k, -1).astype(np.float64)
        cell_area = (width[start:stop, None] * height[None, :]).reshape(-1)
        weighted = cover * cell_area
        inter += cover @ weighted.T
        if len(unions):
            in_union = np.minimum(union_set @ cover, 1.0)
            union_inter += in_union @ weighted.T
            union_area += in_union @ cell_area
    return Overlaps(inter, union_inter, union_area)


def union_area(boxes: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Area of the union of ``xyxy`` pixel boxes, their coordinates snapped to
    ``2**-SNAP_BITS`` px (exact for boxes already on that grid, integer boxes among them)."""
    arr = np.asarray(boxes, dtype=np.float64).reshape(1, -1, 4)
    if arr.shape[1] == 0:
        return 0.0
    units = np.rint(np.ldexp(arr[0], SNAP_BITS))
    area = class_overlaps(units, np.zeros(len(units), dtype=np.intp), 1).inter[0, 0]
    return float(np.ldexp(area, -2 * SNAP_BITS))


def _compare(num: np.ndarray, den: np.ndarray, alpha: float, strict: bool) -> np.ndarray:
    ratio = num / den
    out = ratio > alpha if strict else ratio >= alpha
    # The rounded ratio equals alpha: decide on the exact fraction against alpha's decimal
    # value (0.8 is 4/5), never on the rounding. Rare; the rest is decided by the rounding,
    # which preserves order.
    ties = np.flatnonzero(ratio == alpha)
    if len(ties):
        exact = Fraction(repr(float(alpha)))
        flat_num, flat_den = (
            np.broadcast_to(num, ratio.shape).ravel(),
            np.broadcast_to(den, ratio.shape).ravel(),
        )
        flat = out.reshape(-1)
        for t in ties.tolist():
            value = Fraction(int(flat_num[t]), int(flat_den[t]))
            flat[t] = value > exact if strict else value >= exact
    return out


def exceeds(num: np.ndarray, den: np.ndarray, alpha: float) -> np.ndarray:
    """``num / den > alpha`` decided exactly (integer-valued ``num``, positive ``den``; alpha
    taken as the decimal it prints as), element-wise with broadcasting."""
    return _compare(num, den, alpha, strict=True)


def at_least(num: np.ndarray, den: np.ndarray, alpha: float) -> np.ndarray:
    """``num / den >= alpha`` decided exactly, as :func:`exceeds`."""
    return _compare(num, den, alpha, strict=False)
