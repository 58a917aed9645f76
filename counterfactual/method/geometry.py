"""Exact areas of unions and intersections of axis-aligned boxes.

The plane is cut into the cells of the grid spanned by all box edges (coordinate compression);
each box covers a set of whole cells, so a union or an intersection of unions is a set of cells
and its area is exact: overlapping boxes are counted once, not summed.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def class_cells(boxes: np.ndarray, group: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The cell grid of each image in a batch, with the union of each class's boxes as cells.

    ``boxes`` is ``(n, m, 4)`` ``xyxy`` float64 (``n`` images of ``m`` boxes; padding boxes of
    zero size cover nothing), ``group`` ``(n, m)`` the class of each box in ``range(k)`` (any
    other value for none). Returns ``cover`` ``(n, k, cells)`` float64, 1 where a box of class
    ``c`` of image ``i`` covers the cell, else 0, and ``cell_area`` ``(n, cells)``, so that the
    area of a set of cells is ``cell_area @ cells``.
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
    cover = np.minimum(count.reshape(n, k, -1), 1.0).astype(np.float64)
    cell_area = (np.diff(xs)[:, :, None] * np.diff(ys)[:, None, :]).reshape(n, -1)
    return cover, cell_area


def union_area(boxes: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Exact area of the union of ``xyxy`` boxes."""
    arr = np.asarray(boxes, dtype=np.float64).reshape(1, -1, 4)
    if arr.shape[1] == 0:
        return 0.0
    cover, cell_area = class_cells(arr, np.zeros((1, arr.shape[1]), dtype=np.intp), 1)
    return float(cell_area[0] @ cover[0, 0])
