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

The json is one schema, msgspec structs (:class:`~counterfactual.jsonrecord.Record`; the plan's
and the verdict's are :mod:`counterfactual.method`'s, which makes them): decoding checks every key and type
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
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from counterfactual import fs
from counterfactual.jsonrecord import Box, Number, Record, convert, upgrade_keyed
from counterfactual.method.selection import PLAN_KEYED, PlanMeta
from counterfactual.method.verify import VERIFY_KEYED, VerifyMeta, VerifySummary
from counterfactual.readers.corpus import member_key_field
from counterfactual.records import ImageRecord, ImageSource, Origin, Status

BAD_METADATA = "bad-metadata"
BAD_SHARD = "bad-shard"
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")

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
        return convert(upgrade_keyed(d, _SAMPLE_KEYED), cls)

    @classmethod
    def from_json(cls, data: bytes | str) -> SampleMeta:
        """Parse a ``KEY.json`` member; ``ValueError`` for invalid JSON or a malformed sample."""
        try:
            d = msgspec.json.decode(data)
        except msgspec.DecodeError as err:
            raise ValueError(f"sample json: not JSON: {err}") from err
        return cls.from_dict(d)


# Per-class parts that older shards hold as objects keyed by class name, by their path in the
# sample json: the plan's and the verdict's.
_SAMPLE_KEYED = (*(("plan", *p) for p in PLAN_KEYED), *(("verify", *p) for p in VERIFY_KEYED))


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
    "DetectedObject",
    "DetectionMeta",
    "MaskMeta",
    "SampleMeta",
    "SampleRow",
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
