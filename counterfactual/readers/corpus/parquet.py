"""Parquet tables (``kind="parquet"``): one row per picture, cut into pieces by the row counts
in the footer and read by row group, only the id and caption columns, plus the image column
when the row group's statistics do not rule out empty cells. The image column holds the encoded
picture (a binary column, or a struct ``{bytes, path}`` as Hugging Face datasets write images),
read back by a worker as a :class:`~counterfactual.records.ParquetCell`, or a path."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from counterfactual import fs
from counterfactual.imageio import SampleError
from counterfactual.readers.corpus.common import (
    BadShard,
    InputPiece,
    PlannedFile,
    TableLayout,
    parquet_file,
    pyarrow_modules,
    raise_if_store_down,
    row_id,
    table_piece,
)
from counterfactual.readers.corpus.table import (
    ImageCell,
    InFile,
    TableFormat,
    TableRow,
    TableSchema,
)
from counterfactual.readers.keyset import KeySet, key_hashes
from counterfactual.records import Origin, ParquetCell, Status

_URL_STAMP_SECONDS = 60
"""How long a worker trusts a URL's size and ETag before asking again (see :func:`read_source`)."""


class Parquet(TableFormat):
    """The :class:`~counterfactual.readers.corpus.common.CorpusFormat` of Parquet tables."""

    kind = "parquet"
    suffix = ".parquet"
    root_help = "its files or their folder, e.g. 'data/{00000..00009}.parquet' or 'data'"

    def schema(self, path: str) -> TableSchema:
        columns, types, rows = _parquet_schema(path)
        return TableSchema(columns, types, rows)

    def holds(self, path: str, schema: TableSchema, caption: str, image: str) -> str:
        types = schema.types
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
        return holds

    def textual(self, schema: TableSchema, column: str) -> bool:
        return _is_string(schema.types[column])

    def keys(self, file: PlannedFile) -> np.ndarray | None:
        return _parquet_key_hashes(file)

    def split(
        self, file: PlannedFile, rows_per_piece: int, keys: KeySet | None, hashes: np.ndarray | None
    ) -> Iterator[InputPiece | Status]:
        """Pieces by the footer's row count (a piece may cross row groups); with ``keys``, each
        piece's rows whose id the run had already are its ``repeated``."""
        for start in range(0, file.rows, rows_per_piece):
            piece = table_piece(file, start, min(start + rows_per_piece, file.rows))
            if keys is not None and hashes is not None:
                repeats = keys.add_hashes(hashes[start : piece.stop])
                rows = frozenset(start + i for i in np.flatnonzero(repeats).tolist())
                piece = replace(piece, repeated=rows) if rows else piece
            yield piece

    def rows(self, piece: InputPiece, table: TableLayout) -> Iterator[TableRow]:
        return _parquet_rows(piece, table)


FORMAT = Parquet()


def _parquet_key_hashes(file: PlannedFile) -> np.ndarray | None:
    """The hashes of a Parquet file's row ids (:func:`row_id`), read from the id column alone,
    row group by row group; up to a row group that cannot be read."""
    table = file.table
    assert table is not None
    stem = PurePosixPath(fs.name(file.path)).stem
    if table.id is None:
        return key_hashes([row_id(stem, row, None) for row in range(file.rows)])
    pa, _ = pyarrow_modules()
    parts: list[np.ndarray] = []
    row = 0
    try:
        with parquet_file(file.path) as pf:
            for group in range(pf.num_row_groups):
                ids = pf.read_row_group(group, columns=[table.id]).column(table.id).to_pylist()
                parts.append(key_hashes([row_id(stem, row + i, x) for i, x in enumerate(ids)]))
                row += len(ids)
    except (OSError, pa.ArrowException) as err:
        raise_if_store_down(err)  # else the worker meets the same fault
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _parquet_schema(path: str) -> tuple[list[str], dict[str, Any], int]:
    """The column names, their Arrow types and the row count, from the footer."""
    pa, _ = pyarrow_modules()
    try:
        with parquet_file(path) as pf:
            schema = pf.schema_arrow
            rows = pf.metadata.num_rows
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise BadShard(f"not a readable Parquet file: {err}") from err
    return list(schema.names), {f.name: f.type for f in schema}, int(rows)


def _value_type(kind: Any) -> Any:
    pa, _ = pyarrow_modules()
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _is_string(kind: Any) -> bool:
    pa, _ = pyarrow_modules()
    kind = _value_type(kind)
    string_view = getattr(pa.types, "is_string_view", lambda _: False)
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or string_view(kind))


def _is_null(kind: Any) -> bool:
    pa, _ = pyarrow_modules()
    return bool(pa.types.is_null(kind))


def _is_binary(kind: Any) -> bool:
    pa, _ = pyarrow_modules()
    binary_view = getattr(pa.types, "is_binary_view", lambda _: False)
    return bool(
        pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_fixed_size_binary(kind)
        or binary_view(kind)
    )


def _image_holds(kind: Any) -> str | None:
    """What an image column of Arrow type ``kind`` holds, or ``None`` when it cannot be one."""
    pa, _ = pyarrow_modules()
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


def _parquet_rows(piece: InputPiece, table: TableLayout) -> Iterator[TableRow]:
    """``(row in file, id, caption, image cell, origin)`` for each row of the piece, one row
    group at a time (a row group the piece only partly covers is read whole and sliced)."""
    pa, _ = pyarrow_modules()
    try:
        with parquet_file(piece.path) as pf:
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
        raise BadShard(f"{type(err).__name__}: {err}") from err


def _group_rows(
    pf: Any, table: TableLayout, group: int, first: int, lo: int, hi: int
) -> Iterator[TableRow]:
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
    cells: list[ImageCell]
    if not read_image:
        cells = [InFile(group, lo + i) for i in range(count)]
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


def _image_cells(column: Any, holds: str, group: int, lo: int) -> list[ImageCell]:
    """The cells of ``column``, whose first row is row ``lo`` of row group ``group``."""
    if holds == "path":
        return column.to_pylist()
    if holds == "bytes":
        return [None if null else InFile(group, lo + i) for i, null in enumerate(column.is_null())]
    fields = dict(zip((f.name for f in column.type), column.flatten(), strict=True))
    has_bytes = fields["bytes"].is_valid().to_pylist()
    paths = fields["path"].to_pylist() if "path" in fields else [None] * len(column)
    return [
        InFile(group, lo + i) if b else p
        for i, (b, p) in enumerate(zip(has_bytes, paths, strict=True))
    ]


def read_cell(source: ParquetCell) -> bytes:
    pa, _ = pyarrow_modules()
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
        raise_if_store_down(err)
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
    with parquet_file(path) as pf:
        if not 0 <= row_group < pf.num_row_groups:
            raise KeyError(f"no row group {row_group} (the file has {pf.num_row_groups})")
        if column not in pf.schema_arrow.names:
            raise KeyError(f"no column {column!r}")
        return pf.read_row_group(row_group, columns=[column]).column(column)
