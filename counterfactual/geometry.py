"""Exact areas of unions and intersections of axis-aligned boxes.

The plane is cut into the cells of the grid spanned by all box edges (coordinate compression);
each box covers a set of whole cells, so a union or an intersection of unions is a set of cells
and its area is exact: overlapping boxes are counted once, not summed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def box_cells(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cell grid of each image in a batch.

    ``boxes`` is ``(n, m, 4)`` ``xyxy`` float64 (``n`` images of ``m`` boxes; padding boxes of
    zero size cover nothing). Returns ``cover`` ``(n, m, cells)`` bool, whether box ``j`` of
    image ``i`` covers a cell, and ``cell_area`` ``(n, cells)``, so that the area of a set of
    cells is ``cell_area @ cells``.
    """
    n, m = boxes.shape[:2]
    xs = np.sort(boxes[:, :, 0::2].reshape(n, -1), axis=1)
    ys = np.sort(boxes[:, :, 1::2].reshape(n, -1), axis=1)
    cx = (xs[:, :-1] + xs[:, 1:]) * 0.5
    cy = (ys[:, :-1] + ys[:, 1:]) * 0.5
    in_x = (boxes[:, :, 0:1] < cx[:, None, :]) & (cx[:, None, :] < boxes[:, :, 2:3])
    in_y = (boxes[:, :, 1:2] < cy[:, None, :]) & (cy[:, None, :] < boxes[:, :, 3:4])
    cover = (in_x[:, :, :, None] & in_y[:, :, None, :]).reshape(n, m, -1)
    cell_area = (np.diff(xs)[:, :, None] * np.diff(ys)[:, None, :]).reshape(n, -1)
    return cover, cell_area


def union_area(boxes: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Exact area of the union of ``xyxy`` boxes."""
    arr = np.asarray(boxes, dtype=np.float64).reshape(1, -1, 4)
    if arr.shape[1] == 0:
        return 0.0
    cover, cell_area = box_cells(arr)
    return float(cell_area[0] @ cover[0].any(axis=0))
