"""Box-less image-text corpora: WebDataset shards, Parquet tables and CSV tables.

These corpora have pictures and captions but no boxes, so every record has ``objects=()``,
``width = height = 0`` (unknown until decoded; a detector supplies the objects later), one
:class:`~counterfactual.records.Caption` with ``caption_id`` ``"0"`` (or none), ``split=None``
and ``dataset`` ``"wds"``, ``"parquet"``, ``"csv"`` or ``"files"``, and the
:class:`~counterfactual.records.Origin` its downloader recorded (img2dataset's ``url``,
``key``, ``status``, ``sha256``: the ``json`` member or file, or those table columns).

Formats:

- **WebDataset** (:func:`iter_wds`): uncompressed tar shards in which the members of one sample
  share a key, the member name up to the first dot of its base name, directory kept
  (``a/000000123.jpg`` -> key ``a/000000123``, field ``jpg``), as :mod:`webdataset` groups them:
  consecutive members with the same key form a sample. img2dataset writes ``jpg``, ``txt`` (the
  caption) and ``json`` (metadata, with ``caption`` among other fields) per sample. The picture
  is the first of the fields ``jpg``, ``jpeg``, ``png``, ``webp`` that the sample has; the
  caption is ``txt`` (UTF-8), else ``json["caption"]``.

Captions are cleaned (:func:`counterfactual.readers.clean.clean_text`: control and invisible
characters out, whitespace runs as one space); one empty after cleaning is no caption.
- **Parquet** (:func:`iter_table`, ``kind="parquet"``): one row per picture. The image column
  holds the encoded picture (a binary column, or a struct ``{bytes, path}`` as Hugging Face
  datasets write images) or a path to a picture file.
- **CSV** (:func:`iter_table`, ``kind="csv"``): like Parquet, but the image column holds paths.
  Read as Python's :mod:`csv` reads it (the ``excel`` dialect, UTF-8, blank lines skipped).
- **files** (:func:`iter_files`): img2dataset's ``files`` output, shard folders of
  ``KEY.jpg``, ``KEY.txt``, ``KEY.json``.

img2dataset's output folder is read as it is (:func:`expand_pattern` with a kind: a folder
means its ``*.tar``, ``*.parquet`` or ``*.csv``, or its shard folders); the urls it failed are
in its metadata ``SHARD.parquet`` beside each tar or shard folder, not in them, and become
``download-failed`` rows after the shard's samples.

Every path may be a local path or an fsspec URL (``s3://bucket/shards/{00000..00099}.tar``),
read through :mod:`counterfactual.fs`: pattern expansion, tars, tables, and the pictures that
:func:`read_source` reads back.

Pieces: a run cuts a corpus into :class:`InputPiece` s, one output shard each, so that the
driver holds O(files), never O(samples). :func:`plan_pieces` (the driver) lists the files and
cuts them without reading samples: one piece per tar, Parquet by row counts from the footer,
CSV by one binary scan that records the byte offset of every ``rows_per_piece``-th row; and it
reads every piece's keys (a tar's headers, a Parquet file's id column, a CSV's id cells, a
shard folder's names) into the run's :class:`~counterfactual.readers.keyset.KeySet`, in piece
order, so that each piece carries the keys an earlier one had. :func:`read_piece` (a worker)
reads one piece's records.
:func:`iter_wds` and :func:`iter_table` are the same machinery with one piece per file.

Streaming: readers never read picture data. A shard's tar headers are read one after another
and the data between them is skipped by seeking; only the small ``txt`` / ``json`` members are
read. Parquet is read by row group, only the id and caption columns, plus the image column when
the row group's statistics do not rule out empty cells. A picture inside another file gets a
``source`` (:class:`~counterfactual.records.TarMember`: byte offset and size;
:class:`~counterfactual.records.ParquetCell`: row group, row and column), which a worker reads
with :func:`read_source` (one ranged read for a tar member); a picture file of its own gets
``file`` relative to ``root`` (a ``Path``, or a ``str`` URL), as in the annotated datasets.

Bad data never raises; it becomes a ``failed`` :class:`~counterfactual.records.Status`:

- ``missing-image``: a sample without a picture member, or a row whose image cell is null
  (a struct with neither ``bytes`` nor ``path``; in a CSV, an empty cell); a url img2dataset's
  metadata lists as downloaded that its shard lacks.
- ``download-failed``: a url img2dataset could not fetch or resize (its metadata's ``status``
  is not ``success``; ``detail``: :func:`download_detail`).
- ``duplicate-key``: a key or id already seen earlier in the same stream; the first one is
  kept, ``detail`` names both places. :func:`iter_wds` / :func:`iter_table` check the whole
  stream (every shard or file); :func:`read_piece` checks its piece, and the keys the planner
  found in an earlier piece (:func:`plan_pieces`: ``detail`` says "an earlier piece" or "an
  earlier row"). img2dataset's metadata rows (``download-failed``) are checked within their
  shard only.
- ``bad-metadata``: the caption would come from a member that cannot be read as text (a ``txt``
  that is not UTF-8, a ``json`` that does not parse or is not an object, text members over
  1 MiB).
- ``unsafe-path``: a path cell that is absolute outside the images folder, climbs out with
  ``..``, names a drive or URL (other than one inside a URL images folder), or is an empty
  string (Parquet).
- ``missing-file`` (``image_id`` = the path): a shard or table that does not exist.
- ``bad-shard`` (``image_id`` = the path): a tar that is corrupt, truncated or compressed, or a
  table that cannot be read. Records read before the problem are kept; a sample that was still
  being grouped when it occurred is dropped (it may be incomplete) and named in ``detail``. A
  CSV that stops being UTF-8 fails the piece that holds the bad bytes, from the decoding block
  that holds them; other pieces of the file are read.

Bad configuration raises ``ValueError`` up front: a pattern that matches nothing, a named
column that a table lacks, a table with no caption or image column to be found, a caption or
image column of the wrong type.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import glob
import io
import json
import os
import re
import tarfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import IO, Any

import numpy as np
from braceexpand import braceexpand

from counterfactual import fs
from counterfactual._lazy import require
from counterfactual.fs import safe_relative_path
from counterfactual.imageio import SampleError
from counterfactual.readers.clean import clean_text
from counterfactual.readers.keyset import KeySet, key_hash, key_hashes
from counterfactual.records import (
    Caption,
    Dataset,
    ImageRecord,
    ImageSource,
    Origin,
    ParquetCell,
    Status,
    TarMember,
)

PICTURE_FIELDS = ("jpg", "jpeg", "png", "webp")
"""WebDataset fields that hold the picture, in order of preference."""
CAPTION_COLUMNS = ("caption", "txt", "text", "TEXT")
IMAGE_COLUMNS = ("image", "jpg", "path", "file", "filepath", "file_name", "image_path")
ID_COLUMNS = ("key", "id", "image_id")
TABLE_KINDS = ("parquet", "csv")
PIECE_KINDS = ("wds", *TABLE_KINDS, "files")
KIND_SUFFIXES = {"wds": ".tar", "parquet": ".parquet", "csv": ".csv"}
"""The files a glob or a folder stands for, by corpus kind (``files``: folders)."""
MAX_TEXT_BYTES = 1 << 20
"""A ``txt`` or ``json`` member larger than this is not read (``bad-metadata``)."""

_GLOB_MAGIC = re.compile(r"[*?\[]")
# webdataset.tariterators: members named __...__ at the top level, or matching this, are skipped
_SKIP_META = re.compile(r"__[^/]*__($|/)")
# webdataset.tariterators.base_plus_ext: the key is everything before the first dot of the base
# name, directory kept; the field is the rest (lower-cased by webdataset.group_by_keys)
_KEY_FIELD = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_BLOCK = tarfile.BLOCKSIZE
_COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}
_PLAN_THREADS = 8
"""Table headers and footers read at once when planning files behind URLs."""
_URL_STAMP_SECONDS = 60
"""How long a worker trusts a URL's size and ETag before asking again (see :func:`read_source`)."""


def expand_pattern(pattern: str | Path, kind: str | None = None) -> list[str | Path]:
    """The files named by ``pattern``: brace expansion (``data/{00000..00009}.tar``), then shell
    globs (``*``, ``?``, ``[...]``) on each result, sorted within a glob, brace order kept.
    Local files come back as :class:`Path`, URLs as ``str`` (globbed through fsspec).

    A brace result without glob characters is kept even when it does not exist (the readers
    report it as ``missing-file``); a glob keeps only the files it matches. Raises
    ``ValueError`` naming the pattern when no existing file results.

    With a corpus ``kind`` the pattern may name folders, as img2dataset writes them, and its
    other files are left alone: a glob keeps only the kind's files (:data:`KIND_SUFFIXES`:
    ``*.tar``, ``*.parquet``, ``*.csv``), and an existing folder means its own files of that
    suffix, sorted (img2dataset's ``.parquet`` and ``_stats.json`` beside its tars are not
    read as shards). For ``"files"`` the pattern names shard folders instead (see
    :func:`iter_files`): a glob keeps the folders it matches, and a folder without pictures
    of its own means its subfolders (not those named ``_*`` or ``.*``, such as img2dataset's
    ``_tmp``).
    """
    if kind is not None and kind not in PIECE_KINDS:
        raise ValueError(f"corpus kind {kind!r} is not one of {PIECE_KINDS}")
    text = os.fspath(pattern)
    if not text:
        raise ValueError("empty file pattern")
    paths: list[str | Path] = []
    globbed = False
    passed_over = 0
    for part in braceexpand(text):
        if _GLOB_MAGIC.search(part):
            found = _glob_folders(part) if kind == "files" else fs.glob(part)
            if kind in KIND_SUFFIXES:
                ours = [p for p in found if _has_suffix(p, kind)]
                passed_over += len(found) - len(ours)
                found = ours
            globbed = globbed or bool(found)
            paths += found
        elif kind is not None and fs.isdir(part):
            found = _folder_inputs(part, kind)
            globbed = globbed or bool(found)
            paths += found
        else:
            paths.append(fs.as_path(part))
    if kind == "files":
        if not globbed and not any(fs.isdir(p) for p in paths):
            raise ValueError(
                f"no shard folder matches {text!r} (img2dataset's files output "
                "DIR/00000/KEY.jpg is read with --root DIR)"
            )
    elif not globbed and not any(fs.isfile(p) for p in paths):
        where = f"no file matches {text!r}"
        if kind is not None:
            where += f" (a glob or folder is read for its *{KIND_SUFFIXES[kind]} files"
            where += f"; {passed_over} other files passed over)" if passed_over else ")"
        raise ValueError(where)
    return paths


def _has_suffix(path: str | Path, kind: str) -> bool:
    return fs.name(path).lower().endswith(KIND_SUFFIXES[kind])


def _skipped_folder(name: str) -> bool:
    """Folders a ``files`` corpus never reads: ``_tmp`` (img2dataset's), hidden ones."""
    return name.startswith(("_", "."))


def _subfolders(folder: str) -> list[str | Path]:
    """The folders directly in ``folder``, sorted by name."""
    p = fs.as_path(folder)
    if isinstance(p, Path):
        return sorted((Path(e.path) for e in os.scandir(p) if e.is_dir()), key=lambda q: q.name)
    remote, inside = fs.filesystem(p)
    entries = remote.ls(inside, detail=True, refresh=True)
    names = sorted(fs.name(e["name"]) for e in entries if e.get("type") == "directory")
    return [fs.join(p, n) for n in names]


def _glob_folders(pattern: str) -> list[str | Path]:
    """The folders a glob matches, sorted; URLs keep their scheme."""
    p = fs.as_path(pattern)
    if isinstance(p, Path):
        return [Path(x) for x in sorted(glob.glob(str(p))) if os.path.isdir(x)]
    remote, inside = fs.filesystem(p)
    return [remote.unstrip_protocol(x) for x in sorted(remote.glob(inside)) if remote.isdir(x)]


def _folder_inputs(folder: str, kind: str) -> list[str | Path]:
    """What an existing folder named as a corpus stands for: its ``*.tar`` (``*.parquet``,
    ``*.csv``) files; for ``files``, itself when it holds a picture, else its subfolders."""
    if kind == "files":
        if any(_picture_name(n) for n in fs.listdir(folder)):
            return [fs.as_path(folder)]
        return [f for f in _subfolders(folder) if not _skipped_folder(fs.name(f))]
    names = [n for n in fs.listdir(folder) if n.lower().endswith(KIND_SUFFIXES[kind])]
    return [fs.join(folder, n) for n in names]


def _picture_name(name: str) -> bool:
    match = _KEY_FIELD.match(name)
    return match is not None and match.group(2).lower() in PICTURE_FIELDS


# --------------------------------------------------------------------------- pieces


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
class _File:
    """One input file as planned: its layout, and where its rows lie (Parquet: ``rows``, the
    row count from the footer; CSV: ``offset``, the byte offset just after the header)."""

    kind: str
    path: str
    index: int
    table: TableLayout | None = None
    rows: int = 0
    offset: int = 0


def plan_pieces(
    pattern: str | Path,
    kind: str,
    rows_per_piece: int,
    images: str | Path | None = None,
    caption_column: str | None = None,
    image_column: str | None = None,
    id_column: str | None = None,
) -> Iterator[InputPiece | Status]:
    """The pieces of a corpus, file by file in pattern order, each at most ``rows_per_piece``
    rows, and a ``failed`` status for each table that is missing (``missing-file``) or cannot
    be read (``bad-shard``).

    Runs in the driver in about 8 bytes per key (the run's
    :class:`~counterfactual.readers.keyset.KeySet`): a WebDataset shard is one piece, its
    headers read for its keys (a missing or bad tar is reported by :func:`read_piece`); a
    Parquet file is cut by the row counts in its footer (a piece may cross row groups), its id
    column read; a CSV is scanned once as bytes for row boundaries (a newline inside a quoted
    field does not end a row; parsing as :mod:`csv` does) and cut at every
    ``rows_per_piece``-th row, its ids read in a second pass. A file without rows gives no
    piece. Each piece carries the rows (``repeated``) or keys (``repeated_keys``) an earlier
    piece already had, decided in piece order whatever reads the pieces. The table options
    are those of :func:`iter_table` (ignored for ``"wds"``).

    Raises ``ValueError`` at the call, before any piece: an unknown ``kind``, a
    ``rows_per_piece`` below 1, a pattern that matches nothing, and for tables every file's
    columns checked as :func:`iter_table` checks them (its header or footer is read now).
    """
    if kind not in PIECE_KINDS:
        raise ValueError(f"corpus kind {kind!r} is not one of {PIECE_KINDS}")
    if isinstance(rows_per_piece, bool) or not isinstance(rows_per_piece, int):
        raise ValueError(f"rows_per_piece must be an integer, not {rows_per_piece!r}")
    if rows_per_piece < 1:
        raise ValueError(f"rows_per_piece must be at least 1, not {rows_per_piece}")
    files = _plan_files(pattern, kind, images, caption_column, image_column, id_column)
    return _pieces(files, rows_per_piece, KeySet())


def read_piece(piece: InputPiece) -> Iterator[ImageRecord | Status]:
    """The records and ``failed`` statuses of one piece, as :func:`iter_wds` /
    :func:`iter_table` yield them for those rows (same ids, ``file``, ``source``, captions and
    failure reasons), except that ``duplicate-key`` is checked within the piece and, for the
    rows the planner found repeating an earlier piece's key (``piece.repeated``,
    ``piece.repeated_keys``), across the run."""
    return _read_piece(piece, {})


def _plan_files(
    pattern: str | Path,
    kind: str,
    images: str | Path | None,
    caption_column: str | None,
    image_column: str | None,
    id_column: str | None,
) -> list[_File | Status]:
    paths = [str(p) for p in expand_pattern(pattern, kind)]
    if kind in ("wds", "files"):
        return [_File(kind, path, i) for i, path in enumerate(paths)]
    folder = None if images is None else str(fs.as_path(images))

    def plan(item: tuple[int, str]) -> _File | Status:
        index, path = item
        return _plan_table(path, index, kind, folder, caption_column, image_column, id_column)

    if len(paths) > 1 and any(fs.is_url(p) for p in paths):
        with ThreadPoolExecutor(_PLAN_THREADS) as pool:
            return list(pool.map(plan, enumerate(paths)))
    return [plan(item) for item in enumerate(paths)]


def _pieces(
    files: list[_File | Status], rows_per_piece: int | None, keys: KeySet | None = None
) -> Iterator[InputPiece | Status]:
    """Cut each planned file; ``rows_per_piece=None``: one piece per file, nothing scanned.
    ``keys``: the run's keys so far, to find the rows that repeat one (:func:`_file_keys`:
    read ahead on threads, taken in file order, so that which occurrence is first depends
    only on the input)."""
    ahead = _read_ahead(files, _file_keys) if keys is not None else None
    for file in files:
        hashes = next(ahead) if ahead is not None else None
        if isinstance(file, Status):
            yield file
        elif file.kind in ("wds", "files"):
            piece = InputPiece(file.kind, file.path, file.index)
            if keys is not None and hashes is not None and len(hashes):
                before = keys.contains(hashes)
                keys.add_hashes(hashes)
                if before.any():
                    again = np.unique(hashes[before]).astype("<u8").tobytes()
                    piece = replace(piece, repeated_keys=again)
            yield piece
        elif rows_per_piece is None:
            yield _piece(file, 0, None, file.offset, None)
        elif file.kind == "parquet":
            for start in range(0, file.rows, rows_per_piece):
                piece = _piece(file, start, min(start + rows_per_piece, file.rows))
                if keys is not None and hashes is not None:
                    repeats = keys.add_hashes(hashes[start : piece.stop])
                    rows = frozenset(start + i for i in np.flatnonzero(repeats).tolist())
                    piece = replace(piece, repeated=rows) if rows else piece
                yield piece
        else:
            yield from _csv_pieces(file, rows_per_piece, keys)


def _read_ahead(
    items: Sequence[_File | Status], read: Callable[[_File | Status], np.ndarray | None]
) -> Iterator[np.ndarray | None]:
    """``read(item)`` for each item, in order, at most ``2 * _PLAN_THREADS`` read ahead on
    threads (tar headers and Parquet id columns: waiting on storage, above all a URL's)."""
    with ThreadPoolExecutor(_PLAN_THREADS) as pool:
        window: deque[Any] = deque()
        for item in items:
            window.append(pool.submit(read, item))
            if len(window) > 2 * _PLAN_THREADS:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def _file_keys(file: _File | Status) -> np.ndarray | None:
    """The :func:`~counterfactual.readers.keyset.key_hashes` of the keys a worker gives the
    file's rows, in its order: a tar's sample keys from its headers (as :func:`read_piece`
    groups them, up to a fault), a shard folder's keys, a Parquet file's ids (its id column
    alone; ``STEM-ROW`` without one); ``None`` for a CSV (:func:`_csv_pieces` reads its ids)
    and for a file that cannot be read (its worker reports it)."""
    if isinstance(file, Status) or file.kind == "csv":
        return None
    if file.kind == "wds":
        return key_hashes(_tar_keys(file.path))
    if file.kind == "files":
        try:
            return key_hashes(sorted(_folder_groups(fs.listdir(file.path))))
        except OSError as err:
            _raise_if_store_down(err)
            return None
    return _parquet_key_hashes(file)


def _raise_if_store_down(err: BaseException) -> None:
    """Raise the cause of ``err`` when it is an object store down or stalled
    (:func:`counterfactual.fs.store_error`): the keys cannot be known, so planning stops (one
    line; the rerun plans again) rather than miss them. Any other fault is the file's own,
    which its worker meets and reports the same way."""
    cause = err.__cause__ if isinstance(err, _BadShard) else err
    if isinstance(cause, BaseException) and fs.store_error(cause) is not None:
        raise cause


def _tar_keys(path: str) -> list[str]:
    """A tar's sample keys, in order, read from its headers as :func:`_read_shard` reads them
    (a sample cut off by a fault is left out, as there)."""
    keys: list[str] = []
    try:
        with _open(path) as fh:
            keys.extend(sample.key for sample in _tar_samples(fh, path, []))
    except FileNotFoundError:
        pass  # its worker reports it missing
    except (OSError, _BadShard) as err:
        _raise_if_store_down(err)  # else the worker reports the tar; its keys up to the fault
    return keys


def _parquet_key_hashes(file: _File) -> np.ndarray | None:
    """The hashes of a Parquet file's row ids (:func:`_row_id`), read from the id column alone,
    row group by row group; up to a row group that cannot be read."""
    table = file.table
    assert table is not None
    stem = PurePosixPath(fs.name(file.path)).stem
    if table.id is None:
        return key_hashes([_row_id(stem, row, None) for row in range(file.rows)])
    pa, _ = _pyarrow()
    parts: list[np.ndarray] = []
    row = 0
    try:
        with _parquet(file.path) as pf:
            for group in range(pf.num_row_groups):
                ids = pf.read_row_group(group, columns=[table.id]).column(table.id).to_pylist()
                parts.append(key_hashes([_row_id(stem, row + i, x) for i, x in enumerate(ids)]))
                row += len(ids)
    except (OSError, pa.ArrowException) as err:
        _raise_if_store_down(err)  # else the worker meets the same fault
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _piece(
    file: _File, start: int, stop: int | None, offset: int = 0, end: int | None = None
) -> InputPiece:
    return InputPiece(file.kind, file.path, file.index, start, stop, offset, end, file.table)


def _read_piece(piece: InputPiece, seen: dict[str, str]) -> Iterator[ImageRecord | Status]:
    """``seen``: key or id -> where it was first seen, shared by the pieces of one stream."""
    again = frozenset(np.frombuffer(piece.repeated_keys, dtype="<u8").tolist())
    if piece.kind == "wds":
        return _read_shard(piece.path, seen, again)
    if piece.kind == "files":
        return _read_folder(piece.path, seen, again)
    if piece.kind not in TABLE_KINDS:
        raise ValueError(f"piece kind {piece.kind!r} is not one of {PIECE_KINDS}")
    if piece.table is None:
        raise ValueError(f"{piece.path}: a {piece.kind} piece needs its table layout")
    return _read_table_piece(piece, piece.table, seen)


def _read_all(plans: Iterator[InputPiece | Status]) -> Iterator[ImageRecord | Status]:
    seen: dict[str, str] = {}
    for item in plans:
        if isinstance(item, Status):
            yield item
        else:
            yield from _read_piece(item, seen)


def _open(path: str, cache_type: str | None = None) -> IO[bytes]:
    """A local file or URL opened for binary reading; ``cache_type`` is fsspec's (URLs only:
    ``"none"`` when the reader makes its own ranged reads, as pyarrow does)."""
    if cache_type is not None and fs.is_url(path):
        return fs.open_file(path, "rb", cache_type=cache_type)
    return fs.open_file(path, "rb")


def _absolute(path: str) -> str:
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


# --------------------------------------------------------------------------- WebDataset


@dataclass(slots=True)
class _Sample:
    """The members of one WebDataset sample so far: ``field -> TarInfo``, in tar order."""

    key: str
    members: dict[str, tarfile.TarInfo]


class _BadShard(Exception):
    """A shard or table cannot be read further; the message says why."""


def iter_wds(pattern: str | Path) -> Iterator[ImageRecord | Status]:
    """Records and ``failed`` statuses of the WebDataset shards named by ``pattern``, in shard
    and member order (the order webdataset's own loader yields the samples).

    The pattern is expanded at once (``ValueError`` when nothing matches); the shards are read
    lazily, headers only.
    """
    return _read_all(_pieces(_plan_files(pattern, "wds", None, None, None, None), None))


def read_wds(pattern: str | Path) -> Dataset:
    """:func:`iter_wds` collected: ``Dataset("wds", records, failures=statuses)``."""
    return collect("wds", iter_wds(pattern))


def _read_shard(
    shard: str, seen: dict[str, str], again: frozenset[int] = frozenset()
) -> Iterator[ImageRecord | Status]:
    """``again``: the hashes of the keys an earlier piece of the run had."""
    try:
        fh = _open(shard)
    except FileNotFoundError:
        yield Status(shard, "failed", "missing-file", f"no such shard {shard}")
        return
    except OSError as err:
        yield Status(shard, "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    with fh:
        pending: list[_Sample] = []
        try:
            for sample in _tar_samples(fh, shard, pending):
                yield _sample_row(sample, fh, shard, seen, again)
        except _BadShard as err:
            detail = str(err)
            if pending:
                detail += f"; sample {pending[0].key!r} was incomplete and is left out"
            yield Status(shard, "failed", "bad-shard", detail)
    yield from _downloader_rows(shard, seen)


def _file_size(fh: Any, path: str) -> int:
    """The size of an open file: ``fstat`` for a local one, fsspec's for a URL."""
    if not fs.is_url(path):
        return os.fstat(fh.fileno()).st_size
    size = getattr(fh, "size", None)
    return int(size) if isinstance(size, int) else fs.size(path)


def _tar_samples(fh: Any, path: str, pending: list[_Sample]) -> Iterator[_Sample]:
    """The samples of one open tar, grouped as webdataset groups them. ``pending`` holds the
    sample being grouped, so that the caller can name it when the shard turns out bad."""
    try:
        head = fh.read(_BLOCK)
        for magic, name in _COMPRESSED_MAGIC.items():
            if head.startswith(magic):
                raise _BadShard(f"{name}-compressed; only plain tar can be read by seeking")
        size = _file_size(fh, path)
        fh.seek(0)
        tar = tarfile.open(fileobj=fh, mode="r:")
        while (info := tar.next()) is not None:
            tar.members.clear()  # keep memory flat on large shards; members are not looked up
            key_field = member_key_field(info)
            if key_field is not None:  # a new key (or a repeated field) ends the sample before
                key, field = key_field
                current = pending[0] if pending else None
                if current is None or key != current.key or field in current.members:
                    if current is not None:
                        pending.clear()
                        yield current
                    pending.append(_Sample(key, {}))
            if info.offset_data + info.size > size:
                raise _BadShard(f"truncated: member {info.name!r} is cut off")
            if key_field is not None:
                pending[0].members[key_field[1]] = info
        _check_end(fh, tar.offset, size)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err
    if pending:
        last = pending.pop()
        yield last


def _check_end(fh: Any, offset: int, size: int) -> None:
    """After the last header tarfile found, only the end-of-archive zero blocks (or nothing) may
    follow; tarfile stops silently at a cut or corrupt header after the first."""
    if offset >= size:
        return
    fh.seek(offset)
    block = fh.read(_BLOCK)
    if len(block) < _BLOCK:
        raise _BadShard(f"truncated: {len(block)} bytes of a header at offset {offset}")
    if block.count(0) != _BLOCK:
        raise _BadShard(f"corrupt header at offset {offset}")


def member_key_field(info: tarfile.TarInfo) -> tuple[str, str] | None:
    """``(key, field)`` of a member, or ``None`` for members webdataset skips."""
    name = info.name
    if not info.isreg():
        return None
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None
    if _SKIP_META.match(name):
        return None
    match = _KEY_FIELD.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


def _sample_row(
    sample: _Sample, fh: Any, shard: str, seen: dict[str, str], again: frozenset[int]
) -> ImageRecord | Status:
    key = sample.key
    if key in seen:
        return Status(key, "failed", "duplicate-key", f"first in {seen[key]}, again in {shard}")
    seen[key] = shard  # also when repeated: img2dataset's metadata rows of it are passed over
    if again and key_hash(key) in again:
        return _repeated(key, shard)
    picture = next((sample.members[f] for f in PICTURE_FIELDS if f in sample.members), None)
    name = fs.name(shard)
    if picture is None:
        fields = ", ".join(sample.members)
        return Status(key, "failed", "missing-image", f"{name}: no picture among {fields}")
    members = {
        f: _TextMember(i.name, i.size, _member_reader(i, fh))
        for f in ("txt", "json")
        if (i := sample.members.get(f)) is not None
    }
    text = _caption_origin(key, members.get("txt"), members.get("json"))
    if isinstance(text, Status):
        return text
    return ImageRecord(
        image_id=key,
        file=f"{name}/{picture.name}",
        width=0,
        height=0,
        objects=(),
        captions=_captions(text[0]),
        root=None,
        dataset="wds",
        source=TarMember(_absolute(shard), picture.offset_data, picture.size),
        origin=text[1],
    )


def _repeated(key: str, where: str) -> Status:
    """The ``duplicate-key`` row of a key an earlier piece of the run had."""
    detail = f"{where}: an earlier piece of this run has the same key"
    return Status(key, "failed", "duplicate-key", detail)


@dataclass(frozen=True, slots=True)
class _TextMember:
    """A ``txt`` or ``json`` member (or file) of a sample: its name for messages, its size and
    how to read its bytes."""

    name: str
    size: int
    read: Callable[[], bytes]


def _member_reader(info: tarfile.TarInfo, fh: Any) -> Callable[[], bytes]:
    return lambda: _member_bytes(info, fh)


def _caption_origin(
    key: str, txt: _TextMember | None, meta: _TextMember | None
) -> tuple[str, Origin | None] | Status:
    """The stripped caption (``""`` when there is none) and the origin in the ``json``, or a
    ``bad-metadata`` status. The caption is the ``txt``, else the json's ``caption``; a json
    that cannot be read fails the sample only when the caption had to come from it (else the
    sample just has no origin)."""
    text = ""
    if txt is not None:
        if txt.size > MAX_TEXT_BYTES:
            return Status(key, "failed", "bad-metadata", _too_large(txt.name, txt.size))
        try:
            text = txt.read().decode("utf-8").strip()
        except UnicodeDecodeError as err:
            return Status(key, "failed", "bad-metadata", f"{txt.name}: not UTF-8 ({err})")
        if not clean_text(text).text:  # the json's caption, as for no txt
            text = ""
    if meta is None:
        return text, None
    value = _json_object(meta)
    if isinstance(value, str):
        return (text, None) if text else Status(key, "failed", "bad-metadata", value)
    if not text:
        caption = value.get("caption")
        text = caption.strip() if isinstance(caption, str) else ""
    return text, Origin.from_mapping(value)


def _json_object(meta: _TextMember) -> dict[str, Any] | str:
    """The member's JSON object, or why it is not one."""
    if meta.size > MAX_TEXT_BYTES:
        return _too_large(meta.name, meta.size)
    try:
        value = json.loads(meta.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{meta.name}: not JSON ({err})"
    if not isinstance(value, dict):
        return f"{meta.name}: not a JSON object"
    return value


def _captions(text: str) -> tuple[Caption, ...]:
    """The record's caption ``"0"``, cleaned (:func:`counterfactual.readers.clean.clean_text`); none
    when it is empty after cleaning."""
    clean = clean_text(text)
    return (Caption("0", clean.text, None, clean.removed),) if clean.text else ()


def _too_large(name: str, size: int) -> str:
    return f"{name}: {size} bytes, over the {MAX_TEXT_BYTES} read for text"


def _member_bytes(info: tarfile.TarInfo, fh: Any) -> bytes:
    """The data of a small member. Reads with one seek on the tar's own file; tarfile seeks
    back before its next header."""
    try:
        fh.seek(info.offset_data)
        data = fh.read(info.size)
    except OSError as err:
        raise _BadShard(f"{info.name}: {type(err).__name__}: {err}") from err
    if len(data) != info.size:
        raise _BadShard(f"truncated: short read of member {info.name!r}")
    return data


# --------------------------------------------------------------------------- files


def iter_files(pattern: str | Path) -> Iterator[ImageRecord | Status]:
    """Records and ``failed`` statuses of a ``files`` corpus, img2dataset's ``files`` output:
    shard folders (``DIR/00000/``) holding, per sample, ``KEY.jpg`` (or ``jpeg``, ``png``,
    ``webp``), ``KEY.txt`` and ``KEY.json``, read as a WebDataset sample's members are (key
    and field from the file name, the caption from ``txt`` else ``json["caption"]``, the
    origin from the ``json``). ``pattern`` names the shard folders, or the folder that holds
    them (:func:`expand_pattern`). A record's ``root`` is the shard folder's parent and its
    ``file`` is ``SHARD/KEY.jpg``, loaded like an annotated dataset's picture. Folders are
    read in pattern order, files by key.
    """
    return _read_all(_pieces(_plan_files(pattern, "files", None, None, None, None), None))


def read_files(pattern: str | Path) -> Dataset:
    """:func:`iter_files` collected: ``Dataset("files", records, failures=statuses)``."""
    return collect("files", iter_files(pattern))


def files_root(pattern: str | Path) -> str | None:
    """The folder a ``files`` corpus's record ``file`` names (``SHARD/KEY.jpg``) are relative
    to: the folder ``pattern`` names when it holds shard folders, the parent of a shard folder
    or of a pattern whose last part alone has braces or globs; ``None`` when the shard folders
    may lie in several folders."""
    text = os.fspath(pattern).rstrip("/") or "/"
    if not _GLOB_MAGIC.search(text) and "{" not in text:
        if fs.isdir(text) and not any(_picture_name(n) for n in fs.listdir(text)):
            return text
        return str(fs.parent(text))
    parent = str(fs.parent(text))
    return None if _GLOB_MAGIC.search(parent) or "{" in parent else parent


def _read_folder(
    folder: str, seen: dict[str, str], again: frozenset[int] = frozenset()
) -> Iterator[ImageRecord | Status]:
    try:
        if not fs.isdir(folder):
            yield Status(folder, "failed", "missing-file", f"no such shard folder {folder}")
            return
        names = fs.listdir(folder)
    except OSError as err:
        yield Status(folder, "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    groups = _folder_groups(names)
    for key in sorted(groups):
        yield _file_row(folder, key, groups[key], seen, again)
    yield from _downloader_rows(folder, seen)


def _folder_groups(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """A shard folder's files by key, then field (``KEY.jpg`` -> ``{KEY: {"jpg": ...}}``)."""
    groups: dict[str, dict[str, str]] = {}
    for name in names:
        match = _KEY_FIELD.match(name)
        if match is not None and not name.startswith("."):
            groups.setdefault(match.group(1), {})[match.group(2).lower()] = name
    return groups


def _file_row(
    folder: str, key: str, fields: dict[str, str], seen: dict[str, str], again: frozenset[int]
) -> ImageRecord | Status:
    shard = fs.name(folder)
    if key in seen:
        return Status(key, "failed", "duplicate-key", f"first in {seen[key]}, again in {folder}")
    seen[key] = folder
    if again and key_hash(key) in again:
        return _repeated(key, folder)
    picture = next((fields[f] for f in PICTURE_FIELDS if f in fields), None)
    if picture is None:
        names = ", ".join(fields)
        return Status(key, "failed", "missing-image", f"{shard}: no picture among {names}")
    members = {}
    for field in ("txt", "json"):
        if field in fields:
            member = _small_file(fs.join(folder, fields[field]))
            if isinstance(member, str):
                return Status(key, "failed", "bad-metadata", member)
            members[field] = member
    text = _caption_origin(key, members.get("txt"), members.get("json"))
    if isinstance(text, Status):
        return text
    file = f"{shard}/{picture}"
    captions = _captions(text[0])
    root = fs.parent(folder)
    return ImageRecord(key, file, 0, 0, (), captions, root, None, "files", None, text[1])


def _small_file(path: str | Path) -> _TextMember | str:
    """A ``txt`` or ``json`` file, read up to one byte over :data:`MAX_TEXT_BYTES`, or why it
    cannot be read."""
    try:
        with _open(str(path)) as fh:
            data = fh.read(MAX_TEXT_BYTES + 1)
    except OSError as err:
        return f"{fs.name(path)}: {type(err).__name__}: {err}"
    return _TextMember(fs.name(path), len(data), lambda: data)


# --------------------------------------------------------------------------- img2dataset's
# metadata: {shard}.parquet beside each tar or shard folder, one row per input url


def _metadata_path(shard: str) -> str | None:
    """img2dataset's ``00000.parquet`` beside ``00000.tar`` or the ``00000/`` folder."""
    name = fs.name(shard)
    if name.lower().endswith(".tar"):
        name = name[: -len(".tar")]
    elif "." in name:
        return None
    return str(fs.join(fs.parent(shard), f"{name}.parquet"))


def _downloader_rows(shard: str, seen: dict[str, str]) -> Iterator[Status]:
    """A ``failed`` status for each url img2dataset's metadata beside ``shard`` lists and the
    shard lacks: ``download-failed`` (its status is not ``success``; ``detail``: its status,
    error_message and url), or ``missing-image`` (a success whose sample is not in the shard,
    e.g. cut off a truncated tar). Nothing when there is no metadata file, or it lacks
    img2dataset's ``key`` and ``status`` columns; a ``bad-shard`` when it cannot be read."""
    meta = _metadata_path(shard)
    if meta is None or not fs.isfile(meta):
        return
    pa, _ = _pyarrow()
    try:
        with _parquet(meta) as pf:
            names = pf.schema_arrow.names
            if "key" not in names or "status" not in names:
                return
            rows = pf.read(columns=[c for c in Origin.FIELDS if c in names]).to_pylist()
    except FileNotFoundError:
        return
    except (OSError, pa.ArrowException) as err:
        detail = f"img2dataset's metadata: {type(err).__name__}: {err}"
        yield Status(meta, "failed", "bad-shard", detail)
        return
    for row in rows:
        key = row.get("key")
        if not isinstance(key, str) or not key or key in seen:
            continue
        seen[key] = meta
        origin = Origin.from_mapping(row) or Origin(key=key)
        if origin.status == "success":
            detail = f"{fs.name(meta)} lists it as downloaded; {fs.name(shard)} has no such sample"
            yield Status(key, "failed", "missing-image", detail, url=origin.url)
        else:
            yield Status(key, "failed", "download-failed", download_detail(origin), url=origin.url)


def download_detail(origin: Origin) -> str:
    """A failed download as a status row's ``detail``: ``STATUS: ERROR_MESSAGE (URL)``."""
    detail = f"{origin.status or 'not downloaded'}: {origin.error_message or 'no error message'}"
    return f"{detail} ({origin.url})" if origin.url else detail


# --------------------------------------------------------------------------- Parquet and CSV


def iter_table(
    pattern: str | Path,
    kind: str,
    images: str | Path | None = None,
    caption_column: str | None = None,
    image_column: str | None = None,
    id_column: str | None = None,
) -> Iterator[ImageRecord | Status]:
    """Records and ``failed`` statuses of the Parquet or CSV tables named by ``pattern``, file
    by file, row by row.

    Columns not named are the first present of :data:`CAPTION_COLUMNS`,
    :data:`IMAGE_COLUMNS` and :data:`ID_COLUMNS`; without an id column a row's id is
    ``f"{file stem}-{row:08d}"`` (``row`` counted from 0 within the file; also used for an empty
    id cell). An image cell holding the picture (binary, or a struct whose ``bytes`` is set)
    gives ``source`` = :class:`ParquetCell` and ``file`` = ``f"{file name}#{row}"``; a path cell
    gives ``file`` relative to ``root`` = ``images`` (default: the table's folder). An absolute
    path is accepted only inside ``images``.

    Every file's columns are checked before the first row: ``ValueError`` names the file and
    its columns when a named column is absent, no caption or image column is found, or a column
    has a type that cannot hold what it should. A CSV cell is always a string, so an empty image
    cell there is ``missing-image``.
    """
    if kind not in TABLE_KINDS:
        raise ValueError(f"table kind {kind!r} is not one of {TABLE_KINDS}")
    files = _plan_files(pattern, kind, images, caption_column, image_column, id_column)
    return _read_all(_pieces(files, None))


def read_table(
    pattern: str | Path,
    kind: str,
    images: str | Path | None = None,
    caption_column: str | None = None,
    image_column: str | None = None,
    id_column: str | None = None,
) -> Dataset:
    """:func:`iter_table` collected: ``Dataset(kind, records, failures=statuses)``."""
    rows = iter_table(pattern, kind, images, caption_column, image_column, id_column)
    return collect(kind, rows)


def _pyarrow() -> tuple[ModuleType, ModuleType]:
    return require("pyarrow", "corpora"), require("pyarrow.parquet", "corpora")


@contextlib.contextmanager
def _parquet(path: str) -> Iterator[Any]:
    """A ``pyarrow.parquet.ParquetFile`` on a local path, or on an fsspec file for a URL."""
    _, pq = _pyarrow()
    if not fs.is_url(path):
        with pq.ParquetFile(path) as pf:
            yield pf
        return
    with _open(path, cache_type="none") as fh, pq.ParquetFile(fh) as pf:
        yield pf


def _pick(
    path: str, columns: Sequence[str], named: str | None, defaults: tuple[str, ...], role: str
) -> str | None:
    """The column to use for ``role``: ``named`` (which must exist), else the first default
    present, else ``None``."""
    if named is not None:
        if named not in columns:
            raise ValueError(f"{path}: no {role} column {named!r}; its columns: {list(columns)}")
        return named
    return next((c for c in defaults if c in columns), None)


def _plan_table(
    path: str,
    index: int,
    kind: str,
    images: str | None,
    caption_column: str | None,
    image_column: str | None,
    id_column: str | None,
) -> _File | Status:
    """Choose the columns of one file, reading only its header or Parquet footer."""
    rows = offset = 0
    types: dict[str, Any] = {}
    try:
        if kind == "parquet":
            columns, types, rows = _parquet_schema(path)
        else:
            header, offset = _csv_header(path)
            columns = list(header)
    except FileNotFoundError:
        return Status(path, "failed", "missing-file", f"no such {kind}")
    except _BadShard as err:
        return Status(path, "failed", "bad-shard", str(err))
    caption = _pick(path, columns, caption_column, CAPTION_COLUMNS, "caption")
    image = _pick(path, columns, image_column, IMAGE_COLUMNS, "image")
    ident = _pick(path, columns, id_column, ID_COLUMNS, "id")
    if caption is None or image is None:
        role, names = ("caption", CAPTION_COLUMNS) if caption is None else ("image", IMAGE_COLUMNS)
        raise ValueError(
            f"{path}: no {role} column (looked for {list(names)}; name one); "
            f"its columns: {list(columns)}"
        )
    holds = "path"
    if kind == "parquet":
        holds = _image_holds(types[image])
        if holds is None:
            raise ValueError(
                f"{path}: image column {image!r} has type {types[image]}; expected binary, "
                "string, or struct<bytes: binary, path: string>"
            )
        if not (_is_string(types[caption]) or _is_null(types[caption])):
            raise ValueError(
                f"{path}: caption column {caption!r} has type {types[caption]}; expected string"
            )
    header_row = tuple(columns) if kind == "csv" else ()
    origin = tuple(
        c for c in Origin.FIELDS if c in columns and (kind == "csv" or _is_string(types[c]))
    )
    if not set(origin) - {"key"}:  # an id column alone is no origin
        origin = ()
    table = TableLayout(caption, image, ident, holds, header_row, images, origin)
    return _File(kind, path, index, table, rows, offset)


def _parquet_schema(path: str) -> tuple[list[str], dict[str, Any], int]:
    """The column names, their Arrow types and the row count, from the footer."""
    pa, _ = _pyarrow()
    try:
        with _parquet(path) as pf:
            schema = pf.schema_arrow
            rows = pf.metadata.num_rows
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise _BadShard(f"not a readable Parquet file: {err}") from err
    return list(schema.names), {f.name: f.type for f in schema}, int(rows)


def _csv_header(path: str) -> tuple[list[str], int]:
    """The header row and the byte offset just after it."""
    try:
        with _open(path) as fh:
            end = next(_csv_records(_binary_lines(fh), 0), (0, True))[0]
            fh.seek(0)
            data = fh.read(end)
        # utf-8-sig: a byte-order mark (Excel writes one) is no part of the first column's name
        header = next(csv.reader(io.StringIO(data.decode("utf-8-sig"), newline="")), None)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err
    if not header:
        raise _BadShard("no header row")
    return header, end


def _value_type(kind: Any) -> Any:
    pa, _ = _pyarrow()
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _is_string(kind: Any) -> bool:
    pa, _ = _pyarrow()
    kind = _value_type(kind)
    string_view = getattr(pa.types, "is_string_view", lambda _: False)
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or string_view(kind))


def _is_null(kind: Any) -> bool:
    pa, _ = _pyarrow()
    return bool(pa.types.is_null(kind))


def _is_binary(kind: Any) -> bool:
    pa, _ = _pyarrow()
    binary_view = getattr(pa.types, "is_binary_view", lambda _: False)
    return bool(
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or binary_view(kind)
    )


def _image_holds(kind: Any) -> str | None:
    """What an image column of Arrow type ``kind`` holds, or ``None`` when it cannot be one."""
    pa, _ = _pyarrow()
    if _is_binary(kind):
        return "bytes"
    if _is_string(kind):
        return "path"
    if pa.types.is_struct(kind):
        fields = {kind.field(i).name: kind.field(i).type for i in range(kind.num_fields)}
        if "bytes" in fields and _is_binary(fields["bytes"]):
            if "path" not in fields or _is_string(fields["path"]):
                return "struct"
    return None


@dataclass(frozen=True, slots=True)
class _InFile:
    """An image cell whose picture lies in the table itself."""

    row_group: int
    row: int


_Cell = _InFile | str | None
"""An image cell: the picture in the table, a path, or nothing."""
_Row = tuple[int, Any, Any, _Cell, Origin | None]
"""A table row as read: row in file, id, caption, image cell, origin."""


def _read_table_piece(
    piece: InputPiece, table: TableLayout, seen: dict[str, str]
) -> Iterator[ImageRecord | Status]:
    root = fs.as_path(table.images) if table.images is not None else fs.parent(piece.path)
    rows = _parquet_rows(piece, table) if piece.kind == "parquet" else _csv_rows(piece, table)
    stem = PurePosixPath(fs.name(piece.path)).stem
    try:
        for row, ident, caption, cell, origin in rows:
            yield _table_row(piece, table, stem, root, row, ident, caption, cell, origin, seen)
    except FileNotFoundError:
        yield Status(piece.path, "failed", "missing-file", f"no such {piece.kind}")
    except _BadShard as err:
        yield Status(piece.path, "failed", "bad-shard", str(err))


def _table_row(
    piece: InputPiece,
    table: TableLayout,
    stem: str,
    root: str | Path,
    row: int,
    ident: Any,
    caption: Any,
    cell: _Cell,
    origin: Origin | None,
    seen: dict[str, str],
) -> ImageRecord | Status:
    image_id = _row_id(stem, row, ident)
    where = f"{fs.name(piece.path)}#{row}"
    if image_id in seen:
        detail = f"first at {seen[image_id]}, again at {piece.path}#{row}"
        return Status(image_id, "failed", "duplicate-key", detail)
    if row in piece.repeated:
        detail = f"{piece.path}#{row}: an earlier row of this run has the same id"
        return Status(image_id, "failed", "duplicate-key", detail)
    seen[image_id] = f"{piece.path}#{row}"
    if cell is None:
        if origin is not None and origin.status not in (None, "success"):
            detail = download_detail(origin)
            return Status(image_id, "failed", "download-failed", detail, url=origin.url)
        return Status(image_id, "failed", "missing-image", f"{where}: {table.image!r} is empty")
    captions = _captions(caption if isinstance(caption, str) else "")
    kind = piece.kind
    if isinstance(cell, _InFile):
        source = ParquetCell(_absolute(piece.path), cell.row_group, cell.row, table.image)
        return ImageRecord(image_id, where, 0, 0, (), captions, None, None, kind, source, origin)
    file = _inside(cell, root)
    if file is None:
        return Status(image_id, "failed", "unsafe-path", repr(cell))
    return ImageRecord(image_id, file, 0, 0, (), captions, root, None, kind, None, origin)


def _row_id(stem: str, row: int, ident: Any) -> str:
    """A table row's id: its id cell, else ``STEM-ROW`` (the file's stem, the row from 0)."""
    return f"{stem}-{row:08d}" if ident is None or ident == "" else str(ident)


def _inside(cell: str, root: str | Path) -> str | None:
    """``cell`` as a path relative to ``root``, or ``None`` when it would leave ``root``. An
    absolute path (a URL, when ``root`` is one) is accepted when it lies inside ``root``
    (compared lexically; symlinks are checked when the picture is loaded)."""
    if isinstance(root, str):  # a URL: only a URL under it, or a relative path
        base = root.rstrip("/") + "/"
        if cell.startswith(base):
            cell = cell[len(base) :]
        return safe_relative_path(cell)
    if os.path.isabs(cell):
        base = os.path.abspath(root)
        path = os.path.normpath(cell)
        if path == base or os.path.commonpath([base, path]) != base:
            return None
        cell = os.path.relpath(path, base)
    return safe_relative_path(cell)


def _parquet_rows(piece: InputPiece, table: TableLayout) -> Iterator[_Row]:
    """``(row in file, id, caption, image cell, origin)`` for each row of the piece, one row
    group at a time (a row group the piece only partly covers is read whole and sliced)."""
    pa, _ = _pyarrow()
    try:
        with _parquet(piece.path) as pf:
            meta = pf.metadata
            stop = meta.num_rows if piece.stop is None else piece.stop
            first = 0
            for group in range(pf.num_row_groups):
                if first >= stop:
                    break
                rows = meta.row_group(group).num_rows
                lo, hi = max(piece.start, first), min(stop, first + rows)
                if lo < hi:
                    yield from _group_rows(pf, table, group, first, lo - first, hi - first)
                first += rows
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err


def _group_rows(
    pf: Any, table: TableLayout, group: int, first: int, lo: int, hi: int
) -> Iterator[_Row]:
    """Rows ``lo`` to ``hi`` (within the group) of row group ``group``, which starts at row
    ``first`` of the file."""
    leaf = f"{table.image}.bytes" if table.holds == "struct" else table.image
    read_image = table.holds == "path" or not _no_nulls(pf, group, leaf)
    wanted = [c for c in (table.id, table.caption, table.image if read_image else None) if c]
    wanted += table.origin
    data = pf.read_row_group(group, columns=list(dict.fromkeys(wanted))).slice(lo, hi - lo)
    count = hi - lo
    ids = data.column(table.id).to_pylist() if table.id is not None else [None] * count
    captions = data.column(table.caption).to_pylist()
    origins = _origins({c: data.column(c).to_pylist() for c in table.origin}, count)
    cells: list[_Cell]
    if not read_image:
        cells = [_InFile(group, lo + i) for i in range(count)]
    else:
        cells = _image_cells(data.column(table.image).combine_chunks(), table.holds, group, lo)
    for i in range(count):
        yield first + lo + i, ids[i], captions[i], cells[i], origins[i]


def _origins(columns: dict[str, list[Any]], count: int) -> list[Origin | None]:
    """Each row's :class:`Origin` from the origin columns' values."""
    if not columns:
        return [None] * count
    return [Origin.from_mapping({c: v[i] for c, v in columns.items()}) for i in range(count)]


def _no_nulls(pf: Any, group: int, leaf: str) -> bool:
    """Whether the row group's statistics say column ``leaf`` has no null (so the picture
    bytes need not be read to know every row has one)."""
    meta = pf.metadata.row_group(group)
    for j in range(meta.num_columns):
        column = meta.column(j)
        if column.path_in_schema == leaf:
            stats = column.statistics
            return bool(stats is not None and stats.has_null_count and stats.null_count == 0)
    return False


def _image_cells(column: Any, holds: str, group: int, lo: int) -> list[_Cell]:
    """The cells of ``column``, whose first row is row ``lo`` of row group ``group``."""
    if holds == "path":
        return column.to_pylist()
    if holds == "bytes":
        return [None if null else _InFile(group, lo + i) for i, null in enumerate(column.is_null())]
    fields = dict(zip((f.name for f in column.type), column.flatten(), strict=True))
    has_bytes = fields["bytes"].is_valid().to_pylist()
    paths = fields["path"].to_pylist() if "path" in fields else [None] * len(column)
    return [
        _InFile(group, lo + i) if b else p
        for i, (b, p) in enumerate(zip(has_bytes, paths, strict=True))
    ]


# --------------------------------------------------------------------------- CSV rows

# One field as Python's csv module (excel dialect, strict=False) reads it: quoted (a closing
# quote may be followed by more characters, kept literally up to the next delimiter) or
# unquoted (quotes inside are literal); a bare CR ends an unquoted record, as a newline does.
_FIELD = rb'(?:"[^"]*+(?:""[^"]*+)*+"[^,\r\n]*+|[^",\r\n][^,\r\n]*+)?'
_RECORD = re.compile(_FIELD + rb"(?:," + _FIELD + rb")*+")
"""The fields of a record from its start; stops at its end or at a quote left open."""
_QUOTED_REST = re.compile(rb'[^"]*+(?:""[^"]*+)*+"[^,\r\n]*+(?:,' + _FIELD + rb")*+")
"""The rest of a record from inside a quoted field opened on an earlier line."""
_BLANK = (b"\n", b"\r\n", b"\r")
_SCAN_BLOCK = 1 << 20


def _binary_lines(fh: Any, block: int = _SCAN_BLOCK) -> Iterator[bytes]:
    """The lines of a binary file, each with its ``\\n`` (the last one may lack it), read in
    blocks (fsspec files have no fast ``readline``)."""
    rest = b""
    while chunk := fh.read(block):
        lines = io.BytesIO(rest + chunk).readlines()
        rest = lines.pop() if not lines[-1].endswith(b"\n") else b""
        yield from lines
    if rest:
        yield rest


def _csv_records(lines: Iterable[bytes], pos: int) -> Iterator[tuple[int, bool]]:
    """``(byte offset one past the record, whether it is blank)`` for each CSV record in
    ``lines``, which start at byte ``pos``: the records :func:`csv.reader` reads (a blank one
    is a line it reads as ``[]``), found without decoding or parsing fields.

    A line is a record by itself unless it opens a quoted field that it does not close; quotes
    are looked at only in lines that have one, and from where a field may open one.
    """
    inside = False
    for line in lines:
        base, size = pos, len(line)
        pos += size
        if not inside:
            last = size - 2 if line.endswith(b"\n") else size - 1
            if b'"' not in line and line.find(b"\r", 0, last) < 0:
                yield pos, line in _BLANK
                continue
            i, fresh = 0, True
        else:
            match = _QUOTED_REST.match(line)
            if match is None:
                continue  # the quoted field goes on
            i, fresh, inside = match.end(), False, False
        while True:
            start = i
            if fresh:
                if i >= size:
                    break
                i = _RECORD.match(line, i).end()  # type: ignore[union-attr]  # always matches
            blank = fresh and i == start
            if i >= size:  # the file ends without a newline
                yield pos, False
                break
            char = line[i : i + 1]
            if char == b'"':  # a quoted field goes on past this line
                inside = True
                break
            if char == b"\n" or line[i:] == b"\r\n":
                yield pos, blank
                break
            yield base + i + 1, blank  # a bare CR
            i, fresh = i + 1, True
    if inside:  # a quoted field open at the end of the file ends there, as csv reads it
        yield pos, False


def _csv_pieces(
    file: _File, rows_per_piece: int, keys: KeySet | None = None
) -> Iterator[InputPiece | Status]:
    """Cut a CSV after every ``rows_per_piece``-th non-blank record, scanning it once; with
    ``keys``, each piece's rows whose id the run had already (:func:`_csv_ids`, a second
    pass) are its ``repeated``."""
    rows, offset = 0, file.offset
    ids = _csv_ids(file) if keys is not None else None

    def piece(start: int, stop: int, end: int | None) -> InputPiece:
        nonlocal ids
        found = _piece(file, start, stop, offset, end)
        if keys is None or ids is None:
            return found
        batch = [next(ids, _NO_MORE) for _ in range(stop - start)]
        if any(ident is _NO_MORE for ident in batch):
            ids = None  # the second pass ended early: the rest is checked within pieces
            return found
        stem = PurePosixPath(fs.name(file.path)).stem
        repeats = keys.add([_row_id(stem, start + i, ident) for i, ident in enumerate(batch)])
        repeated = frozenset(start + i for i, again in enumerate(repeats) if again)
        return replace(found, repeated=repeated) if repeated else found

    try:
        with _open(file.path) as fh:
            fh.seek(file.offset)
            for end, blank in _csv_records(_binary_lines(fh), file.offset):
                if blank:
                    continue
                rows += 1
                if rows % rows_per_piece == 0:
                    yield piece(rows - rows_per_piece, rows, end)
                    offset = end
    except FileNotFoundError:
        yield Status(file.path, "failed", "missing-file", f"no such {file.kind}")
        return
    except OSError as err:
        yield Status(file.path, "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    if rows % rows_per_piece:
        yield piece(rows - rows % rows_per_piece, rows, None)


_NO_MORE = object()


def _csv_ids(file: _File) -> Iterator[str | None]:
    """The id cell of each non-blank data row of a CSV (``None`` when empty or absent; all
    ``None`` without an id column), read as :func:`_csv_rows` reads them. Bytes that are not
    UTF-8 are replaced (the worker fails the piece that holds them); a file that cannot be
    read or parsed ends the ids there (its rows are then checked within their piece only)."""
    table = file.table
    if table is None or table.id is None:
        while True:
            yield None
    at = table.header.index(table.id)
    try:
        with _open(file.path) as fh:
            fh.seek(file.offset)
            buffered = io.BufferedReader(_Window(fh, None), _SCAN_BLOCK)
            text = io.TextIOWrapper(buffered, encoding="utf-8", errors="replace", newline="")
            for cells in csv.reader(text):
                if cells:
                    yield cells[at] if at < len(cells) and cells[at] else None
    except (OSError, csv.Error):
        return


class _Window(io.RawIOBase):
    """The next ``limit`` bytes of ``fh`` (all of them when ``limit`` is ``None``)."""

    def __init__(self, fh: Any, limit: int | None) -> None:
        super().__init__()
        self._fh = fh
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = len(buffer) if self._left is None else min(len(buffer), self._left)
        data = self._fh.read(size) if size > 0 else b""
        buffer[: len(data)] = data
        if self._left is not None:
            self._left -= len(data)
        return len(data)


def _csv_rows(piece: InputPiece, table: TableLayout) -> Iterator[_Row]:
    """``(row in file, id, caption, path, origin)`` for each non-blank data row of the piece;
    empty cells are ``None``."""
    at = {name: table.header.index(name) for name in dict.fromkeys(table.header)}
    index = [None if name is None else at[name] for name in (table.id, table.caption, table.image)]
    origin_at = {name: at[name] for name in table.origin}
    try:
        with _open(piece.path) as fh:
            fh.seek(piece.offset)
            limit = None if piece.end is None else piece.end - piece.offset
            buffered = io.BufferedReader(_Window(fh, limit), _SCAN_BLOCK)
            text = io.TextIOWrapper(buffered, encoding="utf-8", newline="")
            row = piece.start
            for cells in csv.reader(text):
                if not cells:
                    continue
                ident, caption, image = (
                    cells[i] if i is not None and i < len(cells) and cells[i] else None
                    for i in index
                )
                found = {c: cells[i] for c, i in origin_at.items() if i < len(cells)}
                yield row, ident, caption, image, Origin.from_mapping(found) if found else None
                row += 1
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err


# --------------------------------------------------------------------------- reading pictures


def read_source(source: ImageSource) -> bytes:
    """The encoded picture that ``source`` points to (its ``path`` a local path or URL).

    Raises :class:`~counterfactual.imageio.SampleError` ``missing-file`` when the tar or
    Parquet file is gone and ``read-error`` when the bytes are not there (a short read, an
    index out of range, an empty cell).

    A Parquet cell's row group column is kept for the next cells of the same group (a worker
    reads a table's rows in order), keyed on the file's modification time and size; for a URL
    on its size and ETag, asked for at most once a minute.
    """
    if isinstance(source, TarMember):
        return _read_member(source)
    if isinstance(source, ParquetCell):
        return _read_cell(source)
    raise TypeError(f"not an image source: {source!r}")


def _read_member(source: TarMember) -> bytes:
    try:
        if fs.is_url(source.path):
            remote, inside = fs.filesystem(source.path)
            end = source.offset + source.size
            data = remote.cat_file(inside, start=source.offset, end=end)
        else:
            with open(source.path, "rb") as fh:
                fh.seek(source.offset)
                data = fh.read(source.size)
    except FileNotFoundError as err:
        raise SampleError("missing-file", source.path) from err
    except OSError as err:
        raise SampleError("read-error", f"{source.path}: {type(err).__name__}: {err}") from err
    if len(data) != source.size:
        raise SampleError(
            "read-error",
            f"{source.path}: {len(data)} of {source.size} bytes at offset {source.offset}",
        )
    return data


def _read_cell(source: ParquetCell) -> bytes:
    pa, _ = _pyarrow()
    where = f"{source.path} row group {source.row_group} row {source.row} {source.column!r}"
    try:
        if fs.is_url(source.path):
            version = _url_version(source.path, int(time.monotonic() // _URL_STAMP_SECONDS))
        else:
            stat = os.stat(source.path)
            version = (str(stat.st_mtime_ns), stat.st_size)
        column = _group_column(source.path, version, source.row_group, source.column)
    except FileNotFoundError as err:
        raise SampleError("missing-file", source.path) from err
    except (OSError, KeyError, pa.ArrowException) as err:
        raise SampleError("read-error", f"{where}: {type(err).__name__}: {err}") from err
    if not 0 <= source.row < len(column):
        raise SampleError("read-error", f"{where}: the row group has {len(column)} rows")
    cell = column[source.row]
    if pa.types.is_struct(cell.type):
        cell = cell["bytes"] if cell.is_valid else None
    data = None if cell is None else cell.as_py()
    if not isinstance(data, bytes) or not data:
        raise SampleError("read-error", f"{where}: empty cell")
    return data


@functools.lru_cache(maxsize=16)
def _url_version(path: str, period: int) -> tuple[str, int]:
    """``(ETag, size)`` of the object at ``path``; ``period`` (the minute) is part of the key so
    that a worker asks again once a minute rather than once a picture."""
    remote, inside = fs.filesystem(path)
    info = remote.info(inside)
    tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or ""
    return str(tag), int(info.get("size") or 0)


@functools.lru_cache(maxsize=2)
def _group_column(path: str, version: tuple[str, int], row_group: int, column: str) -> Any:
    """One column of one row group, kept for the next rows of the same group (a worker reads a
    table's rows in order). ``version`` (modification time or ETag, and size) is part of the key
    so that a rewritten file is read again."""
    with _parquet(path) as pf:
        if not 0 <= row_group < pf.num_row_groups:
            raise KeyError(f"no row group {row_group} (the file has {pf.num_row_groups})")
        if column not in pf.schema_arrow.names:
            raise KeyError(f"no column {column!r}")
        return pf.read_row_group(row_group, columns=[column]).column(column)


__all__ = [
    "CAPTION_COLUMNS",
    "ID_COLUMNS",
    "IMAGE_COLUMNS",
    "KIND_SUFFIXES",
    "PICTURE_FIELDS",
    "PIECE_KINDS",
    "InputPiece",
    "TableLayout",
    "collect",
    "download_detail",
    "expand_pattern",
    "files_root",
    "iter_files",
    "iter_table",
    "iter_wds",
    "member_key_field",
    "plan_pieces",
    "read_files",
    "read_piece",
    "read_source",
    "read_table",
    "read_wds",
]
