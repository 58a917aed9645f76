"""The boxes of many images as columns: what the alpha rules read.

A :class:`BoxTable` holds one row per object (its ``xywh`` box, its image, its class code) and
one entry per image (its id and size), as arrays. The rules run on whole tables, so a dataset of
a hundred thousand images is a few array operations, not a hundred thousand record walks.
:meth:`BoxTable.from_records` makes one from records; a reader may build one directly
(:func:`counterfactual.readers.coco_boxes.read_coco_boxes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from counterfactual.records import ImageRecord


@dataclass(frozen=True, slots=True)
class BoxTable:
    """Objects of ``len(image_ids)`` images.

    ``bbox`` ``(N, 4)`` ``xywh`` float64, ``owner`` ``(N,)`` the image index of each object
    (non-decreasing: an image's objects are consecutive, in their annotation order),
    ``category`` ``(N,)`` the index in ``classes`` of each object's class; ``width`` and
    ``height`` ``(I,)`` the annotated sizes.
    """

    image_ids: Sequence[str]
    width: np.ndarray
    height: np.ndarray
    classes: Sequence[str]
    bbox: np.ndarray
    owner: np.ndarray
    category: np.ndarray

    def __post_init__(self) -> None:
        n, i = len(self.bbox), len(self.image_ids)
        if self.bbox.shape != (n, 4) or self.owner.shape != (n,) or self.category.shape != (n,):
            raise ValueError(f"bbox, owner and category must have {n} rows")
        if self.width.shape != (i,) or self.height.shape != (i,):
            raise ValueError(f"width and height must have {i} entries")
        if n and (np.diff(self.owner) < 0).any():
            raise ValueError("owner must be non-decreasing (each image's objects together)")

    def __len__(self) -> int:
        return len(self.image_ids)

    @classmethod
    def from_records(cls, records: Sequence[ImageRecord]) -> BoxTable:
        counts = [len(r.objects) for r in records]
        cats = [o.category for r in records for o in r.objects]
        classes = list(dict.fromkeys(cats))
        code = {c: k for k, c in enumerate(classes)}
        return cls(
            image_ids=[r.image_id for r in records],
            width=np.array([r.width for r in records], dtype=np.float64),
            height=np.array([r.height for r in records], dtype=np.float64),
            classes=classes,
            bbox=np.array([o.bbox for r in records for o in r.objects], np.float64).reshape(-1, 4),
            owner=np.repeat(np.arange(len(records), dtype=np.intp), counts),
            category=np.array([code[c] for c in cats], dtype=np.intp),
        )

    def images(self, start: int, stop: int) -> BoxTable:
        """The table of images ``start`` to ``stop`` (their objects with them)."""
        lo, hi = np.searchsorted(self.owner, [start, stop]).tolist()
        return BoxTable(
            image_ids=self.image_ids[start:stop],
            width=self.width[start:stop],
            height=self.height[start:stop],
            classes=self.classes,
            bbox=self.bbox[lo:hi],
            owner=self.owner[lo:hi] - start,
            category=self.category[lo:hi],
        )

    def clipped(self) -> tuple[np.ndarray, np.ndarray]:
        """``(xyxy, visible)``: each box clipped to its image (pixels), and whether it keeps an
        area on the snapping grid (see :meth:`snapped`)."""
        snapped = self.snapped()
        return snapped.xyxy, snapped.visible

    def snapped(self) -> SnappedBoxes:
        """Each box clipped to its image and snapped to its image's grid (see
        :class:`SnappedBoxes`)."""
        xyxy = self.bbox.copy()
        with np.errstate(over="ignore"):  # a far corner past the largest float is clipped below
            xyxy[:, 2:] += xyxy[:, :2]
        xyxy[:, 0::2] = np.clip(xyxy[:, 0::2], 0.0, self.width[self.owner][:, None])
        xyxy[:, 1::2] = np.clip(xyxy[:, 1::2], 0.0, self.height[self.owner][:, None])
        bits = snap_bits(self.width, self.height)
        units = np.rint(np.ldexp(xyxy, bits[self.owner][:, None]))
        visible = (units[:, 2] > units[:, 0]) & (units[:, 3] > units[:, 1])
        return SnappedBoxes(xyxy, units, visible, bits)


@dataclass(frozen=True, slots=True)
class SnappedBoxes:
    """The boxes of a :class:`BoxTable` as the alpha rules measure them.

    ``xyxy`` ``(N, 4)`` float64 pixels, clipped to the image; ``units`` the same on the image's
    snapping grid: float64 holding integers, in units of ``2**-bits`` px, rounded to the nearest
    (ties to even); ``visible`` ``(N,)`` whether the snapped box keeps an area; ``bits`` ``(I,)``
    per image, :func:`snap_bits`. Areas in these units are integers below ``2**52``, so float64
    sums of them are exact whatever the summation order (BLAS kernel, SIMD width, batch shape).
    """

    xyxy: np.ndarray
    units: np.ndarray
    visible: np.ndarray
    bits: np.ndarray


SNAP_BITS = 8
"""Box coordinates are snapped to multiples of ``2**-SNAP_BITS`` pixel (1/256 px) before any area
is measured: each edge moves by at most half a unit (1/512 px)."""
_EXACT_BITS = 52  # areas in snapping units stay below 2**52, exact in float64


def snap_bits(width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """The snapping precision of each image: :data:`SNAP_BITS`, less for an image so large
    (``2**36`` px or more, 262,144 px square) that its area in units would not stay below
    ``2**52``. Exact integer arithmetic on the exponent, no logarithm."""
    area = np.maximum(np.asarray(width, np.float64) * np.asarray(height, np.float64), 1.0)
    _, exponent = np.frexp(area)  # area <= 2**exponent
    return np.clip((_EXACT_BITS - exponent) // 2, 0, SNAP_BITS).astype(np.intp)


def snap_bits_of(width: float, height: float) -> int:
    """:func:`snap_bits` of one image."""
    _, exponent = math.frexp(max(float(width) * float(height), 1.0))
    return max(0, min(SNAP_BITS, (_EXACT_BITS - exponent) // 2))


__all__ = ["SNAP_BITS", "BoxTable", "SnappedBoxes", "snap_bits", "snap_bits_of"]
