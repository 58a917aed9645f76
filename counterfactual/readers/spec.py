"""Where a run's data comes from: a typed spec, resolved here and recorded in the manifest.

A :class:`DataSpec` names the dataset kind and its files (local paths or fsspec URLs);
:meth:`DataSpec.resolved` fills in the defaults (COCO's ``annotations/instances_SET.json``
under the root, ...), :func:`open_input` reads it into a :class:`RunInput`:
the records of an annotated dataset (read once, in the driver), or the pieces of a corpus
(listed by the driver, read by the workers). ``counterfactual report`` and ``cooccurrence``
read the spec back from ``manifest.json`` (``data``) instead of re-parsing the command line;
it is recorded with absolute local paths (:meth:`DataSpec.absolute`), so it names the same
files whatever the working directory of the reader.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterfactual import fs
from counterfactual.readers import CORPORA, DATASETS
from counterfactual.records import Dataset, ImageRecord, Status

if TYPE_CHECKING:
    from counterfactual.readers.corpus import InputPiece

KINDS = DATASETS + CORPORA
_PATH_FIELDS = ("root", "images", "instances", "captions", "split_file")
"""The fields of a :class:`DataSpec` that name files or folders."""


@dataclass(frozen=True)
class RunInput:
    """What a run reads.

    ``records``: the images of an annotated dataset (or any records), held or streamed by the
    driver and cut into shards of ``images_per_shard`` images. ``pieces``: the pieces of a
    corpus (:func:`counterfactual.readers.corpus.plan_pieces`), one shard each, read by the
    workers. ``failures``: rows for input that never became a record (a missing annotation
    target, a missing corpus file). ``images``: the number of input images when known up front
    (progress). ``spec``: where the data came from, for the manifest.
    """

    records: Iterable[ImageRecord] = ()
    pieces: Sequence[InputPiece] | None = None
    failures: Sequence[Status] = ()
    images: int | None = None
    spec: dict[str, Any] | None = None

    @classmethod
    def of(
        cls, inputs: RunInput | Iterable[ImageRecord], failures: Sequence[Status] = ()
    ) -> RunInput:
        """``inputs`` as a :class:`RunInput` (plain records with the reader's ``failures``)."""
        if isinstance(inputs, RunInput):
            return inputs
        return cls(records=inputs, failures=tuple(failures))

    def shard_count(self, images_per_shard: int) -> int | None:
        """Shards this input makes at ``images_per_shard``, when known without reading it."""
        if self.pieces is not None:
            return len(self.pieces)
        if isinstance(self.records, Sequence):
            return -(-len(self.records) // images_per_shard)
        return None

    @property
    def unit(self) -> str:
        """What one input is: ``"images"`` of an annotated dataset, ``"rows"`` of a corpus (a
        row is one picture with its caption)."""
        return "images" if self.pieces is None else "rows"

    def image_count(self) -> int | None:
        """The number of inputs (:attr:`unit`), reader failures included, when known."""
        if self.images is not None:
            return self.images
        if self.pieces is None and isinstance(self.records, Sequence):
            return len(self.records) + len(self.failures)
        return None


@dataclass(frozen=True, slots=True)
class Stamp:
    """What a run knows of an input file without reading it: ``size`` in bytes (-1: missing)
    and ``stamp``, the local modification time in ns or an object store's ETag (else its
    modification time); ``content``: its SHA-256 when asked for (``""`` otherwise). A folder
    (a ``files`` corpus piece) is the sum of its files' sizes and a digest of their names,
    sizes and stamps (and contents)."""

    size: int
    stamp: str
    content: str = ""


MISSING = Stamp(-1, "missing", "missing")
STAMP_KEYS = ("ETag", "etag", "md5Hash", "blob_id", "LastModified", "last_modified", "mtime")
"""The listing fields that stamp an object, first found wins: S3's ETag, GCS's md5Hash, a
Hugging Face blob id, else a modification time."""


@dataclass
class InputStamps:
    """:class:`Stamp` s of input files, for the input fingerprint of each shard
    (:func:`counterfactual.synth.tasks.input_parts`). Local files cost one ``stat`` each
    (a folder one ``scandir``); under a URL each folder is listed once (one ``ls`` per prefix,
    not a request per file). ``content``: hash every file too (``--hash-inputs``: reads all of
    the input once in the driver)."""

    content: bool = False
    _listings: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    _cache: dict[str, Stamp] = field(default_factory=dict)

    def of(self, path: fs.PathLike) -> Stamp:
        key = os.fspath(path)
        found = self._cache.get(key)
        if found is None:
            found = self._remote(key) if fs.is_url(key) else self._local(key)
            if self.content or fs.is_url(key):  # a local stat is as cheap as the lookup
                self._cache[key] = found
        return found

    def _local(self, path: str) -> Stamp:
        try:
            st = os.stat(path)
        except OSError:
            return MISSING
        if stat.S_ISDIR(st.st_mode):
            return _combined([(e.name, self._local(e.path)) for e in _scandir(path) if e.is_file()])
        digest = ""
        if self.content:
            try:
                digest = fs.file_sha256(path)
            except OSError:
                digest = "unreadable"
        return Stamp(st.st_size, str(st.st_mtime_ns), digest)

    def _remote(self, url: str) -> Stamp:
        parent, name = str(fs.parent(url)), fs.name(url)
        entry = self._listing(parent).get(name)
        if entry is None:
            inside = self._listing(url)
            if not inside:
                return MISSING
            return _combined([(n, self._remote(f"{url}/{n}")) for n in sorted(inside)])
        if entry.get("type") == "directory":
            return _combined([(n, self._remote(f"{url}/{n}")) for n in sorted(self._listing(url))])
        stamp = next((str(entry[k]) for k in STAMP_KEYS if entry.get(k)), "")
        digest = fs.file_sha256(url) if self.content else ""
        return Stamp(int(entry.get("size") or 0), stamp, digest)

    def _listing(self, folder: str) -> dict[str, dict[str, Any]]:
        if folder not in self._listings:
            remote, inside = fs.filesystem(folder)
            try:
                entries = remote.ls(inside, detail=True)
            except (FileNotFoundError, NotADirectoryError):
                entries = []
            self._listings[folder] = {fs.name(e["name"]): e for e in entries}
        return self._listings[folder]


def _scandir(path: str) -> list[os.DirEntry[str]]:
    try:
        return sorted(os.scandir(path), key=lambda e: e.name)
    except OSError:
        return []


def _combined(stamps: list[tuple[str, Stamp]]) -> Stamp:
    """One :class:`Stamp` for a folder's files."""
    h = hashlib.blake2b(digest_size=12)
    c = hashlib.blake2b(digest_size=12)
    for name, s in stamps:
        h.update(f"{name}\0{s.size}\0{s.stamp}\n".encode("utf-8", "surrogatepass"))
        c.update(f"{name}\0{s.content}\n".encode("utf-8", "surrogatepass"))
    return Stamp(sum(max(s.size, 0) for _, s in stamps), h.hexdigest(), c.hexdigest())


@dataclass(frozen=True, slots=True)
class DataSpec:
    """A dataset and its files. Paths are local paths or URLs, kept as strings.

    ``root``: the dataset folder (demo: where its pictures are written; wds, parquet, csv: the
    file pattern, with brace ranges or globs, or their folder; files: the folder of shard
    folders, or a pattern naming them). ``images``: the folder file names are relative to
    (files: filled in by :meth:`resolved`, the folder holding the shard folders). ``instances``/``captions``/``coco_set``: COCO's files. ``split_file``/``split``: the
    Karpathy (or Flickr30k) split. ``*_column``: a table's columns. ``limit``: the first N
    images only.
    """

    kind: str = "demo"
    root: str | None = None
    images: str | None = None
    instances: str | None = None
    captions: str | None = None
    coco_set: str = "train2017"
    split_file: str | None = None
    split: str | None = None
    caption_column: str | None = None
    image_column: str | None = None
    id_column: str | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"dataset {self.kind!r} is not one of {KINDS}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 image, got {self.limit}")

    @property
    def corpus(self) -> bool:
        return self.kind in CORPORA

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataSpec:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def absolute(self, base: str | os.PathLike[str] | None = None) -> DataSpec:
        """The spec with every relative local path (``root``, ``images``, ``instances``,
        ``captions``, ``split_file``) made absolute against ``base`` (default: the working
        directory), so that it names the same files from anywhere: the form the manifest
        records. URLs, absolute paths and a corpus pattern that starts with a brace (whose
        alternatives may differ) are kept as they are."""
        base = os.fspath(base) if base is not None else os.getcwd()
        changes: dict[str, str] = {}
        for name in _PATH_FIELDS:
            value = getattr(self, name)
            if not value or fs.is_url(value) or os.path.isabs(value):
                continue
            if name == "root" and self.corpus:
                if value.startswith("{"):
                    continue
                changes[name] = os.path.join(base, value)  # a pattern: braces and globs kept
            else:
                changes[name] = os.path.normpath(os.path.join(base, value))
        return replace(self, **changes) if changes else self

    def resolved(self) -> DataSpec:
        """The spec with every default filled in, or ``ValueError`` naming what is missing."""
        if self.corpus:
            from counterfactual.readers.corpus import corpus_format

            form = corpus_format(self.kind)
            if self.root is None:
                raise ValueError(f"--dataset {self.kind} needs --root: {form.root_help}")
            if self.images is None and (images := form.default_images(self.root)) is not None:
                return replace(self, images=images)
            return self
        if self.kind == "demo":
            if self.root is None:
                raise ValueError("the demo needs a folder to write its pictures to (--root)")
            return self
        if self.root is None and self.instances is None:
            raise ValueError(f"--dataset {self.kind} needs --root (or --instances for COCO)")
        if self.kind == "flickr30k":
            return self
        root = self.root or str(fs.parent(str(self.instances)))
        annotations = fs.join(root, "annotations")
        return replace(
            self,
            root=root,
            instances=self.instances
            or str(fs.join(annotations, f"instances_{self.coco_set}.json")),
            captions=self.captions or str(fs.join(annotations, f"captions_{self.coco_set}.json")),
            images=self.images or str(fs.join(root, self.coco_set)),
        )


def check_inputs(spec: DataSpec) -> None:
    """``ValueError`` naming the option and path of an input file or folder that is missing,
    of the wrong kind or unreadable, before anything is read (else every image would fail
    alone, as ``missing-file``). Local paths are checked whole; of a URL only that the images
    prefix holds something (one listing). A path the user did not give is named with where
    it came from: ``--instances (from --root ROOT) PATH: no such file``."""
    given, spec = spec, spec.resolved()
    checks: list[tuple[str, str | None, bool]] = []
    if spec.kind == "coco":
        checks += [
            ("--instances", spec.instances, False),
            ("--captions", spec.captions, False),
            ("--split-file", spec.split_file, False),
        ]
    elif spec.kind == "flickr30k":
        checks.append(("--root", spec.root, True))
    if spec.kind != "demo":  # the demo writes its own pictures
        checks.append(("--images", spec.images, True))
    source = f"--root {given.root}" if given.root is not None else f"--instances {given.instances}"
    for option, value, folder in checks:
        if value is None:
            continue
        if getattr(given, option[2:].replace("-", "_")) is None:
            option += f" (from {source})"
        _check_path(option, value, folder)


def _check_path(option: str, value: str, folder: bool) -> None:
    what = "folder" if folder else "file"
    if fs.is_url(value):
        if folder and not fs.isdir(value):
            raise ValueError(f"{option} {value}: nothing under this prefix (no such folder)")
        return
    path = fs.as_path(value)
    assert isinstance(path, Path)
    if not path.exists():
        raise ValueError(f"{option} {value}: no such {what}")
    if folder and not path.is_dir():
        raise ValueError(f"{option} {value}: is a file, not a folder")
    if not folder and path.is_dir():
        raise ValueError(f"{option} {value}: is a folder, not a file")
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        verb = "list or search" if folder else "read"
        raise ValueError(f"{option} {value}: permission denied (cannot {verb} the {what})")


def read_dataset(spec: DataSpec) -> Dataset:
    """The records of an annotated dataset (demo, COCO, Flickr30k), read once; its files and
    folders are checked first (:func:`check_inputs`)."""
    check_inputs(spec)  # as given: a path the user did not give says where it came from
    spec = spec.resolved()
    if spec.corpus:
        raise ValueError(f"{spec.kind} is a corpus: its workers read it (open_input)")
    if spec.kind == "demo":
        from counterfactual.readers.demo import read_demo

        return read_demo(fs.as_path(str(spec.root)))
    if spec.kind == "flickr30k":
        from counterfactual.readers.flickr30k import read_flickr30k

        return read_flickr30k(fs.as_path(str(spec.root)), split=spec.split)
    from counterfactual.readers.coco import read_coco

    assert spec.instances and spec.captions and spec.images
    return read_coco(
        fs.as_path(spec.instances),
        fs.as_path(spec.captions),
        fs.as_path(spec.images),
        None if spec.split_file is None else fs.as_path(spec.split_file),
        spec.split,
    )


def open_input(spec: DataSpec, images_per_shard: int) -> RunInput:
    """What a run reads: an annotated dataset's records, or a corpus's pieces of
    ``images_per_shard`` rows (the workers read them)."""
    given, spec = spec, spec.resolved()
    if not spec.corpus:
        dataset = read_dataset(given)
        records = dataset.records if spec.limit is None else dataset.records[: max(spec.limit, 0)]
        return RunInput(records, failures=dataset.failures, spec=spec.absolute().to_dict())
    check_inputs(given)
    if spec.limit is not None:  # a few rows: the driver reads them and hands them out as records
        return _first_rows(spec)
    from counterfactual.readers.corpus import plan_pieces

    rows = plan_pieces(
        str(spec.root),
        spec.kind,
        images_per_shard,
        images=None if spec.images is None else fs.as_path(spec.images),
        caption_column=spec.caption_column,
        image_column=spec.image_column,
        id_column=spec.id_column,
    )
    pieces, failures = [], []
    for row in rows:
        (failures if isinstance(row, Status) else pieces).append(row)
    return RunInput(pieces=pieces, failures=tuple(failures), spec=spec.absolute().to_dict())


def _first_rows(spec: DataSpec) -> RunInput:
    """The first ``spec.limit`` records of a corpus (and the failures met on the way)."""
    from counterfactual.readers.corpus import collect, iter_corpus

    rows = iter_corpus(
        str(spec.root),
        spec.kind,
        images=None if spec.images is None else fs.as_path(spec.images),
        caption_column=spec.caption_column,
        image_column=spec.image_column,
        id_column=spec.id_column,
    )
    first = collect(spec.kind, rows, spec.limit)
    return RunInput(first.records, failures=first.failures, spec=spec.absolute().to_dict())
