"""Masks of the regions to repaint: ``uint8`` arrays of shape ``(H, W)``, 255 = repaint, 0 = keep.

A box ``(x, y, w, h)`` covers every pixel it touches: pixel ``(row i, column j)`` is the square
``[j, j+1) x [i, i+1)``, so fractional box edges round outwards.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from counterfactual.records import ImageRecord
from counterfactual.selection import RemovalPlan

MASK_SOURCES = ("box", "segmentation")


@dataclass(frozen=True, slots=True)
class MaskConfig:
    source: str = "box"
    """``box``: the removed boxes; ``segmentation``: the removed objects' polygons where the
    dataset has them (boxes otherwise)."""
    dilate: int = 0
    """Grow the mask by this many pixels (an elliptical kernel); helps inpainters erase edges."""

    def __post_init__(self) -> None:
        if self.source not in MASK_SOURCES:
            raise ValueError(f"mask source {self.source!r} is not one of {MASK_SOURCES}")
        if (
            isinstance(self.dilate, bool)
            or not isinstance(self.dilate, numbers.Integral)
            or self.dilate < 0
        ):
            raise ValueError(f"dilate must be a whole number of pixels >= 0, got {self.dilate!r}")


def box_mask(
    height: int, width: int, boxes: Sequence[Sequence[float]], out: np.ndarray | None = None
) -> np.ndarray:
    """Mask of ``xywh`` boxes (clipped to the image)."""
    mask = np.zeros((height, width), dtype=np.uint8) if out is None else out
    for x, y, w, h in boxes:
        x0, y0 = max(0, math.floor(x)), max(0, math.floor(y))
        x1, y1 = min(width, math.ceil(x + w)), min(height, math.ceil(y + h))
        if x1 > x0 and y1 > y0:
            mask[y0:y1, x0:x1] = 255
    return mask


def dilate(mask: np.ndarray, pixels: int) -> np.ndarray:
    if pixels <= 0:
        return mask
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (2 * pixels + 1, 2 * pixels + 1))
    return cv2.dilate(mask, kernel)


def plan_mask(
    record: ImageRecord, plan: RemovalPlan, height: int, width: int, config: MaskConfig
) -> np.ndarray:
    """The repaint mask of ``plan`` on an image of ``height`` x ``width`` pixels.

    Boxes are in the record's pixel space; when the decoded image has another size than the
    annotation says, they are scaled to it.
    """
    sx, sy = width / record.width, height / record.height
    if config.source == "segmentation":
        mask = np.zeros((height, width), dtype=np.uint8)
        removed = set(plan.removed)
        for obj in record.objects:
            if obj.category not in removed:
                continue
            if obj.segmentation:
                polys = [
                    np.round(np.array(p, dtype=np.float64).reshape(-1, 2) * (sx, sy)).astype(
                        np.int32
                    )
                    for p in obj.segmentation
                ]
                cv2.fillPoly(mask, polys, 255)
            else:
                x, y, w, h = obj.bbox
                box_mask(height, width, [(x * sx, y * sy, w * sx, h * sy)], out=mask)
    else:
        boxes = [(x * sx, y * sy, w * sx, h * sy) for x, y, w, h in plan.mask_boxes]
        mask = box_mask(height, width, boxes)
    return dilate(mask, config.dilate)


def mask_bounds(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """``(x0, y0, x1, y1)`` of the pixels to repaint (exclusive ends), or ``None`` if none."""
    x, y, w, h = cv2.boundingRect(mask)
    return None if w == 0 or h == 0 else (x, y, x + w, y + h)
