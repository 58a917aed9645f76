"""What a shard holds, and one reader for it (the writer is :mod:`counterfactual.shards.shards`).

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

The json is one schema, msgspec structs (:class:`Record`): decoding checks every key and type
and a ``ValueError`` names the path of the first bad one (``$.plan.mask_boxes[0]``).
Boxes are ``xywh`` in the pixels of the written picture (``width`` x ``height``), numbers kept as
the json holds them (so ``from_dict(d).to_dict() == d`` and the bytes of a rewritten json match).
No json object is keyed by data: per-class parts (the plan's evidence, the verifier's checks) are
lists of records ``{"class": name, ...}``, so every sample has one schema (Arrow, Hugging Face
``datasets``). Shards written before hold them as objects keyed by class name; ``from_dict``
reads both and gives the lists (there is no format number: the layout is told by its type).
"""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from counterfactual import fs
from counterfactual.method.selection import RemovalPlan
from counterfactual.method.verify import VerifyResult, VerifySummary, round_prob
from counterfactual.readers.corpus import member_key_field
from counterfactual.records import ImageRecord, ImageSource, Origin, Status

BAD_METADATA = "bad-metadata"
BAD_SHARD = "bad-shard"
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")

T = TypeVar("T")


# --- the spec: msgspec structs, field order = key order ----------------------------------------


Number = int | float
"""A json number kept as the json holds it (``1`` stays an int), so the bytes of a rewritten
json match."""

Box = tuple[Number, Number, Number, Number]
"""``(x, y, w, h)`` pixels."""


class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A part of the sample json: decoded by :meth:`from_dict` (``ValueError`` naming the key
    path, ``$.plan.mask_boxes[0]``), written by :meth:`to_dict` (fresh lists and dicts)."""

    def to_dict(self) -> dict[str, Any]:
        return _builtins(self)

    @classmethod
    def from_dict(cls: type[R], d: Any) -> R:
        return _convert(d, cls)


R = TypeVar("R", bound=Record)


def _convert(value: Any, kind: type[T]) -> T:
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as err:
        raise ValueError(f"sample json: {err}") from err


def _numpy_item(value: Any) -> Any:
    if isinstance(value, np.generic):  # a numpy scalar in a describe() dict: its Python value
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _builtins(value: Any) -> Any:
    """``value`` as plain JSON values: structs as dicts in field order, tuples as lists."""
    return _lists(msgspec.to_builtins(value, enc_hook=_numpy_item))


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


def _unique(records: Iterable[Any], what: str) -> None:
    """``ValueError`` when two per-class records name the same class."""
    seen: set[str] = set()
    for i, r in enumerate(records):
        if r.name in seen:
            raise ValueError(f"{what}[{i}].class {r.name!r} repeats")
        seen.add(r.name)


class CoRemoval(Record):
    """Another class's overlap with the target's boxes, compared with ``alpha2``."""

    name: str = msgspec.field(name="class")
    ratio: Number
    alpha2: Number
    co_removed: bool


class KeepOverlap(Record):
    """A kept class's overlap with the removed boxes, compared with ``alpha1``."""

    name: str = msgspec.field(name="class")
    ratio: Number
    alpha1: Number
    ok: bool


class RemovedFraction(Record):
    """The removed boxes' share of the picture, compared with ``alpha3``."""

    ratio: Number
    alpha3: Number
    ok: bool


class PMIWith(Record):
    name: str = msgspec.field(name="class")
    pmi: Number


class PMIEvidence(Record):
    """``spurious`` policy: the PMI of the target with each kept class and their aggregate."""

    with_kept: tuple[PMIWith, ...]
    score: Number
    aggregate: str
    smoothing: Number

    def __post_init__(self) -> None:
        _unique(self.with_kept, "with_kept")


class Evidence(Record):
    """Each ratio of a plan with its threshold (:meth:`~counterfactual.method.selection.
    RemovalPlan.to_dict`); a part the plan does not have is absent (``UNSET``)."""

    co_removal: tuple[CoRemoval, ...] | UnsetType = UNSET
    keep_overlap: tuple[KeepOverlap, ...] | UnsetType = UNSET
    removed_fraction: RemovedFraction | UnsetType = UNSET
    pmi: PMIEvidence | UnsetType = UNSET

    def __post_init__(self) -> None:
        for part in ("co_removal", "keep_overlap"):
            records = getattr(self, part)
            if records is not UNSET:
                _unique(records, part)


class PlanMeta(Record):
    """The removal plan (:meth:`counterfactual.method.selection.RemovalPlan.to_dict`,
    :meth:`from_plan`): ``evidence`` holds each ratio with its threshold (and the PMI under the
    ``spurious`` policy); ``mask_boxes`` are the removed boxes (``xywh``, clipped to the
    picture). The per-class evidence is a list of records ``{"class": name, ...}``; the older
    layout (objects keyed by class name) is read by :meth:`SampleMeta.from_dict`."""

    image_id: str
    target: str
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    kind: str
    valid: bool
    rejected_by: str | None
    evidence: Evidence
    mask_boxes: tuple[Box, ...]

    @classmethod
    def from_dict(cls, d: Any) -> PlanMeta:
        """A plan's json, in the current or the older layout."""
        return _convert(_upgrade(d, _PLAN_KEYED), cls)

    @classmethod
    def from_plan(cls, plan: RemovalPlan) -> PlanMeta:
        """``plan`` as its sample json holds it, from its :class:`~counterfactual.method.
        selection.PlanRow` (no dict in between)."""
        row = plan.row()
        ev = row.evidence
        pmi = ev.pmi
        return cls(
            plan.image_id,
            row.target,
            tuple(row.removed),
            tuple(row.kept),
            row.kind,
            row.valid,
            row.rejected_by,
            Evidence(
                tuple(CoRemoval(r.name, r.ratio, r.alpha2, r.co_removed) for r in ev.co_removal),
                tuple(KeepOverlap(r.name, r.ratio, r.alpha1, r.ok) for r in ev.keep_overlap),
                RemovedFraction(
                    ev.removed_fraction.ratio, ev.removed_fraction.alpha3, ev.removed_fraction.ok
                ),
                UNSET
                if pmi is None
                else PMIEvidence(
                    tuple(PMIWith(r.name, r.pmi) for r in pmi.with_kept),
                    pmi.score,
                    pmi.aggregate,
                    pmi.smoothing,
                ),
            ),
            tuple((x, y, w, h) for x, y, w, h in plan.mask_boxes),
        )

    def ratios(self, part: str) -> dict[str, float]:
        """``class -> ratio`` of ``co_removal`` or ``keep_overlap`` (``pmi`` for the PMI with
        each kept class), in the plan's class order; empty when absent."""
        ev = self.evidence
        if part == "pmi":
            return {} if ev.pmi is UNSET else {r.name: r.pmi for r in ev.pmi.with_kept}
        if part not in ("co_removal", "keep_overlap"):
            raise ValueError(f"evidence part {part!r} is not one of co_removal, keep_overlap, pmi")
        records = getattr(ev, part)
        return {} if records is UNSET else {r.name: r.ratio for r in records}


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


class DetectedObject(Record):
    """One object the detector kept: ``bbox`` ``xywh`` pixels, ``score`` its confidence."""

    category: str
    bbox: Box
    score: Number | None


@dataclass(frozen=True, slots=True)
class DetectionMeta:
    """With detected boxes (synth's ``Detect`` step): the detector
    (:meth:`counterfactual.method.detect.Detector.describe`), every object it kept, and the valid
    targets the policy did not draw. Stored as three top-level keys of the json
    (:attr:`SampleMeta.detection`)."""

    detector: dict[str, Any]
    objects: tuple[DetectedObject, ...]
    not_drawn: tuple[str, ...]

    KEYS = ("detector", "objects", "not_drawn")


MASK_BOXES = ("dataset", "detector")


class MaskMeta(Record):
    """How a ``--pairs`` sample's mask (``mask.png``, 255 = removed) was made, so it can be
    made again (:func:`rebuild_mask`): ``source`` the mask source (``box``: the plan's
    ``mask_boxes``; ``segmentation``: the removed objects' segmentations, boxes for those
    without), ``dilate`` the pixels it was grown by, ``boxes`` where the boxes came from
    (``dataset`` annotations or the ``detector``, :data:`MASK_BOXES`) and ``frame`` the
    ``[width, height]`` those boxes are in (the annotated size; the mask is at the picture's,
    boxes scaled to it)."""

    source: str
    dilate: int
    boxes: Literal["dataset", "detector"]
    frame: tuple[int, int]


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


class BestOfNMeta(Record):
    """Best-of-n inpainting: the candidate kept (index), its seed, and every candidate's score
    (lower is a cleaner removal; ``None``: its output failed its check, non-finite or blank)."""

    picked: int
    seed: int
    scores: tuple[Number | None, ...]


class RemovalCheck(Record):
    """A removed class on its box before and after the edit: rank 1 = most similar class."""

    name: str = msgspec.field(name="class")
    rank_before: int
    rank_after: int
    prob_before: Number
    prob_after: Number
    removed: bool


class RetentionCheck(Record):
    """A kept class on its box after the edit."""

    name: str = msgspec.field(name="class")
    rank: int
    prob: Number
    kept: bool


class TextCheckMeta(Record):
    """Removed classes the new caption names; whether it names a kept class (``None``: the text
    method need not)."""

    names_removed: tuple[str, ...]
    names_kept: bool | None


class VerifyMeta(Record):
    """The verifier's verdict (:class:`counterfactual.method.verify.VerifyResult`,
    :meth:`from_result`): the per-class checks are lists of records ``{"class": name, ...}``
    (one schema for every sample; :meth:`SampleMeta.from_dict` also reads the older objects
    keyed by class name)."""

    passed: bool
    failed: tuple[str, ...]
    removal: tuple[RemovalCheck, ...]
    retention: tuple[RetentionCheck, ...]
    text: TextCheckMeta | None
    model: str
    k: int
    retention_k: int

    def __post_init__(self) -> None:
        _unique(self.removal, "removal")
        _unique(self.retention, "retention")

    @classmethod
    def from_dict(cls, d: Any) -> VerifyMeta:
        """A verdict's json, in the current or the older layout (:meth:`VerifyResult.to_dict
        <counterfactual.method.verify.VerifyResult.to_dict>`)."""
        return _convert(_upgrade(d, _VERIFY_KEYED), cls)

    @classmethod
    def from_result(cls, result: VerifyResult) -> VerifyMeta:
        """``result`` as its sample json holds it, probabilities rounded as
        :meth:`~counterfactual.method.verify.VerifyResult.to_dict` rounds them."""
        text = result.text
        return cls(
            result.passed,
            tuple(result.failed),
            tuple(
                RemovalCheck(
                    c,
                    r.before.rank,
                    r.after.rank,
                    round_prob(r.before.prob),
                    round_prob(r.after.prob),
                    r.removed,
                )
                for c, r in result.removal.items()
            ),
            tuple(
                RetentionCheck(c, r.score.rank, round_prob(r.score.prob), r.kept)
                for c, r in result.retention.items()
            ),
            None if text is None else TextCheckMeta(tuple(text.names_removed), text.names_kept),
            result.model,
            result.k,
            result.retention_k,
        )


class SampleMeta(Record, omit_defaults=True):
    """A sample's ``KEY.json``: everything needed to trace and reproduce it (SPEC 1.4).

    ``width``/``height`` are the written picture's; ``mask_pixels`` counts the repainted pixels;
    ``image_method``/``text_method`` are the steps' ``describe()`` dicts (their keys vary by
    backend); ``seed`` is the run's seed, ``sample_seed`` this item's. Optional parts, absent from
    the json when unset: ``source`` (the picture lies inside a tar or Parquet file),
    ``origin`` (the url, downloader key, status and hash img2dataset recorded),
    ``detector``/``objects``/``not_drawn`` (boxes from the detector, all three or none:
    :attr:`detection`), ``best_of_n``, ``verify`` and ``mask`` (``--pairs``: how ``mask.png``
    was made, :class:`MaskMeta`); ``caption_cleaned`` (control or invisible characters the
    reader removed from the original caption, :mod:`counterfactual.readers.clean`) is absent
    when 0; ``exif_orientation`` (the original's EXIF orientation, 2..8) and ``exif_frame``
    (``stored``: the pictures are the file's pixels as stored; ``oriented``: turned upright per
    the tag; boxes and masks lie on these pixels either way, :mod:`counterfactual.shards.frames`)
    are absent, both, for an untagged picture (and in shards written before them).
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
    origin: Origin | None = None
    caption_cleaned: Annotated[int, msgspec.Meta(ge=0)] = 0
    exif_orientation: Annotated[int, msgspec.Meta(ge=1, le=8)] = 1
    exif_frame: Literal["stored", "oriented"] | None = None
    detector: dict[str, Any] | UnsetType = UNSET
    objects: tuple[DetectedObject, ...] | UnsetType = UNSET
    not_drawn: tuple[str, ...] | UnsetType = UNSET
    best_of_n: BestOfNMeta | None = None
    verify: VerifyMeta | None = None
    mask: MaskMeta | None = None

    def __post_init__(self) -> None:
        if (self.exif_orientation == 1) != (self.exif_frame is None):
            raise ValueError("exif_orientation 2..8 and exif_frame go together")
        parts = [self.detector, self.objects, self.not_drawn]
        if UNSET in parts and any(p is not UNSET for p in parts):
            missing = DetectionMeta.KEYS[parts.index(UNSET)]
            raise ValueError(
                f"missing key {missing} (detections need all of {', '.join(DetectionMeta.KEYS)})"
            )

    @property
    def detection(self) -> DetectionMeta | None:
        """The detector's part, ``None`` for a sample whose boxes are the dataset's."""
        if self.detector is UNSET or self.objects is UNSET or self.not_drawn is UNSET:
            return None
        return DetectionMeta(self.detector, self.objects, self.not_drawn)

    def source_record(self) -> ImageRecord | None:
        """A record that loads the original picture from inside its tar or Parquet file (a
        corpus sample; size unknown, so its boxes are the decoded picture's), else ``None``."""
        if self.source is None:
            return None
        return ImageRecord(self.image_id, self.file, 0, 0, (), (), source=self.source)

    @classmethod
    def from_dict(cls, d: Any) -> SampleMeta:
        """The inverse of :meth:`to_dict`; ``ValueError`` naming the key path
        (``$.plan.removed``, ``$.verify.removal[0]``) when one is missing, unexpected or of the
        wrong type. The older layout (per-class parts as objects keyed by class name) reads as
        the current one."""
        return _convert(_upgrade(d, _SAMPLE_KEYED), cls)

    @classmethod
    def from_json(cls, data: bytes | str) -> SampleMeta:
        """Parse a ``KEY.json`` member; ``ValueError`` for invalid JSON or a malformed sample."""
        try:
            d = msgspec.json.decode(data)
        except msgspec.DecodeError as err:
            raise ValueError(f"sample json: not JSON: {err}") from err
        return cls.from_dict(d)


# Per-class parts that older shards hold as objects keyed by class name ({c: {field: ...}};
# pmi.with_kept as {c: pmi}), by their path in a plan, a verdict and the sample json.
_PLAN_KEYED = (
    ("evidence", "co_removal"),
    ("evidence", "keep_overlap"),
    ("evidence", "pmi", "with_kept"),
)
_VERIFY_KEYED = (("removal",), ("retention",))
_SAMPLE_KEYED = (*(("plan", *p) for p in _PLAN_KEYED), *(("verify", *p) for p in _VERIFY_KEYED))


def _upgrade(d: Any, paths: Iterable[tuple[str, ...]]) -> Any:
    """``d`` with each per-class part at ``paths`` that is an object keyed by class name made
    the list of records ``[{"class": c, ...}]`` (copies along the way; ``d`` is not changed).
    Anything else is left for the schema to judge."""
    for path in paths:
        d = _upgrade_at(d, path)
    return d


def _upgrade_at(d: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(d, dict) or path[0] not in d:
        return d
    key, rest = path[0], path[1:]
    value = d[key]
    if rest:
        new = _upgrade_at(value, rest)
    elif isinstance(value, dict):
        new = [
            {"class": c, **v} if isinstance(v, dict) else {"class": c, "pmi": v}
            for c, v in value.items()
        ]
    else:
        return d
    return d if new is value else {**d, key: new}


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
    "MASK_BOXES",
    "NULLABLE_TYPES",
    "BestOfNMeta",
    "Box",
    "CoRemoval",
    "DetectedObject",
    "DetectionMeta",
    "Evidence",
    "KeepOverlap",
    "MaskMeta",
    "Number",
    "PMIEvidence",
    "PMIWith",
    "PlanMeta",
    "Record",
    "RemovalCheck",
    "RemovedFraction",
    "RetentionCheck",
    "SampleMeta",
    "SampleRow",
    "TextCheckMeta",
    "VerifyMeta",
    "iter_samples",
    "read_member",
    "read_samples",
    "read_shard",
    "rebuild_mask",
    "sample_failures",
    "shard_paths",
    "synthetic_class_sets",
    "verify_summary_from_samples",
)
