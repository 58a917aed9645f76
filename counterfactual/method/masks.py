"""Masks of the regions to repaint: ``uint8`` arrays of shape ``(H, W)``, 255 = repaint, 0 = keep.

A box ``(x, y, w, h)`` covers every pixel it touches: pixel ``(row i, column j)`` is the square
``[j, j+1) x [i, i+1)``, so fractional box edges round outwards. Segmentations (polygons, RLE)
are rasterised by ``pycocotools.mask``, so a mask is the one COCO's own tools give.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace

import cv2
import numpy as np
from pycocotools import mask as coco_mask

from counterfactual.method.selection import RemovalPlan
from counterfactual.options import declare
from counterfactual.records import RLE, ImageRecord, ObjectAnnotation

MASK_SOURCES = ("box", "segmentation")


@dataclass(frozen=True, slots=True)
class MaskConfig:
    source: str = declare(
        "box",
        help="box: the removed boxes; segmentation: the removed objects' polygons where the "
        "dataset has them, boxes otherwise (default: %(default)s)",
        choices=MASK_SOURCES,
        flags=("--mask-source",),
    )
    """``box``: the removed boxes; ``segmentation``: the removed objects' segmentations where
    the dataset has them (polygons or RLE, crowd included, decoded by ``pycocotools.mask``;
    boxes otherwise)."""
    dilate: int = declare(
        0,
        help="grow the mask by N pixels, >= 0; helps inpainters erase edges (default: %(default)s)",
        kind="nonnegative_int",
    )
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


def object_mask(obj: ObjectAnnotation, height: int, width: int) -> np.ndarray | None:
    """The object's segmentation as a ``(height, width)`` array of 0/1 ``uint8``, exactly as
    ``pycocotools.mask`` decodes it (``COCO.annToMask``): polygons through ``frPyObjects`` and
    ``merge``, an :class:`~counterfactual.records.RLE` (crowd annotations) as it is; ``None``
    when the object has no segmentation.

    ``height`` x ``width`` is the image the segmentation's coordinates refer to (the record's
    size); see :func:`plan_mask` for other sizes.
    """
    seg = obj.segmentation
    if not seg:
        return None
    if isinstance(seg, RLE):
        if isinstance(seg.counts, str):
            rle = {"size": [seg.height, seg.width], "counts": seg.counts.encode("ascii")}
        else:
            rle = coco_mask.frPyObjects(
                {"size": [seg.height, seg.width], "counts": list(seg.counts)},
                seg.height,
                seg.width,
            )
    else:
        rle = coco_mask.merge(coco_mask.frPyObjects([list(p) for p in seg], height, width))
    with warnings.catch_warnings():  # pycocotools' __array__ predates numpy 2's copy keyword
        warnings.simplefilter("ignore", DeprecationWarning)
        return coco_mask.decode(rle)


def plan_mask(
    record: ImageRecord, plan: RemovalPlan, height: int, width: int, config: MaskConfig
) -> np.ndarray:
    """The repaint mask of ``plan`` on an image of ``height`` x ``width`` pixels.

    ``segmentation``: the union of the removed objects' :func:`object_mask` (the box for an
    object without one), equal to ``pycocotools``' masks at the record's size. When the decoded
    image has another size than the annotation says, polygons and boxes are scaled to it and
    RLE masks resized (nearest neighbour).
    """
    sx, sy = width / record.width, height / record.height
    if config.source == "segmentation":
        mask = np.zeros((height, width), dtype=np.uint8)
        removed = set(plan.removed)
        for obj in record.objects:
            if obj.category not in removed:
                continue
            if isinstance(obj.segmentation, tuple) and (sx, sy) != (1.0, 1.0):
                scaled = [
                    tuple(v * (sx if i % 2 == 0 else sy) for i, v in enumerate(p))
                    for p in obj.segmentation
                ]
                obj = replace(obj, segmentation=tuple(scaled))
            part = object_mask(obj, height, width)
            if part is None:
                x, y, w, h = obj.bbox
                box_mask(height, width, [(x * sx, y * sy, w * sx, h * sy)], out=mask)
                continue
            if part.shape != mask.shape:
                part = cv2.resize(part, (width, height), interpolation=cv2.INTER_NEAREST)
            mask[part != 0] = 255
    else:
        boxes = [(x * sx, y * sy, w * sx, h * sy) for x, y, w, h in plan.mask_boxes]
        mask = box_mask(height, width, boxes)
    return dilate(mask, config.dilate)


def mask_bounds(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """``(x0, y0, x1, y1)`` of the pixels to repaint (exclusive ends), or ``None`` if none."""
    x, y, w, h = cv2.boundingRect(mask)
    return None if w == 0 or h == 0 else (x, y, x + w, y + h)
