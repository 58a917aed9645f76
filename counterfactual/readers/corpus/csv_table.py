"""CSV tables (``kind="csv"``): like Parquet, one row per picture, but the image column holds
paths. Read as Python's :mod:`csv` reads it (the ``excel`` dialect, UTF-8, blank lines
skipped); cut into pieces by one binary scan that records the byte offset of every
``rows_per_piece``-th row (a newline inside a quoted field does not end a row), so that a
worker reads its piece from its offset. A CSV that stops being UTF-8 fails the piece that holds
the bad bytes, from the decoding block that holds them; other pieces of the file are read."""

from __future__ import annotations

import csv
import io
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from counterfactual import fs
from counterfactual.readers.corpus.common import (
    BadShard,
    InputPiece,
    PlannedFile,
    TableLayout,
    open_binary,
    raise_if_store_down,
    row_id,
    table_piece,
)
from counterfactual.readers.corpus.table import TableFormat, TableRow, TableSchema
from counterfactual.readers.keyset import KeySet
from counterfactual.records import Origin, Status

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
_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)
"""Python's csv reads no field over ``csv.field_size_limit()`` characters (131,072 by default)
and raises, which would end the piece at the first long cell; the byte scan knows no limit, so
the reader takes any field a C ``long`` can count (2**31 - 1 where that is 32 bits). A caption
cell over :data:`MAX_TEXT_BYTES` then fails its row alone (``bad-metadata``)."""


def _reader(text: Iterable[str]) -> Iterator[list[str]]:
    """:func:`csv.reader` (excel dialect) with the field limit raised to :data:`_FIELD_LIMIT`
    (a process setting, set again at each call so that nothing else can have lowered it)."""
    csv.field_size_limit(_FIELD_LIMIT)
    return csv.reader(text)


class Csv(TableFormat):
    """The :class:`~counterfactual.readers.corpus.common.CorpusFormat` of CSV tables."""

    kind = "csv"
    suffix = ".csv"
    root_help = "its files or their folder, e.g. 'data/{00000..00009}.csv' or 'data'"

    def schema(self, path: str) -> TableSchema:
        header, offset = _csv_header(path)
        return TableSchema(list(header), offset=offset, header=tuple(header))

    def keys(self, file: PlannedFile) -> np.ndarray | None:
        return None  # read by split, in the same order as its scan

    def split(
        self, file: PlannedFile, rows_per_piece: int, keys: KeySet | None, hashes: np.ndarray | None
    ) -> Iterator[InputPiece | Status]:
        return _csv_pieces(file, rows_per_piece, keys)

    def rows(self, piece: InputPiece, table: TableLayout) -> Iterator[TableRow]:
        return _csv_rows(piece, table)


FORMAT = Csv()


def _csv_header(path: str) -> tuple[list[str], int]:
    """The header row and the byte offset just after it."""
    try:
        with open_binary(path) as fh:
            end = next(_csv_records(_binary_lines(fh), 0), (0, True))[0]
            fh.seek(0)
            data = fh.read(end)
        # utf-8-sig: a byte-order mark (Excel writes one) is no part of the first column's name
        header = next(_reader(io.StringIO(data.decode("utf-8-sig"), newline="")), None)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise BadShard(f"{type(err).__name__}: {err}") from err
    if not header:
        raise BadShard("no header row")
    return header, end


def _binary_lines(fh: Any, block: int = _SCAN_BLOCK) -> Iterator[bytes]:
    """The lines of a binary file, each with its ``\\n`` (the last one may lack it), read in
    blocks (fsspec files have no fast ``readline``)."""
    rest: list[bytes] = []  # a line longer than a block, in parts (joined once: linear)
    while chunk := fh.read(block):
        if b"\n" not in chunk:
            rest.append(chunk)
            continue
        lines = io.BytesIO(b"".join((*rest, chunk))).readlines()
        rest = [lines.pop()] if not lines[-1].endswith(b"\n") else []
        yield from lines
    if rest:
        yield b"".join(rest)


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
    file: PlannedFile, rows_per_piece: int, keys: KeySet | None = None
) -> Iterator[InputPiece | Status]:
    """Cut a CSV after every ``rows_per_piece``-th non-blank record, scanning it once; with
    ``keys``, each piece's rows whose id the run had already (:func:`_csv_ids`, a second
    pass) are its ``repeated``."""
    rows, offset = 0, file.offset
    ids = _csv_ids(file) if keys is not None else None

    def piece(start: int, stop: int, end: int | None) -> InputPiece:
        nonlocal ids
        found = table_piece(file, start, stop, offset, end)
        if keys is None or ids is None:
            return found
        batch = [next(ids, _NO_MORE) for _ in range(stop - start)]
        if any(ident is _NO_MORE for ident in batch):
            ids = None  # the second pass ended early: the rest is checked within pieces
            return found
        stem = PurePosixPath(fs.name(file.path)).stem
        repeats = keys.add([row_id(stem, start + i, ident) for i, ident in enumerate(batch)])
        repeated = frozenset(start + i for i, again in enumerate(repeats) if again)
        return replace(found, repeated=repeated) if repeated else found

    try:
        with open_binary(file.path) as fh:
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
        raise_if_store_down(err)  # the store's fault, not the file's: the run stops
        yield Status(file.path, "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    if rows % rows_per_piece:
        yield piece(rows - rows % rows_per_piece, rows, None)


_NO_MORE = object()


def _csv_ids(file: PlannedFile) -> Iterator[str | None]:
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
        with open_binary(file.path) as fh:
            fh.seek(file.offset)
            buffered = io.BufferedReader(_Window(fh, None), _SCAN_BLOCK)
            text = io.TextIOWrapper(buffered, encoding="utf-8", errors="replace", newline="")
            for cells in _reader(text):
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


def _csv_rows(piece: InputPiece, table: TableLayout) -> Iterator[TableRow]:
    """``(row in file, id, caption, path, origin)`` for each non-blank data row of the piece;
    empty cells are ``None``."""
    at = {name: table.header.index(name) for name in dict.fromkeys(table.header)}
    index = [None if name is None else at[name] for name in (table.id, table.caption, table.image)]
    origin_at = {name: at[name] for name in table.origin}
    try:
        with open_binary(piece.path) as fh:
            fh.seek(piece.offset)
            limit = None if piece.end is None else piece.end - piece.offset
            buffered = io.BufferedReader(_Window(fh, limit), _SCAN_BLOCK)
            text = io.TextIOWrapper(buffered, encoding="utf-8", newline="")
            row = piece.start
            for cells in _reader(text):
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
        raise BadShard(f"{type(err).__name__}: {err}") from err
