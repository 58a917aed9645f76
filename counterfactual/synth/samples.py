"""What a shard holds, and one reader for it (the writer is :mod:`counterfactual.synth.shards`).

A run folder ``OUT`` (a local folder or an fsspec URL, see :mod:`counterfactual.fs`) holds
``shard-NNNNNN.tar`` with, per sample, ``KEY.jpg`` (the edited picture), ``KEY.txt`` (the new
caption, UTF-8) and ``KEY.json``: a :class:`SampleMeta`, written by
:func:`counterfactual.synth.steps.sample_meta` as ``SampleMeta.to_dict()``. A shard is committed once
its ``shard-NNNNNN_stats.json`` exists (written last); :func:`shard_paths` lists those only.
A run made with ``--pairs`` adds ``KEY.orig.jpg`` (the original picture) and ``KEY.mask.png``
(8-bit, 255 = removed) and the json's ``mask`` (:class:`MaskMeta`, :func:`rebuild_mask`).

:func:`read_samples` yields every sample of the shards in order, as a :class:`SampleRow`, or as
a failed :class:`~counterfactual.records.Status` when it cannot be read (``bad-metadata``: no
json, not JSON, or not a :class:`SampleMeta`; ``bad-shard``: the tar itself is unreadable from
there on). :func:`iter_samples` yields the rows and raises on the first failure;
:func:`sample_failures` lists the failures. With ``images=False`` only tar headers and the
``json``/``txt`` members are read: the JPEG data is skipped by seeking.

Boxes are ``xywh`` in the pixels of the written picture (``width`` x ``height``), numbers kept as
the json holds them (so ``from_dict(d).to_dict() == d`` and the bytes of a rewritten json match).
No json object is keyed by data: per-class parts (the plan's evidence, the verifier's checks) are
lists of records ``{"class": name, ...}``, so every sample has one schema (Arrow, Hugging Face
``datasets``). Shards written before hold them as objects keyed by class name; ``from_dict``
reads both and gives the lists (there is no format number: the layout is told by its type).
"""

from __future__ import annotations

import copy
import json
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from counterfactual import fs
from counterfactual.method.verify import VerifySummary
from counterfactual.readers.corpus import member_key_field
from counterfactual.records import (
    ImageRecord,
    ImageSource,
    Origin,
    Status,
    source_from_dict,
    source_to_dict,
)

Box = tuple[float, float, float, float]
"""``(x, y, w, h)`` pixels."""

BAD_METADATA = "bad-metadata"
BAD_SHARD = "bad-shard"
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")

T = TypeVar("T")


# --- checking json values: each names the key path it is at ---------------------------------


def _check(ok: bool, path: str, expected: str, value: Any) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ValueError(f"sample json: {path} must be {expected}, got {shown}")


def _str(value: Any, path: str) -> str:
    _check(isinstance(value, str), path, "a string", value)
    return value


def _opt_str(value: Any, path: str) -> str | None:
    _check(value is None or isinstance(value, str), path, "a string or null", value)
    return value


def _int(value: Any, path: str) -> int:
    _check(isinstance(value, int) and not isinstance(value, bool), path, "an integer", value)
    return value


def _num(value: Any, path: str) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    _check(ok, path, "a number", value)
    return value


def _opt_num(value: Any, path: str) -> float | None:
    return None if value is None else _num(value, path)


def _bool(value: Any, path: str) -> bool:
    _check(isinstance(value, bool), path, "true or false", value)
    return value


def _opt_bool(value: Any, path: str) -> bool | None:
    _check(value is None or isinstance(value, bool), path, "true, false or null", value)
    return value


def _dict(value: Any, path: str) -> dict[str, Any]:
    _check(isinstance(value, dict), path, "an object", value)
    return value


def _opt_dict(value: Any, path: str) -> dict[str, Any] | None:
    _check(value is None or isinstance(value, dict), path, "an object or null", value)
    return value


def _list(value: Any, path: str, item: Callable[[Any, str], T]) -> tuple[T, ...]:
    _check(isinstance(value, list), path, "a list", value)
    return tuple(item(v, f"{path}[{i}]") for i, v in enumerate(value))


def _strs(value: Any, path: str) -> tuple[str, ...]:
    return _list(value, path, _str)


def _box(value: Any, path: str) -> Box:
    _check(isinstance(value, list) and len(value) == 4, path, "[x, y, w, h]", value)
    x, y, w, h = (_num(v, f"{path}[{i}]") for i, v in enumerate(value))
    return (x, y, w, h)


def _boxes(value: Any, path: str) -> tuple[Box, ...]:
    return _list(value, path, _box)


def _keys(d: Any, path: str, required: Iterable[str], optional: Iterable[str] = ()) -> None:
    """``d`` is an object with every ``required`` key and nothing beyond ``optional``."""
    _check(isinstance(d, dict), path or "the sample json", "an object", d)
    prefix = f"{path}." if path else ""
    for key in required:
        if key not in d:
            raise ValueError(f"sample json: missing key {prefix}{key}")
    extra = sorted(set(d) - set(required) - set(optional))
    if extra:
        raise ValueError(f"sample json: unexpected key {prefix}{extra[0]}")


def _copy(d: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if d is None else copy.deepcopy(d)


# --- the spec ----------------------------------------------------------------------------------


# Per-class evidence: a list of records with these keys (older shards: an object keyed by class).
_EVIDENCE_RECORDS = {
    "co_removal": (("ratio", _num), ("alpha2", _num), ("co_removed", _bool)),
    "keep_overlap": (("ratio", _num), ("alpha1", _num), ("ok", _bool)),
}
_PMI_RECORD = (("pmi", _num),)


def _class_records(
    value: Any, path: str, fields: tuple[tuple[str, Callable[[Any, str], Any]], ...]
) -> list[dict[str, Any]]:
    """Per-class records ``[{"class": c, field: ...}, ...]``, from that list or from the older
    object keyed by class name (``{c: {field: ...}}``; with one field, ``{c: value}``).
    ``ValueError`` naming the key path when a record is malformed or a class repeats."""
    if isinstance(value, dict):
        if len(fields) == 1 and not all(isinstance(v, dict) for v in value.values()):
            value = [{"class": c, fields[0][0]: v} for c, v in value.items()]
        else:
            value = [{"class": c, **_dict(v, f"{path}.{c}")} for c, v in value.items()]
    _check(isinstance(value, list), path, "a list of per-class records", value)
    out, seen = [], set()
    names = ("class", *(name for name, _ in fields))
    for i, record in enumerate(value):
        at = f"{path}[{i}]"
        _keys(record, at, names)
        name = _str(record["class"], f"{at}.class")
        if name in seen:
            raise ValueError(f"sample json: {at}.class {name!r} repeats")
        seen.add(name)
        out.append({"class": name, **{k: check(record[k], f"{at}.{k}") for k, check in fields}})
    return out


def _evidence(value: Any, path: str) -> dict[str, Any]:
    """A plan's evidence with its per-class parts as lists of records (see
    :meth:`counterfactual.method.selection.RemovalPlan.to_dict`); other keys are kept as they are."""
    out = copy.deepcopy(_dict(value, path))
    for key, fields in _EVIDENCE_RECORDS.items():
        if key in out:
            out[key] = _class_records(out[key], f"{path}.{key}", fields)
    if isinstance(out.get("pmi"), dict) and "with_kept" in out["pmi"]:
        pmi = out["pmi"]
        pmi["with_kept"] = _class_records(pmi["with_kept"], f"{path}.pmi.with_kept", _PMI_RECORD)
    return out


@dataclass(frozen=True, slots=True)
class PlanMeta:
    """The removal plan (:meth:`counterfactual.method.selection.RemovalPlan.to_dict`): ``evidence``
    holds each ratio with its threshold (and the PMI under the ``spurious`` policy);
    ``mask_boxes`` are the removed boxes (``xywh``, clipped to the picture).

    The per-class evidence (``co_removal``, ``keep_overlap``, ``pmi.with_kept``) is a list of
    records ``{"class": name, ...}``; :meth:`from_dict` also reads the older layout (objects
    keyed by class name) and gives the list, so :meth:`to_dict` always writes the current one.
    """

    image_id: str
    target: str
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    kind: str
    valid: bool
    rejected_by: str | None
    evidence: dict[str, Any]
    mask_boxes: tuple[Box, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "image_id": self.image_id,
            "target": self.target,
            "removed": list(self.removed),
            "kept": list(self.kept),
            "kind": self.kind,
            "valid": self.valid,
            "rejected_by": self.rejected_by,
            "evidence": copy.deepcopy(self.evidence),
            "mask_boxes": [list(b) for b in self.mask_boxes],
        }

    def ratios(self, part: str) -> dict[str, float]:
        """``class -> ratio`` of ``co_removal`` or ``keep_overlap`` (``pmi`` for the PMI with
        each kept class), in the plan's class order; empty when absent."""
        if part == "pmi":
            records = self.evidence.get("pmi", {}).get("with_kept", [])
            return {r["class"]: r["pmi"] for r in records}
        if part not in _EVIDENCE_RECORDS:
            raise ValueError(f"evidence part {part!r} is not one of co_removal, keep_overlap, pmi")
        return {r["class"]: r["ratio"] for r in self.evidence.get(part, [])}

    @classmethod
    def from_dict(cls, d: Any, path: str = "plan") -> PlanMeta:
        _keys(d, path, _fields(cls))
        return cls(
            _str(d["image_id"], f"{path}.image_id"),
            _str(d["target"], f"{path}.target"),
            _strs(d["removed"], f"{path}.removed"),
            _strs(d["kept"], f"{path}.kept"),
            _str(d["kind"], f"{path}.kind"),
            _bool(d["valid"], f"{path}.valid"),
            _opt_str(d["rejected_by"], f"{path}.rejected_by"),
            _evidence(d["evidence"], f"{path}.evidence"),
            _boxes(d["mask_boxes"], f"{path}.mask_boxes"),
        )


NULLABLE_TYPES: dict[str, Any] = {
    "split": "string",
    "plan.rejected_by": "string",
    "objects[].score": "float64",
    "verify.text": {"struct": {"names_removed": {"list": "string"}, "names_kept": "bool"}},
    "verify.text.names_kept": "bool",
}
"""The json's keys that may hold ``None``, by path (:func:`~counterfactual.json_types.declare`),
with the type they hold when set: a run whose samples all hold ``None`` there (a dataset
without splits; a written plan is never rejected) still declares the real type."""


@dataclass(frozen=True, slots=True)
class DetectedObject:
    """One object the detector kept: ``bbox`` ``xywh`` pixels, ``score`` its confidence."""

    category: str
    bbox: Box
    score: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "bbox": list(self.bbox), "score": self.score}

    @classmethod
    def from_dict(cls, d: Any, path: str) -> DetectedObject:
        _keys(d, path, ("category", "bbox", "score"))
        return cls(
            _str(d["category"], f"{path}.category"),
            _box(d["bbox"], f"{path}.bbox"),
            _opt_num(d["score"], f"{path}.score"),
        )


@dataclass(frozen=True, slots=True)
class DetectionMeta:
    """With detected boxes (synth's ``Detect`` step): the detector
    (:meth:`counterfactual.method.detect.Detector.describe`), every object it kept, and the valid
    targets the policy did not draw. Stored as three top-level keys of the json."""

    detector: dict[str, Any]
    objects: tuple[DetectedObject, ...]
    not_drawn: tuple[str, ...]

    KEYS = ("detector", "objects", "not_drawn")

    def to_dict(self) -> dict[str, Any]:
        return {
            "detector": copy.deepcopy(self.detector),
            "objects": [o.to_dict() for o in self.objects],
            "not_drawn": list(self.not_drawn),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DetectionMeta:
        for key in cls.KEYS:
            if key not in d:
                raise ValueError(f"sample json: missing key {key} (detections need all of "
                                 f"{', '.join(cls.KEYS)})")  # fmt: skip
        return cls(
            copy.deepcopy(_dict(d["detector"], "detector")),
            _list(d["objects"], "objects", DetectedObject.from_dict),
            _strs(d["not_drawn"], "not_drawn"),
        )


MASK_BOXES = ("dataset", "detector")


@dataclass(frozen=True, slots=True)
class MaskMeta:
    """How a ``--pairs`` sample's mask (``mask.png``, 255 = removed) was made, so it can be
    made again (:func:`rebuild_mask`): ``source`` the mask source (``box``: the plan's
    ``mask_boxes``; ``segmentation``: the removed objects' segmentations, boxes for those
    without), ``dilate`` the pixels it was grown by, ``boxes`` where the boxes came from
    (``dataset`` annotations or the ``detector``) and ``frame`` the ``[width, height]`` those
    boxes are in (the annotated size; the mask is at the picture's, boxes scaled to it)."""

    source: str
    dilate: int
    boxes: str
    frame: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dilate": self.dilate,
            "boxes": self.boxes,
            "frame": list(self.frame),
        }

    @classmethod
    def from_dict(cls, d: Any, path: str = "mask") -> MaskMeta:
        _keys(d, path, _fields(cls))
        frame = d["frame"]
        _check(isinstance(frame, list) and len(frame) == 2, f"{path}.frame", "[w, h]", frame)
        boxes = _str(d["boxes"], f"{path}.boxes")
        _check(boxes in MASK_BOXES, f"{path}.boxes", f"one of {MASK_BOXES}", boxes)
        return cls(
            _str(d["source"], f"{path}.source"),
            _int(d["dilate"], f"{path}.dilate"),
            boxes,
            (_int(frame[0], f"{path}.frame[0]"), _int(frame[1], f"{path}.frame[1]")),
        )


def rebuild_mask(meta: SampleMeta) -> np.ndarray:
    """The mask of a ``--pairs`` sample made again from its json alone: ``(height, width)``
    ``uint8``, 255 = removed, equal to its ``mask.png``. Only for mask source ``box`` (a
    segmentation mask needs the dataset's polygons: read ``mask.png``); ``ValueError``
    otherwise, or for a sample without ``mask``."""
    from counterfactual.method.masks import box_mask, dilate

    made = meta.mask
    if made is None:
        raise ValueError(f"sample {meta.key} records no mask (made without --pairs)")
    if made.source != "box":
        raise ValueError(
            f"sample {meta.key}: a {made.source} mask needs the dataset's segmentations; "
            "read its mask.png"
        )
    fw, fh = made.frame
    sx, sy = (meta.width / fw, meta.height / fh) if fw and fh else (1.0, 1.0)
    boxes = [(x * sx, y * sy, w * sx, h * sy) for x, y, w, h in meta.mask_boxes]
    return dilate(box_mask(meta.height, meta.width, boxes), made.dilate)


@dataclass(frozen=True, slots=True)
class BestOfNMeta:
    """Best-of-n inpainting: the candidate kept (index), its seed, and every candidate's score
    (lower is a cleaner removal; ``None``: its output failed its check, non-finite or blank)."""

    picked: int
    seed: int
    scores: tuple[float | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"picked": self.picked, "seed": self.seed, "scores": list(self.scores)}

    @classmethod
    def from_dict(cls, d: Any, path: str = "best_of_n") -> BestOfNMeta:
        _keys(d, path, _fields(cls))
        return cls(
            _int(d["picked"], f"{path}.picked"),
            _int(d["seed"], f"{path}.seed"),
            _list(d["scores"], f"{path}.scores", _opt_num),
        )


@dataclass(frozen=True, slots=True)
class RemovalCheck:
    """A removed class on its box before and after the edit: rank 1 = most similar class."""

    rank_before: int
    rank_after: int
    prob_before: float
    prob_after: float
    removed: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank_before": self.rank_before,
            "rank_after": self.rank_after,
            "prob_before": self.prob_before,
            "prob_after": self.prob_after,
            "removed": self.removed,
        }

    @classmethod
    def from_dict(cls, d: Any, path: str) -> RemovalCheck:
        _keys(d, path, _fields(cls))
        return cls(
            _int(d["rank_before"], f"{path}.rank_before"),
            _int(d["rank_after"], f"{path}.rank_after"),
            _num(d["prob_before"], f"{path}.prob_before"),
            _num(d["prob_after"], f"{path}.prob_after"),
            _bool(d["removed"], f"{path}.removed"),
        )


@dataclass(frozen=True, slots=True)
class RetentionCheck:
    """A kept class on its box after the edit."""

    rank: int
    prob: float
    kept: bool

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "prob": self.prob, "kept": self.kept}

    @classmethod
    def from_dict(cls, d: Any, path: str) -> RetentionCheck:
        _keys(d, path, _fields(cls))
        return cls(
            _int(d["rank"], f"{path}.rank"),
            _num(d["prob"], f"{path}.prob"),
            _bool(d["kept"], f"{path}.kept"),
        )


@dataclass(frozen=True, slots=True)
class TextCheckMeta:
    """Removed classes the new caption names; whether it names a kept class (``None``: the text
    method need not)."""

    names_removed: tuple[str, ...]
    names_kept: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {"names_removed": list(self.names_removed), "names_kept": self.names_kept}

    @classmethod
    def from_dict(cls, d: Any, path: str) -> TextCheckMeta:
        _keys(d, path, _fields(cls))
        return cls(
            _strs(d["names_removed"], f"{path}.names_removed"),
            _opt_bool(d["names_kept"], f"{path}.names_kept"),
        )


@dataclass(frozen=True, slots=True)
class VerifyMeta:
    """The verifier's verdict (:meth:`counterfactual.method.verify.VerifyResult.to_dict`), per class.

    ``removal``/``retention`` are by class name here; the json holds them as lists of records
    ``{"class": name, ...}`` (one schema for every sample); :meth:`from_dict` reads both that
    and the older objects keyed by class name."""

    passed: bool
    failed: tuple[str, ...]
    removal: dict[str, RemovalCheck]
    retention: dict[str, RetentionCheck]
    text: TextCheckMeta | None
    model: str
    k: int
    retention_k: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "failed": list(self.failed),
            "removal": [{"class": c, **r.to_dict()} for c, r in self.removal.items()],
            "retention": [{"class": c, **r.to_dict()} for c, r in self.retention.items()],
            "text": None if self.text is None else self.text.to_dict(),
            "model": self.model,
            "k": self.k,
            "retention_k": self.retention_k,
        }

    @classmethod
    def from_dict(cls, d: Any, path: str = "verify") -> VerifyMeta:
        _keys(d, path, _fields(cls))
        return cls(
            _bool(d["passed"], f"{path}.passed"),
            _strs(d["failed"], f"{path}.failed"),
            _by_class(d["removal"], f"{path}.removal", RemovalCheck.from_dict),
            _by_class(d["retention"], f"{path}.retention", RetentionCheck.from_dict),
            None if d["text"] is None else TextCheckMeta.from_dict(d["text"], f"{path}.text"),
            _str(d["model"], f"{path}.model"),
            _int(d["k"], f"{path}.k"),
            _int(d["retention_k"], f"{path}.retention_k"),
        )


def _by_class(value: Any, path: str, item: Callable[[Any, str], T]) -> dict[str, T]:
    """``class -> item`` from a list of records ``{"class": name, ...}`` or from the older
    object keyed by class name; ``ValueError`` naming the key path."""
    if isinstance(value, dict):
        return {c: item(r, f"{path}.{c}") for c, r in value.items()}
    _check(isinstance(value, list), path, "a list of per-class records", value)
    out: dict[str, T] = {}
    for i, record in enumerate(value):
        at = f"{path}[{i}]"
        rest = dict(_dict(record, at))
        if "class" not in rest:
            raise ValueError(f"sample json: missing key {at}.class")
        name = _str(rest.pop("class"), f"{at}.class")
        if name in out:
            raise ValueError(f"sample json: {at}.class {name!r} repeats")
        out[name] = item(rest, at)
    return out


@dataclass(frozen=True, slots=True)
class SampleMeta:
    """A sample's ``KEY.json``: everything needed to trace and reproduce it (SPEC 1.4).

    ``width``/``height`` are the written picture's; ``mask_pixels`` counts the repainted pixels;
    ``image_method``/``text_method`` are the steps' ``describe()`` dicts (their keys vary by
    backend); ``seed`` is the run's seed, ``sample_seed`` this item's. Optional parts, absent from
    the json when ``None``: ``source`` (the picture lies inside a tar or Parquet file),
    ``origin`` (the url, downloader key, status and hash img2dataset recorded),
    ``detection`` (boxes from the detector: top-level ``detector``, ``objects``, ``not_drawn``),
    ``best_of_n``, ``verify`` and ``mask`` (``--pairs``: how ``mask.png`` was made,
    :class:`MaskMeta`); ``caption_cleaned`` (control or invisible characters the reader
    removed from the original caption, :mod:`counterfactual.readers.clean`) is absent when 0.
    """

    key: str
    dataset: str
    split: str | None
    image_id: str
    file: str
    width: int
    height: int
    caption_id: str
    original_caption: str
    caption: str
    removed_phrases: tuple[str, ...]
    plan: PlanMeta
    mask_boxes: tuple[Box, ...]
    mask_pixels: int
    image_method: dict[str, Any] | None
    text_method: dict[str, Any] | None
    seed: int
    sample_seed: int
    counterfactual_version: str
    source: ImageSource | None = None
    detection: DetectionMeta | None = None
    best_of_n: BestOfNMeta | None = None
    verify: VerifyMeta | None = None
    caption_cleaned: int = 0
    origin: Origin | None = None
    mask: MaskMeta | None = None

    def source_record(self) -> ImageRecord | None:
        """A record that loads the original picture from inside its tar or Parquet file (a
        corpus sample; size unknown, so its boxes are the decoded picture's), else ``None``."""
        if self.source is None:
            return None
        return ImageRecord(self.image_id, self.file, 0, 0, (), (), source=self.source)

    def to_dict(self) -> dict[str, Any]:
        """The json, key for key as :func:`counterfactual.synth.steps.sample_meta` writes it."""
        return {
            "key": self.key,
            "dataset": self.dataset,
            "split": self.split,
            "image_id": self.image_id,
            "file": self.file,
            **({"source": source_to_dict(self.source)} if self.source is not None else {}),
            **({"origin": self.origin.to_dict()} if self.origin is not None else {}),
            "width": self.width,
            "height": self.height,
            "caption_id": self.caption_id,
            "original_caption": self.original_caption,
            "caption": self.caption,
            **({"caption_cleaned": self.caption_cleaned} if self.caption_cleaned else {}),
            "removed_phrases": list(self.removed_phrases),
            "plan": self.plan.to_dict(),
            "mask_boxes": [list(b) for b in self.mask_boxes],
            **(self.detection.to_dict() if self.detection is not None else {}),
            "mask_pixels": self.mask_pixels,
            "image_method": _copy(self.image_method),
            **({"best_of_n": self.best_of_n.to_dict()} if self.best_of_n is not None else {}),
            "text_method": _copy(self.text_method),
            "seed": self.seed,
            "sample_seed": self.sample_seed,
            "counterfactual_version": self.counterfactual_version,
            **({"verify": self.verify.to_dict()} if self.verify is not None else {}),
            **({"mask": self.mask.to_dict()} if self.mask is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> SampleMeta:
        """The inverse of :meth:`to_dict`; ``ValueError`` naming the key (``plan.removed``,
        ``verify.removal.dog.rank_after``) when one is missing, unexpected or of the wrong
        type."""
        _keys(d, "", _REQUIRED, _OPTIONAL)
        source = None
        if "source" in d:
            try:
                source = source_from_dict(_dict(d["source"], "source"))
            except ValueError as err:
                raise ValueError(f"sample json: source: {err}") from err
        has_detection = any(k in d for k in DetectionMeta.KEYS)
        return cls(
            key=_str(d["key"], "key"),
            dataset=_str(d["dataset"], "dataset"),
            split=_opt_str(d["split"], "split"),
            image_id=_str(d["image_id"], "image_id"),
            file=_str(d["file"], "file"),
            width=_int(d["width"], "width"),
            height=_int(d["height"], "height"),
            caption_id=_str(d["caption_id"], "caption_id"),
            original_caption=_str(d["original_caption"], "original_caption"),
            caption=_str(d["caption"], "caption"),
            removed_phrases=_strs(d["removed_phrases"], "removed_phrases"),
            plan=PlanMeta.from_dict(d["plan"]),
            mask_boxes=_boxes(d["mask_boxes"], "mask_boxes"),
            mask_pixels=_int(d["mask_pixels"], "mask_pixels"),
            image_method=_copy(_opt_dict(d["image_method"], "image_method")),
            text_method=_copy(_opt_dict(d["text_method"], "text_method")),
            seed=_int(d["seed"], "seed"),
            sample_seed=_int(d["sample_seed"], "sample_seed"),
            counterfactual_version=_str(d["counterfactual_version"], "counterfactual_version"),
            source=source,
            detection=DetectionMeta.from_dict(d) if has_detection else None,
            best_of_n=BestOfNMeta.from_dict(d["best_of_n"]) if "best_of_n" in d else None,
            verify=VerifyMeta.from_dict(d["verify"]) if "verify" in d else None,
            caption_cleaned=_cleaned(d.get("caption_cleaned", 0)),
            origin=_origin(d["origin"]) if "origin" in d else None,
            mask=MaskMeta.from_dict(d["mask"]) if "mask" in d else None,
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> SampleMeta:
        """Parse a ``KEY.json`` member; ``ValueError`` for invalid JSON or a malformed sample."""
        try:
            d = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"sample json: not JSON: {err}") from err
        return cls.from_dict(d)


def _cleaned(value: Any) -> int:
    count = _int(value, "caption_cleaned")
    _check(count >= 0, "caption_cleaned", "a count >= 0", value)
    return count


def _origin(value: Any) -> Origin:
    d = _dict(value, "origin")
    _keys(d, "origin", (), Origin.FIELDS)
    fields = {f: _str(v, f"origin.{f}") for f, v in d.items()}
    return Origin(**fields)


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(cls.__dataclass_fields__)  # type: ignore[attr-defined]


_OPTIONAL_FIELDS = (
    "source",
    "detection",
    "best_of_n",
    "verify",
    "caption_cleaned",
    "origin",
    "mask",
)
_REQUIRED = tuple(f for f in _fields(SampleMeta) if f not in _OPTIONAL_FIELDS)
_OPTIONAL = (
    "source",
    *DetectionMeta.KEYS,
    "best_of_n",
    "verify",
    "caption_cleaned",
    "origin",
    "mask",
)


# --- reading shards ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One sample as read from a shard. ``shard`` is the shard's path (or URL); ``caption`` is
    the ``txt`` member (``None`` when absent); ``jpg`` the picture's bytes (``None`` when read
    with ``images=False`` or when the sample has no ``jpg``). ``jpg_at``/``json_at`` are the
    members' ``(offset, size)`` in the (uncompressed) tar, for reading them again later with one
    seek (``None`` when absent)."""

    shard: str | Path
    key: str
    meta: SampleMeta
    caption: str | None
    jpg: bytes | None = None
    jpg_at: tuple[int, int] | None = None
    json_at: tuple[int, int] | None = None

    @property
    def shard_name(self) -> str:
        return fs.name(self.shard)


_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{6,})\.tar$")


def shard_paths(out: fs.PathLike, prefix: str = "shard") -> list[str | Path]:
    """The committed shards of the run in ``out`` (a folder or URL), in index order:
    ``{prefix}-NNNNNN.tar`` whose ``{prefix}-NNNNNN_stats.json`` exists (the stats file is written
    last: a tar without it is unfinished and a rerun redoes it)."""
    names = fs.listdir(out)
    present = set(names)
    found: list[tuple[int, str]] = []
    for name in names:
        m = _SHARD.match(name)
        if m and m["prefix"] == prefix and f"{prefix}-{m['index']}_stats.json" in present:
            found.append((int(m["index"]), name))
    return [fs.join(out, name) for _, name in sorted(found)]


def _shards(source: fs.PathLike | Sequence[fs.PathLike]) -> list[str | Path]:
    if isinstance(source, str | os.PathLike):
        return shard_paths(source)
    return [fs.as_path(s) for s in source]


def read_samples(
    source: fs.PathLike | Sequence[fs.PathLike], *, images: bool = True
) -> Iterator[SampleRow | Status]:
    """Every sample of ``source`` (a run folder or URL: its committed shards, see
    :func:`shard_paths`; or a list of shard paths or URLs), in shard and tar order: a
    :class:`SampleRow`, or a failed ``Status`` with reason ``bad-metadata`` (no json member,
    not JSON, not a :class:`SampleMeta`: ``detail`` names the key) or ``bad-shard`` (the tar
    cannot be read from there on; ``image_id`` is the shard's path, nothing more comes from it).
    Members are grouped into samples as WebDataset groups them (consecutive members sharing the
    key before the first dot of the base name)."""
    for shard in _shards(source):
        yield from read_shard(shard, images=images)


def iter_samples(
    source: fs.PathLike | Sequence[fs.PathLike], *, images: bool = True
) -> Iterator[SampleRow]:
    """:func:`read_samples` without the failures: ``ValueError`` (its detail) on the first."""
    for row in read_samples(source, images=images):
        if isinstance(row, Status):
            raise ValueError(f"{row.reason}: {row.detail}")
        yield row


def sample_failures(source: fs.PathLike | Sequence[fs.PathLike]) -> list[Status]:
    """The samples of ``source`` that cannot be read (see :func:`read_samples`); pictures are
    not read."""
    return [r for r in read_samples(source, images=False) if isinstance(r, Status)]


def read_shard(shard: fs.PathLike, *, images: bool = True) -> Iterator[SampleRow | Status]:
    """The samples of one shard (see :func:`read_samples`), read through :func:`fs.open_file`."""
    name = fs.name(shard)
    path = fs.as_path(shard)
    group: _Group | None = None
    try:
        with fs.open_file(path, "rb") as fh:
            compressed = fh.read(6).startswith(_COMPRESSED_MAGIC)
            size = fh.seek(0, os.SEEK_END)
            fh.seek(0)
            mode = "r:*" if compressed else "r:"
            with tarfile.open(fileobj=fh, mode=mode) as tar:
                for info in tar:
                    key_field = member_key_field(info)
                    if key_field is None:
                        continue
                    if not compressed and info.offset_data + info.size > size:
                        raise tarfile.ReadError(f"member {info.name} is cut off")
                    key, ext = key_field
                    if group is not None and group.key != key:
                        yield group.row(path, name)
                        group = None
                    if group is None:
                        group = _Group(key)
                    at = (info.offset_data, info.size)
                    if ext == "jpg":
                        group.jpg_at = at
                        if images:
                            group.jpg = _member(tar, info)
                    elif ext in ("json", "txt"):
                        group.members[ext] = (at, _member(tar, info))
                if group is not None:
                    yield group.row(path, name)
                    group = None
    except (tarfile.TarError, OSError, EOFError) as err:
        detail = f"{name}: {err}" + (f" (after {group.key})" if group is not None else "")
        yield Status(os.fspath(shard), "failed", BAD_SHARD, detail)


def _member(tar: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    data = tar.extractfile(info)
    if data is None:  # pragma: no cover - member_key_field keeps regular files only
        raise tarfile.TarError(f"{info.name} is not a file")
    return data.read()


class _Group:
    """The members of one sample read so far."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.jpg: bytes | None = None
        self.jpg_at: tuple[int, int] | None = None
        self.members: dict[str, tuple[tuple[int, int], bytes]] = {}

    def row(self, shard: str | Path, name: str) -> SampleRow | Status:
        def bad(detail: str) -> Status:
            return Status(self.key, "failed", BAD_METADATA, f"{name}: {detail}", key=self.key)

        if "json" not in self.members:
            return bad(f"{self.key} has no json member")
        json_at, data = self.members["json"]
        try:
            meta = SampleMeta.from_json(data)
        except ValueError as err:
            return bad(f"{self.key}.json: {err}")
        caption = None
        if "txt" in self.members:
            try:
                caption = self.members["txt"][1].decode("utf-8")
            except UnicodeDecodeError as err:
                return bad(f"{self.key}.txt: not UTF-8: {err}")
        return SampleRow(shard, self.key, meta, caption, self.jpg, self.jpg_at, json_at)


def read_member(shard: fs.PathLike, at: tuple[int, int]) -> bytes:
    """``size`` bytes at ``offset`` of ``shard`` (``at`` from :class:`SampleRow`), one seek."""
    with fs.open_file(shard, "rb") as fh:
        fh.seek(at[0])
        return fh.read(at[1])


# --- summaries -------------------------------------------------------------------------------


def verify_summary_from_samples(
    source: fs.PathLike | Sequence[fs.PathLike],
    statuses: Iterable[Status] = (),
    *,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """What ``manifest.json`` records under ``verify``
    (:meth:`counterfactual.method.verify.VerifySummary.to_dict`): the verdicts in the json of the
    samples of ``source`` (as :func:`read_samples` takes it; pictures not read) and the samples
    dropped with a ``verify-*`` reason, from ``statuses`` and/or ``counts`` (``status:reason`` ->
    rows, as ``manifest.json`` counts them). ``ValueError`` on a sample that cannot be read."""
    summary = VerifySummary()
    for row in iter_samples(source, images=False):
        if row.meta.verify is not None:
            summary.add(row.meta.verify.to_dict())
    for s in statuses:
        if s.status == "failed" and (s.reason or "").startswith("verify-"):
            summary.dropped[s.reason or ""] += 1
    for name, n in (counts or {}).items():
        if name.startswith("failed:verify-"):
            summary.dropped[name.split(":", 1)[1]] += n
    return summary.to_dict()


def synthetic_class_sets(out_dir: str | Path) -> tuple[list[frozenset[str]], int]:
    """The images of a run's committed shards (:func:`shard_paths` of
    ``out_dir``, a folder or URL) as class sets, and the number of samples read.

    Each synthetic image contains the kept classes of its plan (``plan.kept`` of the sample's
    ``json``). A plan written with several captions is one image: samples are deduplicated by
    source image and removed classes, as the evaluation queries are. Raises ``ValueError`` on a
    sample whose ``json`` is not a sample's (no plan), and ``FileNotFoundError`` when there are
    no committed shards. Pictures are not read.
    """
    shards = shard_paths(out_dir)
    if not shards:
        raise FileNotFoundError(f"no shard-*.tar with its _stats.json (committed) in {out_dir}")
    seen: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}
    samples = 0
    for row in iter_samples(shards, images=False):
        samples += 1
        plan = row.meta.plan
        seen.setdefault((row.meta.image_id, plan.removed), frozenset(plan.kept))
    return list(seen.values()), samples


__all__: Sequence[str] = (
    "BAD_METADATA",
    "BAD_SHARD",
    "BestOfNMeta",
    "Box",
    "DetectedObject",
    "DetectionMeta",
    "PlanMeta",
    "RemovalCheck",
    "RetentionCheck",
    "SampleMeta",
    "SampleRow",
    "TextCheckMeta",
    "VerifyMeta",
    "iter_samples",
    "read_member",
    "read_samples",
    "read_shard",
    "sample_failures",
    "shard_paths",
    "synthetic_class_sets",
    "verify_summary_from_samples",
)
