"""Exact areas of unions and intersections of axis-aligned boxes.

Boxes are ``xyxy`` float64 arrays of shape ``(n, 4)`` in pixels. The plane is cut into the
cells of the grid spanned by all box edges (coordinate compression); each box covers a set of
whole cells, so a union or intersection of unions is a set of cells and its area is exact:
overlapping boxes are counted once, not summed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def xywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    out = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    out[:, 2] += out[:, 0]
    out[:, 3] += out[:, 1]
    return out


def xyxy_to_xywh(boxes: np.ndarray) -> np.ndarray:
    out = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    out[:, 2] -= out[:, 0]
    out[:, 3] -= out[:, 1]
    return out


def clip_xyxy(boxes: np.ndarray, width: float, height: float) -> np.ndarray:
    """Clip to the image ``[0, width] x [0, height]``; boxes wholly outside get zero area."""
    out = np.array(boxes, dtype=np.float64).reshape(-1, 4)
    np.clip(out[:, 0::2], 0.0, width, out=out[:, 0::2])
    np.clip(out[:, 1::2], 0.0, height, out=out[:, 1::2])
    return out


@dataclass(frozen=True, slots=True)
class CellGrid:
    """Which grid cells each group of boxes covers, and the area of every cell.

    ``cover[g]`` is a float64 0/1 vector over cells for group ``g``; ``cell_area`` is the area of
    each cell, so ``cover @ cell_area`` is the exact area of each group's union.
    """

    cover: np.ndarray
    cell_area: np.ndarray

    def areas(self) -> np.ndarray:
        return self.cover @ self.cell_area

    def intersections(self) -> np.ndarray:
        """``out[i, j]`` = area(union_i ∩ union_j); the diagonal is each union's area."""
        return self.cover @ (self.cover * self.cell_area).T

    def union_of(self, groups: np.ndarray) -> np.ndarray:
        """Cover vectors of unions of groups: ``groups`` is a 0/1 matrix (k, n_groups)."""
        return np.minimum(groups @ self.cover, 1.0)


def group_cells(boxes: np.ndarray, group: np.ndarray, n_groups: int) -> CellGrid:
    """The cell grid for ``boxes`` (xyxy, n x 4) where box ``i`` belongs to ``group[i]``."""
    xs = np.unique(boxes[:, 0::2])
    ys = np.unique(boxes[:, 1::2])
    cx = (xs[:-1] + xs[1:]) * 0.5
    cy = (ys[:-1] + ys[1:]) * 0.5
    in_x = (boxes[:, 0:1] < cx) & (cx < boxes[:, 2:3])
    in_y = (boxes[:, 1:2] < cy) & (cy < boxes[:, 3:4])
    box_cover = (in_x[:, :, None] & in_y[:, None, :]).reshape(len(boxes), -1)
    onehot = np.zeros((n_groups, len(boxes)), dtype=np.float64)
    onehot[group, np.arange(len(boxes))] = 1.0
    cover = np.minimum(onehot @ box_cover, 1.0)
    cell_area = (np.diff(xs)[:, None] * np.diff(ys)[None, :]).ravel()
    return CellGrid(cover=cover, cell_area=cell_area)


def union_area(boxes: Sequence[Sequence[float]] | np.ndarray) -> float:
    """Exact area of the union of ``xyxy`` boxes."""
    arr = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    if len(arr) == 0:
        return 0.0
    grid = group_cells(arr, np.zeros(len(arr), dtype=np.intp), 1)
    return float(grid.areas()[0])
