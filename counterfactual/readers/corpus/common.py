"""What every corpus format shares: the layouts a planner hands a worker (:class:`InputPiece`,
:class:`TableLayout`), the :class:`CorpusFormat` protocol each format module implements, and the
helpers they all use (opening a local file or URL, captions, row ids, :func:`collect`)."""

from __future__ import annotations

import contextlib
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from counterfactual import fs
from counterfactual._lazy import require
from counterfactual.readers.clean import clean_text
from counterfactual.records import Caption, Dataset, ImageRecord, Status

if TYPE_CHECKING:
    from counterfactual.readers.keyset import KeySet

PICTURE_FIELDS = ("jpg", "jpeg", "png", "webp")
"""WebDataset fields that hold the picture, in order of preference."""
CAPTION_COLUMNS = ("caption", "txt", "text", "TEXT")
IMAGE_COLUMNS = ("image", "jpg", "path", "file", "filepath", "file_name", "image_path")
ID_COLUMNS = ("key", "id", "image_id")
MAX_TEXT_BYTES = 1 << 20
"""A ``txt`` or ``json`` member larger than this is not read (``bad-metadata``)."""

GLOB_MAGIC = re.compile(r"[*?\[]")
# webdataset.tariterators.base_plus_ext: the key is everything before the first dot of the base
# name, directory kept; the field is the rest (lower-cased by webdataset.group_by_keys)
KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
PLAN_THREADS = 8
"""Table headers and footers read at once when planning files behind URLs."""


@dataclass(frozen=True, slots=True)
class TableLayout:
    """How a worker reads a table without planning it again: the columns chosen, what the
    image column holds (``"bytes"``: binary; ``"struct"``: ``{bytes, path}``; ``"path"``: a
    path string; always ``"path"`` in a CSV), the CSV header row, ``images``, the folder
    that path cells are relative to (a local path or URL; ``None``: the table's folder), and
    ``origin``, the columns of :attr:`~counterfactual.records.Origin.FIELDS` the table has
    (img2dataset's ``url``, ``key``, ``status``, ``error_message``, ``sha256``; string
    columns only in Parquet)."""

    caption: str
    image: str
    id: str | None = None
    holds: str = "path"
    header: tuple[str, ...] = ()
    images: str | None = None
    origin: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InputPiece:
    """One output shard's worth of a corpus: small, picklable, read by :func:`read_piece`.

    ``kind``: ``"wds"``, ``"parquet"`` or ``"csv"``; ``path``: the file (local path or URL);
    ``index``: its position in the expanded pattern. Rows ``start`` (inclusive) to ``stop``
    (exclusive; ``None``: to the end) are counted from 0 within the file, blank CSV lines not
    counted; a tar is always read whole. CSV only: ``offset`` is the byte offset of row
    ``start`` (after the header), ``end`` the byte offset one past the piece (``None``: the end
    of the file). ``table``: the table's layout (``None`` for a tar).
    """

    kind: str
    path: str
    index: int
    start: int = 0
    stop: int | None = None
    offset: int = 0
    end: int | None = None
    table: TableLayout | None = None
    repeated: frozenset[int] = frozenset()
    """Rows (numbered as ``start``) whose id an earlier row of the run already had, found by
    the planner (:func:`plan_pieces`, CSV and Parquet): they become ``duplicate-key`` rows."""
    repeated_keys: bytes = b""
    """The keys an earlier piece of the run already had (WebDataset, files), found by the
    planner: their :func:`~counterfactual.readers.keyset.key_hash` es as sorted little-endian
    ``uint64``, 8 bytes a key. The samples with these keys become ``duplicate-key`` rows."""


@dataclass(frozen=True, slots=True)
class PlannedFile:
    """One input file as planned: its layout, and where its rows lie (Parquet: ``rows``, the
    row count from the footer; CSV: ``offset``, the byte offset just after the header)."""

    kind: str
    path: str
    index: int
    table: TableLayout | None = None
    rows: int = 0
    offset: int = 0


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """A table's options as given (ignored by the other formats): ``images``, the folder path
    cells are relative to, and the columns named (``None``: the first default present)."""

    images: str | Path | None = None
    caption_column: str | None = None
    image_column: str | None = None
    id_column: str | None = None


@runtime_checkable
class CorpusFormat(Protocol):
    """One corpus format: what the planner (:func:`~counterfactual.readers.corpus.plan_pieces`),
    the workers (:func:`~counterfactual.readers.corpus.read_piece`) and
    :class:`~counterfactual.readers.spec.DataSpec` ask of it. The formats are listed by kind in
    :data:`~counterfactual.readers.corpus.formats.FORMATS`."""

    kind: str
    """The ``--dataset`` name and every piece's ``kind``."""
    suffix: str | None
    """The files a glob or a folder stands for (``".tar"``); ``None``: shard folders."""
    root_help: str
    """What ``--root`` names, for the error when it is missing."""

    def default_images(self, root: str) -> str | None:
        """The folder records' ``file`` names are relative to when ``--images`` is not given
        (``None``: the format's own default, e.g. a table's folder)."""
        ...

    def plan(self, paths: Sequence[str], options: PlanOptions) -> list[PlannedFile | Status]:
        """The expanded pattern's files as planned, in order; a table's header or footer read,
        its columns chosen (``ValueError`` for a bad option)."""
        ...

    def keys(self, file: PlannedFile) -> np.ndarray | None:
        """The :func:`~counterfactual.readers.keyset.key_hashes` of the keys a worker gives the
        file's rows, in its order (read ahead on threads); ``None`` when :meth:`cut` reads them
        itself or the file cannot be read (its worker reports it)."""
        ...

    def cut(
        self,
        file: PlannedFile,
        rows_per_piece: int | None,
        keys: KeySet | None,
        hashes: np.ndarray | None,
    ) -> Iterator[InputPiece | Status]:
        """The file's pieces (``rows_per_piece=None``: one, nothing scanned); with ``keys``, the
        run's keys so far, each piece marks the rows or keys an earlier piece had."""
        ...

    def read(self, piece: InputPiece, seen: dict[str, str]) -> Iterator[ImageRecord | Status]:
        """One piece's records and ``failed`` statuses; ``seen``: key or id -> where it was
        first seen, shared by the pieces of one stream."""
        ...


def _listed(kind: str, paths: Sequence[str]) -> list[PlannedFile | Status]:
    """Files planned without reading them (a tar, a shard folder)."""
    return [PlannedFile(kind, path, i) for i, path in enumerate(paths)]


class WholeFiles:
    """What the formats whose file is one piece (a tar shard, a shard folder) share: a file
    planned without reading it, cut into itself."""

    kind: str

    def plan(self, paths: Sequence[str], options: PlanOptions) -> list[PlannedFile | Status]:
        return _listed(self.kind, paths)

    def cut(
        self,
        file: PlannedFile,
        rows_per_piece: int | None,
        keys: KeySet | None,
        hashes: np.ndarray | None,
    ) -> Iterator[InputPiece | Status]:
        return _whole(file, keys, hashes)


def _whole(
    file: PlannedFile, keys: KeySet | None, hashes: np.ndarray | None
) -> Iterator[InputPiece]:
    """A file read whole as one piece, carrying the hashes of its keys that the run had
    already (``repeated_keys``)."""
    piece = InputPiece(file.kind, file.path, file.index)
    if keys is not None and hashes is not None and len(hashes):
        before = keys.contains(hashes)
        keys.add_hashes(hashes)
        if before.any():
            again = np.unique(hashes[before]).astype("<u8").tobytes()
            piece = replace(piece, repeated_keys=again)
    yield piece


def repeated_hashes(piece: InputPiece) -> frozenset[int]:
    """The hashes of the keys an earlier piece of the run had (``piece.repeated_keys``)."""
    return frozenset(np.frombuffer(piece.repeated_keys, dtype="<u8").tolist())


def read_ahead(
    items: Sequence[PlannedFile | Status], read: Callable[[PlannedFile | Status], np.ndarray | None]
) -> Iterator[np.ndarray | None]:
    """``read(item)`` for each item, in order, at most ``2 * PLAN_THREADS`` read ahead on
    threads (tar headers and Parquet id columns: waiting on storage, above all a URL's)."""
    with ThreadPoolExecutor(PLAN_THREADS) as pool:
        window: deque[Any] = deque()
        for item in items:
            window.append(pool.submit(read, item))
            if len(window) > 2 * PLAN_THREADS:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def raise_if_store_down(err: BaseException) -> None:
    """Raise the cause of ``err`` when it is an object store down or stalled
    (:func:`counterfactual.fs.store_error`): the keys cannot be known, so planning stops (one
    line; the rerun plans again) rather than miss them. Any other fault is the file's own,
    which its worker meets and reports the same way."""
    cause = err.__cause__ if isinstance(err, BadShard) else err
    if isinstance(cause, BaseException) and fs.store_error(cause) is not None:
        raise cause


def table_piece(
    file: PlannedFile, start: int, stop: int | None, offset: int = 0, end: int | None = None
) -> InputPiece:
    return InputPiece(file.kind, file.path, file.index, start, stop, offset, end, file.table)


def open_binary(path: str, cache_type: str | None = None) -> IO[bytes]:
    """A local file or URL opened for binary reading; ``cache_type`` is fsspec's (URLs only:
    ``"none"`` when the reader makes its own ranged reads, as pyarrow does)."""
    if cache_type is not None and fs.is_url(path):
        return fs.open_file(path, "rb", cache_type=cache_type)
    return fs.open_file(path, "rb")


def absolute_source(path: str) -> str:
    """A URL as it is, a local path made absolute (the form a record's ``source`` keeps)."""
    p = fs.as_path(path)
    return p if isinstance(p, str) else str(p.absolute())


def collect(name: str, rows: Iterator[ImageRecord | Status], limit: int | None = None) -> Dataset:
    """``rows`` as a :class:`Dataset` (records, and statuses as failures), stopping after
    ``limit`` records when given."""
    records: list[ImageRecord] = []
    failures: list[Status] = []
    for row in rows:
        if isinstance(row, Status):
            failures.append(row)
            continue
        records.append(row)
        if len(records) == limit:
            break
    return Dataset(name, tuple(records), class_names=(), failures=tuple(failures))


class BadShard(Exception):
    """A shard or table cannot be read further; the message says why."""


def is_picture_name(name: str) -> bool:
    match = KEY_FIELD.match(name)
    return match is not None and match.group(2).lower() in PICTURE_FIELDS


def record_captions(text: str) -> tuple[Caption, ...]:
    """The record's caption ``"0"``, cleaned (:func:`counterfactual.readers.clean.clean_text`); none
    when it is empty after cleaning."""
    clean = clean_text(text)
    return (Caption("0", clean.text, None, clean.removed),) if clean.text else ()


def row_id(stem: str, row: int, ident: Any) -> str:
    """A table row's id: its id cell, else ``STEM-ROW`` (the file's stem, the row from 0)."""
    return f"{stem}-{row:08d}" if ident is None or ident == "" else str(ident)


def pyarrow_modules() -> tuple[ModuleType, ModuleType]:
    return require("pyarrow", "corpora"), require("pyarrow.parquet", "corpora")


@contextlib.contextmanager
def parquet_file(path: str) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetFile`` on a local path, or on an fsspec file for a URL."""
    _, pq = pyarrow_modules()
    if not fs.is_url(path):
        with pq.ParquetFile(path) as pf:
            yield pf
        return
    with open_binary(path, cache_type="none") as fh, pq.ParquetFile(fh) as pf:
        yield pf
