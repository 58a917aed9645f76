"""The typed record every reader produces and every stage consumes.

Coordinates are image pixels of the decoded, EXIF-upright image. Boxes are ``xywh``
(top-left x, top-left y, width, height), as COCO stores them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgspec


@dataclass(frozen=True, slots=True)
class RLE:
    """A COCO run-length mask of a ``height`` x ``width`` image, as ``pycocotools.mask`` reads
    it: ``counts`` alternate background and object runs in column-major order, starting with
    background, either as ints (COCO's uncompressed form, crowd annotations) or as COCO's
    compressed string. Readers check that the runs cover the image exactly."""

    height: int
    width: int
    counts: tuple[int, ...] | str


@dataclass(frozen=True, slots=True)
class ObjectAnnotation:
    """One annotated object.

    ``bbox`` is ``(x, y, w, h)`` in pixels. ``segmentation`` is COCO polygons
    (``[[x1, y1, x2, y2, ...], ...]``) in the same pixel space, an :class:`RLE` of the image
    (crowd annotations), or ``None``.
    """

    bbox: tuple[float, float, float, float]
    category: str
    iscrowd: bool = False
    segmentation: tuple[tuple[float, ...], ...] | RLE | None = None
    score: float | None = None


@dataclass(frozen=True, slots=True)
class Phrase:
    """An annotated phrase inside a caption (Flickr30k Entities): ``text[start:end]``."""

    start: int
    end: int
    text: str
    types: tuple[str, ...]
    entity_id: str = ""


@dataclass(frozen=True, slots=True)
class Caption:
    """One caption of an image. Readers build ``text`` with
    :func:`counterfactual.readers.clean.clean_text`; ``cleaned`` counts the control and invisible
    characters it removed (a sample's json shows it as ``caption_cleaned`` when not 0)."""

    caption_id: str
    text: str
    phrases: tuple[Phrase, ...] | None = None
    cleaned: int = 0


class TarMember(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", tag="tar"
):
    """A picture stored as a member of a tar file (a WebDataset shard): ``size`` bytes of data
    at byte ``offset`` of ``path``, so a worker reads it with one seek, without the tar index.
    As JSON (:func:`source_to_dict`) it is tagged ``"kind": "tar"``."""

    path: str
    offset: int
    size: int


class ParquetCell(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind", tag="parquet"
):
    """A picture stored as bytes in a Parquet file: row ``row`` of row group ``row_group`` in
    column ``column`` (a binary column, or a struct with a ``bytes`` field as Hugging Face
    datasets write images). As JSON it is tagged ``"kind": "parquet"``."""

    path: str
    row_group: int
    row: int
    column: str


ImageSource = TarMember | ParquetCell
"""Where a record's encoded picture lies when it is not a file of its own."""

ORIGIN_HASHES = ("md5", "sha256", "sha512")
"""The hashes img2dataset's ``compute_hash`` may add to a sample's metadata."""


class Origin(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """Where a corpus sample came from, as its downloader recorded it (img2dataset's ``json``
    member, ``json`` file or Parquet columns): the ``url`` fetched, the downloader's ``key``,
    its ``status`` (``success``, ``failed_to_download``, ``failed_to_resize``) and
    ``error_message``, and the hex digest of the downloaded bytes (before any resize) under
    ``md5``, ``sha256`` or ``sha512``. ``None``: not recorded."""

    url: str | None = None
    key: str | None = None
    status: str | None = None
    error_message: str | None = None
    md5: str | None = None
    sha256: str | None = None
    sha512: str | None = None

    FIELDS = ("url", "key", "status", "error_message", *ORIGIN_HASHES)

    def to_dict(self) -> dict[str, str]:
        """The fields that are set, in :attr:`FIELDS` order (a sample's json ``origin``)."""
        return {f: v for f in self.FIELDS if (v := getattr(self, f)) is not None}

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Origin | None:
        """The :attr:`FIELDS` of ``data`` that hold a non-empty string (others are ignored),
        or ``None`` when there is none but ``key`` (a key alone says nothing of an origin)."""
        found = {f: v for f in cls.FIELDS if isinstance(v := data.get(f), str) and v}
        return cls(**found) if set(found) - {"key"} else None


def source_to_dict(source: ImageSource) -> dict[str, str | int]:
    """``source`` as JSON, tagged by ``kind`` (a sample's json keeps it, so an audit can find
    the original)."""
    return msgspec.to_builtins(source)


def source_from_dict(data: Mapping[str, Any]) -> ImageSource:
    """The inverse of :func:`source_to_dict`; ``ValueError`` for anything else."""
    try:
        return msgspec.convert(data, ImageSource)  # type: ignore[arg-type]
    except msgspec.ValidationError as err:
        raise ValueError(f"not a picture source: {dict(data)!r} ({err})") from err


@dataclass(frozen=True, slots=True)
class ImageRecord:
    """One image with its objects and captions.

    ``file`` is the path of the image relative to ``root`` (never absolute in a dataset);
    ``root`` is a local folder (``Path``) or a URL (``str``, e.g. ``"s3://bucket/images"``, read
    through :mod:`counterfactual.fs`); ``width``/``height`` are the annotated size, which the
    runner checks against the pixels.

    A corpus without boxes (WebDataset, Parquet, CSV) has no ``objects`` and ``width`` =
    ``height`` = 0 (unknown until decoded; a detector supplies the objects). When its pictures
    live inside other files, ``source`` says where and ``file`` is only a name for people
    (``00000.tar/000000123.jpg``). ``origin``: the url, key, status and hash its downloader
    recorded (img2dataset), when it did.
    """

    image_id: str
    file: str
    width: int
    height: int
    objects: tuple[ObjectAnnotation, ...]
    captions: tuple[Caption, ...]
    root: Path | str | None = None
    split: str | None = None
    dataset: str = ""
    source: ImageSource | None = None
    origin: Origin | None = None

    @property
    def classes(self) -> tuple[str, ...]:
        """Distinct object classes in first-seen order."""
        return tuple(dict.fromkeys(o.category for o in self.objects))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as plain tuples: a driver hands every record to a worker, and this is
        several times cheaper than pickling each object and caption as a dataclass."""
        objects = tuple(
            (o.bbox, o.category, o.iscrowd, o.segmentation, o.score) for o in self.objects
        )
        captions = tuple((c.caption_id, c.text, c.phrases, c.cleaned) for c in self.captions)
        return _record, (
            self.image_id,
            self.file,
            self.width,
            self.height,
            objects,
            captions,
            self.root,
            self.split,
            self.dataset,
            self.source,
            self.origin,
        )


def _record(
    image_id: str,
    file: str,
    width: int,
    height: int,
    objects: tuple[tuple[Any, ...], ...],
    captions: tuple[tuple[Any, ...], ...],
    *rest: Any,
) -> ImageRecord:
    return ImageRecord(
        image_id,
        file,
        width,
        height,
        tuple(ObjectAnnotation(*o) for o in objects),
        tuple(Caption(*c) for c in captions),
        *rest,
    )


@dataclass(frozen=True, slots=True)
class Dataset:
    """A dataset: its records and the class vocabulary its objects use."""

    name: str
    records: tuple[ImageRecord, ...]
    class_names: tuple[str, ...] = field(default=())
    failures: tuple[Status, ...] = field(default=())
    """Images named by the annotations that could not become a record, with the reason."""


@dataclass(frozen=True, slots=True)
class Status:
    """One row of the per-sample status record: every input image and every plan gets one.

    ``status`` is ``"written"`` (a shard sample exists under ``key``), ``"skipped"`` (nothing to
    do, e.g. ``no-removable-class``) or ``"failed"`` (``reason`` says why, ``detail`` says more).
    """

    image_id: str
    status: str
    reason: str | None = None
    detail: str = ""
    key: str | None = None
    target: str | None = None
    url: str | None = None
    """Where the picture was downloaded from, when its downloader recorded it (img2dataset),
    so a row joins with the downloader's own records; absent from :meth:`to_dict` otherwise."""

    def to_dict(self) -> dict[str, Any]:
        """The row as ``status.jsonl`` holds it (``url`` only when there is one)."""
        out = asdict(self)
        if self.url is None:
            del out["url"]
        return out

    @property
    def outcome(self) -> str:
        """``status:reason`` (``written`` alone), as the run's counts name it."""
        return outcome(self.status, self.reason)


def outcome(status: str, reason: str | None) -> str:
    """The name a status row is counted under: ``status:reason``, or ``status`` alone."""
    return f"{status}:{reason}" if reason else status
