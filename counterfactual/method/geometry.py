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


def union_area(boxes: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Area of the union of ``xyxy`` pixel boxes, their coordinates snapped to
    ``2**-SNAP_BITS`` px (exact for boxes already on that grid, integer boxes among them)."""
    arr = np.asarray(boxes, dtype=np.float64).reshape(1, -1, 4)
    if arr.shape[1] == 0:
        return 0.0
    units = np.rint(np.ldexp(arr, SNAP_BITS))
    cover, cell_area = class_cells(units, np.zeros((1, arr.shape[1]), dtype=np.intp), 1)
    return float(np.ldexp(cell_area[0] @ cover[0, 0], -2 * SNAP_BITS))


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
