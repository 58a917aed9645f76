"""A corpus read piece by piece: the driver plans the pieces (:func:`plan_pieces`), a worker
reads one (:func:`read_piece`) and the pictures in it (:func:`read_source`); the whole-stream
readers (:func:`iter_corpus`, :func:`iter_wds`, :func:`iter_table`, :func:`iter_files`) are the
same machinery with one piece per file. Every kind is looked up in
:data:`~counterfactual.readers.corpus.formats.FORMATS`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np

from counterfactual import fs
from counterfactual.readers.corpus.common import (
    InputPiece,
    PlannedFile,
    PlanOptions,
    collect,
    read_ahead,
)
from counterfactual.readers.corpus.formats import FORMATS, PIECE_KINDS, TABLE_KINDS
from counterfactual.readers.corpus.parquet import read_cell
from counterfactual.readers.corpus.pattern import expand_pattern, pattern_root
from counterfactual.readers.corpus.wds import read_member
from counterfactual.readers.keyset import KeySet
from counterfactual.records import Dataset, ImageRecord, ImageSource, ParquetCell, Status, TarMember


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
) -> list[PlannedFile | Status]:
    """The pattern's files planned by their format, in pattern order; a file (a tar, a
    table, a shard folder) that resolves outside :func:`pattern_root` is an ``unsafe-path``
    row, never opened."""
    paths = [str(p) for p in expand_pattern(pattern, kind)]
    options = PlanOptions(images, caption_column, image_column, id_column)
    root = pattern_root(pattern, kind)
    outside = {i for i, path in enumerate(paths) if fs.inside(root, path) is None}
    planned = iter(
        FORMATS[kind].plan([p for i, p in enumerate(paths) if i not in outside], options)
    )
    files: list[PlannedFile | Status] = []
    for i, path in enumerate(paths):
        if i in outside:
            detail = f"{path}: resolves outside {root} (a link out of the corpus folder)"
            files.append(Status(path, "failed", "unsafe-path", detail))
            continue
        file = next(planned)
        files.append(replace(file, index=i) if isinstance(file, PlannedFile) else file)
    return files


def _pieces(
    files: list[PlannedFile | Status], rows_per_piece: int | None, keys: KeySet | None = None
) -> Iterator[InputPiece | Status]:
    """Cut each planned file; ``rows_per_piece=None``: one piece per file, nothing scanned.
    ``keys``: the run's keys so far, to find the rows that repeat one (:func:`_file_keys`:
    read ahead on threads, taken in file order, so that which occurrence is first depends
    only on the input)."""
    ahead = read_ahead(files, _file_keys) if keys is not None else None
    for file in files:
        hashes = next(ahead) if ahead is not None else None
        if isinstance(file, Status):
            yield file
        else:
            yield from FORMATS[file.kind].cut(file, rows_per_piece, keys, hashes)


def _file_keys(file: PlannedFile | Status) -> np.ndarray | None:
    """The :func:`~counterfactual.readers.keyset.key_hashes` of the keys a worker gives the
    file's rows, in its order: a tar's sample keys from its headers (as :func:`read_piece`
    groups them, up to a fault), a shard folder's keys, a Parquet file's ids (its id column
    alone; ``STEM-ROW`` without one); ``None`` for a CSV (its ``split`` reads its ids)
    and for a file that cannot be read (its worker reports it)."""
    if isinstance(file, Status):
        return None
    return FORMATS[file.kind].keys(file)


def _read_piece(piece: InputPiece, seen: dict[str, str]) -> Iterator[ImageRecord | Status]:
    """``seen``: key or id -> where it was first seen, shared by the pieces of one stream."""
    found = FORMATS.get(piece.kind)
    if found is None:
        raise ValueError(f"piece kind {piece.kind!r} is not one of {PIECE_KINDS}")
    return found.read(piece, seen)


def _read_all(plans: Iterator[InputPiece | Status]) -> Iterator[ImageRecord | Status]:
    seen: dict[str, str] = {}
    for item in plans:
        if isinstance(item, Status):
            yield item
        else:
            yield from _read_piece(item, seen)


def iter_corpus(
    pattern: str | Path,
    kind: str,
    images: str | Path | None = None,
    caption_column: str | None = None,
    image_column: str | None = None,
    id_column: str | None = None,
) -> Iterator[ImageRecord | Status]:
    """Records and ``failed`` statuses of the corpus of any ``kind`` named by ``pattern``, file
    by file (:func:`iter_wds`, :func:`iter_table`, :func:`iter_files`; the table options are
    ignored by the other kinds). The pattern is expanded and every table's columns checked at
    the call (``ValueError``); the files are read lazily."""
    files = _plan_files(pattern, kind, images, caption_column, image_column, id_column)
    return _read_all(_pieces(files, None))


def iter_wds(pattern: str | Path) -> Iterator[ImageRecord | Status]:
    """Records and ``failed`` statuses of the WebDataset shards named by ``pattern``, in shard
    and member order (the order webdataset's own loader yields the samples).

    The pattern is expanded at once (``ValueError`` when nothing matches); the shards are read
    lazily, headers only.
    """
    return iter_corpus(pattern, "wds")


def read_wds(pattern: str | Path) -> Dataset:
    """:func:`iter_wds` collected: ``Dataset("wds", records, failures=statuses)``."""
    return collect("wds", iter_wds(pattern))


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
    return iter_corpus(pattern, "files")


def read_files(pattern: str | Path) -> Dataset:
    """:func:`iter_files` collected: ``Dataset("files", records, failures=statuses)``."""
    return collect("files", iter_files(pattern))


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
    return iter_corpus(pattern, kind, images, caption_column, image_column, id_column)


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
        return read_member(source)
    if isinstance(source, ParquetCell):
        return read_cell(source)
    raise TypeError(f"not an image source: {source!r}")
