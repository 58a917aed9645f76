"""What a synthesis run does to a record before any pixel is touched.

:class:`SynthConfig` holds every option of a run; :func:`plan` turns records into work items
(one per chosen plan and caption, with a stable key and seed) or the status saying why a record
yields none; :func:`load_record_image` decodes a record's picture and checks it against the
annotation. The per-item steps live in :mod:`counterfactual.stages`, the runs in
:mod:`counterfactual.runner` (in-process) and ``pipelines/`` (Ray).
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from counterfactual.cooccurrence import CooccurrenceStats
from counterfactual.detect import DetectConfig
from counterfactual.image import ImageConfig
from counterfactual.imageio import (
    DEFAULT_MAX_PIXELS,
    SampleError,
    decode_rgb,
    load_rgb,
    resolve_inside,
)
from counterfactual.masks import MaskConfig
from counterfactual.records import Caption, ImageRecord, Status
from counterfactual.selection import RemovalPlan, SelectionConfig, draw_index, select_many
from counterfactual.shards import sample_key
from counterfactual.text import (
    TextConfig,
)
from counterfactual.verify import VerifyConfig

CAPTION_CHOICES = ("one", "all")


@dataclass(frozen=True, slots=True)
class SynthConfig:
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    text: TextConfig = field(default_factory=TextConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    """Per-sample check of each counterfactual (:mod:`counterfactual.verify`); off by default."""
    detect: DetectConfig | None = None
    """Boxes from an open-vocabulary detector instead of the dataset (corpora without boxes):
    each item is then one image and caption, planned by the workers after detection."""
    captions: str = "one"
    """``one``: one caption per image, drawn with the seed (as the paper); ``all``: each."""
    seed: int = 0
    images_per_shard: int = 1000
    max_pixels: int = DEFAULT_MAX_PIXELS
    jpeg_quality: int = 95
    batch_size: int = 16
    """Records handled together by the in-process runner."""

    def __post_init__(self) -> None:
        if self.captions not in CAPTION_CHOICES:
            raise ValueError(f"captions {self.captions!r} is not one of {CAPTION_CHOICES}")
        for name in ("seed", "images_per_shard", "max_pixels", "jpeg_quality", "batch_size"):
            value = getattr(self, name)
            low, high = (0 if name == "seed" else 1), (100 if name == "jpeg_quality" else None)
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Integral)
                or value < low
                or (high is not None and value > high)
            ):
                where = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ValueError(f"{name} must be a whole number {where}, got {value!r}")
        if self.detect is not None and self.selection.policy != "uniform":
            raise ValueError(
                f"policy {self.selection.policy!r} needs the boxes of every image before any is "
                "edited (spurious) or makes several samples of one detected image (all); with "
                "detected boxes the policy is uniform"
            )
        if self.detect is not None and self.mask.source == "segmentation":
            raise ValueError("detected objects have no segmentation; use mask source 'box'")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> dict[str, Any]:
        """The options that decide a run's output; batch sizes and devices do not, nor do the
        verification options while verification is off, nor options added later while at their
        defaults (so runs made before they existed resume)."""
        d = self.to_dict()
        d.pop("batch_size")
        if not self.verify.enabled:
            d.pop("verify")
        if self.detect is None:
            d.pop("detect")
        # options added later, left out at their defaults for the same reason
        if not self.text.repair:
            d["text"].pop("repair")
        if not self.text.skip_unchanged:
            d["text"].pop("skip_unchanged")
        if self.image.lama_max_side == 0:
            d["image"].pop("lama_max_side")
        if self.image.candidates == 1:
            d["image"].pop("candidates")
        for part in ("image", "text", "verify", "detect"):
            for name in ("batch_size", "device"):
                (d.get(part) or {}).pop(name, None)
        return d


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One counterfactual to make: a plan of a record with one of its captions.

    With detected boxes the plan is ``None`` until the workers have detected the objects and
    applied the alpha rules (the ``Detect`` and ``Select`` steps fill ``record`` and ``plan``).
    """

    record: ImageRecord
    plan: RemovalPlan | None
    caption: Caption
    key: str
    seed: int


NO_CAPTION = Caption("none", "")


def item_seed(seed: int, key: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def plan(
    records: Sequence[ImageRecord],
    config: SynthConfig,
    not_drawn: list[Status] | None = None,
    stats: CooccurrenceStats | None = None,
) -> list[list[WorkItem] | Status]:
    """Per record: its work items, or the status saying why there are none. Valid plans the
    policy did not choose are appended to ``not_drawn`` as ``skipped: not-drawn`` rows.

    With ``config.detect`` nothing is selected here: each record yields one plan-less item per
    caption, keyed by image and caption, which the workers plan once its objects are detected.
    """
    if config.detect is not None:
        return [_unplanned_items(record, config) for record in records]
    out: list[list[WorkItem] | Status] = []
    for record, selection in zip(
        records, select_many(records, config.selection, stats), strict=True
    ):
        if not_drawn is not None:
            not_drawn.extend(
                Status(record.image_id, "skipped", "not-drawn", "", None, target)
                for target in selection.not_drawn
            )
        if not selection.plans:
            out.append(Status(record.image_id, "skipped", selection.reason, ""))
            continue
        captions = _captions(record, config)
        if isinstance(captions, Status):
            out.append(captions)
            continue
        items = []
        for p in selection.plans:
            for cap in captions:
                key = sample_key(record.image_id, p.target, cap.caption_id)
                items.append(WorkItem(record, p, cap, key, item_seed(config.seed, key)))
        out.append(items)
    return out


def _captions(record: ImageRecord, config: SynthConfig) -> Sequence[Caption] | Status:
    """The captions a record's plans are paired with, or why it has none to pair."""
    captions: Sequence[Caption] = record.captions
    if not captions:
        needs_caption = config.text.method == "np-removal" or (
            config.detect is not None and config.detect.queries != "vocabulary"
        )
        if needs_caption:
            return Status(record.image_id, "failed", "no-caption", "")
        return (NO_CAPTION,)
    if config.captions == "one":
        pick = draw_index(config.seed, f"caption:{record.image_id}", len(captions))
        return (captions[pick],)
    return captions


def _unplanned_items(record: ImageRecord, config: SynthConfig) -> list[WorkItem] | Status:
    captions = _captions(record, config)
    if isinstance(captions, Status):
        return captions
    items = []
    for cap in captions:
        key = sample_key(record.image_id, cap.caption_id)
        items.append(WorkItem(record, None, cap, key, item_seed(config.seed, key)))
    return items


def load_record_image(record: ImageRecord, max_pixels: int) -> np.ndarray:
    """The record's picture, checked against its annotated size.

    The annotated size says in which frame the boxes were drawn. A picture whose EXIF
    orientation swaps its axes is returned upright when the annotated size is the upright one
    (most tools, COCO), and as stored when it is the stored one (tools that ignore EXIF, such
    as OpenCV): either way the boxes fall on the pixels they were drawn on. A square picture
    is returned upright. A picture whose size differs but whose aspect ratio matches (within
    1%) is used and boxes are scaled to it; any other size is a ``size-mismatch`` failure. A
    record of unknown size (``0 x 0``, a corpus without boxes) is not checked and is returned
    upright. A picture inside another file (a tar member, a Parquet cell: ``record.source``)
    is read from there; a ``root`` that is a URL (``s3://bucket/images``) is read through
    :mod:`counterfactual.fs`.
    """
    if record.source is not None:
        from counterfactual.readers.corpus import read_source

        data = read_source(record.source)

        def decode(upright: bool) -> np.ndarray:
            return decode_rgb(data, max_pixels, upright=upright)

    elif record.root is None:
        raise SampleError("missing-file", f"record {record.image_id} has no root folder")
    else:
        path = resolve_inside(record.root, record.file)

        def decode(upright: bool) -> np.ndarray:
            return load_rgb(path, max_pixels, upright=upright)

    image = decode(True)
    if record.width == record.height == 0:
        return image
    declared = (record.width, record.height)
    h, w = image.shape[:2]
    if (w, h) == declared:
        return image
    stored = None
    if _same_shape((h, w), declared, exact=False):
        stored = decode(False)  # if EXIF swapped the axes, the boxes may be on stored pixels
    for exact in (True, False):
        if _same_shape((w, h), declared, exact):
            return image
        if stored is not None and _same_shape((stored.shape[1], stored.shape[0]), declared, exact):
            return stored
    raise SampleError("size-mismatch", f"annotated {record.width}x{record.height}, decoded {w}x{h}")


def _same_shape(size: tuple[int, int], declared: tuple[int, int], exact: bool) -> bool:
    """``size`` (w, h) is ``declared``, or (``exact=False``) has its aspect ratio within 1%."""
    (w, h), (dw, dh) = size, declared
    if exact or not (w and h and dw and dh):
        return (w, h) == (dw, dh)
    return abs(w / h - dw / dh) <= 0.01 * dw / dh


def box_scale(record: ImageRecord, image: np.ndarray) -> tuple[float, float]:
    """``(sx, sy)`` taking the record's annotated pixels to ``image``'s (see
    :func:`load_record_image`); ``(1, 1)`` for a record of unknown size, whose boxes (from a
    detector) are already in decoded pixels."""
    if not (record.width and record.height):
        return 1.0, 1.0
    return image.shape[1] / record.width, image.shape[0] / record.height
