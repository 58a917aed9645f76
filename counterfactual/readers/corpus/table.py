"""What Parquet and CSV tables share: one row per picture, the columns chosen once per file
(:class:`TableFormat` plans them from a header or footer), and a row made a record (its id, its
image cell: a picture in the table or a path under ``images``)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from counterfactual import fs
from counterfactual.fs import safe_relative_path
from counterfactual.readers.corpus.common import (
    CAPTION_COLUMNS,
    ID_COLUMNS,
    IMAGE_COLUMNS,
    MAX_TEXT_BYTES,
    PLAN_THREADS,
    BadShard,
    InputPiece,
    PlannedFile,
    PlanOptions,
    TableLayout,
    absolute_source,
    raise_if_store_down,
    record_captions,
    row_id,
    table_piece,
)
from counterfactual.readers.corpus.members import download_detail
from counterfactual.readers.keyset import KeySet
from counterfactual.records import ImageRecord, Origin, ParquetCell, Status


@dataclass(frozen=True, slots=True)
class InFile:
    """An image cell whose picture lies in the table itself."""

    row_group: int
    row: int


ImageCell = InFile | str | None
"""An image cell: the picture in the table, a path, or nothing."""
TableRow = tuple[int, Any, Any, ImageCell, Origin | None]
"""A table row as read: row in file, id, caption, image cell, origin."""


@dataclass(frozen=True, slots=True)
class TableSchema:
    """A table's columns as its header or footer gives them: ``types``, their Arrow types
    (Parquet; empty for CSV), ``rows``, the row count (Parquet), ``offset``, the byte offset
    just after the header (CSV), ``header``, the header row (CSV)."""

    columns: list[str]
    types: dict[str, Any] = field(default_factory=dict)
    rows: int = 0
    offset: int = 0
    header: tuple[str, ...] = ()


class TableFormat:
    """A :class:`~counterfactual.readers.corpus.common.CorpusFormat` for tables, one row per
    picture; a subclass reads its file type: :meth:`schema`, :meth:`rows`, :meth:`keys`,
    :meth:`split`, and what a column's type allows (:meth:`holds`, :meth:`textual`)."""

    kind: str
    suffix: str
    root_help: str

    def default_images(self, root: str) -> str | None:
        return None  # path cells are relative to the table's folder

    def plan(self, paths: Sequence[str], options: PlanOptions) -> list[PlannedFile | Status]:
        """Every file's columns, its header or footer read (on threads for URLs)."""
        images = None if options.images is None else str(fs.as_path(options.images))

        def plan(item: tuple[int, str]) -> PlannedFile | Status:
            index, path = item
            return self._plan_file(path, index, images, options)

        if len(paths) > 1 and any(fs.is_url(p) for p in paths):
            with ThreadPoolExecutor(PLAN_THREADS) as pool:
                return list(pool.map(plan, enumerate(paths)))
        return [plan(item) for item in enumerate(paths)]

    def cut(
        self,
        file: PlannedFile,
        rows_per_piece: int | None,
        keys: KeySet | None,
        hashes: np.ndarray | None,
    ) -> Iterator[InputPiece | Status]:
        if rows_per_piece is None:
            yield table_piece(file, 0, None, file.offset, None)
        else:
            yield from self.split(file, rows_per_piece, keys, hashes)

    def read(self, piece: InputPiece, seen: dict[str, str]) -> Iterator[ImageRecord | Status]:
        if piece.table is None:
            raise ValueError(f"{piece.path}: a {piece.kind} piece needs its table layout")
        return _read_table_piece(piece, piece.table, self.rows(piece, piece.table), seen)

    def keys(self, file: PlannedFile) -> np.ndarray | None:
        raise NotImplementedError

    def schema(self, path: str) -> TableSchema:
        """The file's columns; raises ``FileNotFoundError``, or ``BadShard`` saying why the
        file cannot be read."""
        raise NotImplementedError

    def split(
        self, file: PlannedFile, rows_per_piece: int, keys: KeySet | None, hashes: np.ndarray | None
    ) -> Iterator[InputPiece | Status]:
        """The file's pieces of ``rows_per_piece`` rows (see :meth:`cut`)."""
        raise NotImplementedError

    def rows(self, piece: InputPiece, table: TableLayout) -> Iterator[TableRow]:
        """``(row in file, id, caption, image cell, origin)`` for each row of the piece; raises
        ``FileNotFoundError``, or ``BadShard`` when the file cannot be read further."""
        raise NotImplementedError

    def holds(self, path: str, schema: TableSchema, caption: str, image: str) -> str:
        """What the image column holds (:attr:`TableLayout.holds`), or ``ValueError`` naming
        a caption or image column whose type cannot hold what it should."""
        return "path"

    def textual(self, schema: TableSchema, column: str) -> bool:
        """Whether ``column`` holds strings (an origin column must)."""
        return True

    def _plan_file(
        self, path: str, index: int, images: str | None, options: PlanOptions
    ) -> PlannedFile | Status:
        """Choose the columns of one file, reading only its header or footer."""
        try:
            schema = self.schema(path)
        except FileNotFoundError:
            return Status(path, "failed", "missing-file", f"no such {self.kind}")
        except BadShard as err:
            raise_if_store_down(err)  # the store's fault, not the file's: the run stops
            return Status(path, "failed", "bad-shard", str(err))
        columns = schema.columns
        caption = _pick(path, columns, options.caption_column, CAPTION_COLUMNS, "caption")
        image = _pick(path, columns, options.image_column, IMAGE_COLUMNS, "image")
        ident = _pick(path, columns, options.id_column, ID_COLUMNS, "id")
        if caption is None or image is None:
            role, names = (
                ("caption", CAPTION_COLUMNS) if caption is None else ("image", IMAGE_COLUMNS)
            )
            raise ValueError(
                f"{path}: no {role} column (looked for {list(names)}; name one); "
                f"its columns: {list(columns)}"
            )
        holds = self.holds(path, schema, caption, image)
        origin = tuple(c for c in Origin.FIELDS if c in columns and self.textual(schema, c))
        if not set(origin) - {"key"}:  # an id column alone is no origin
            origin = ()
        table = TableLayout(caption, image, ident, holds, schema.header, images, origin)
        return PlannedFile(self.kind, path, index, table, schema.rows, schema.offset)


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


def _read_table_piece(
    piece: InputPiece, table: TableLayout, rows: Iterator[TableRow], seen: dict[str, str]
) -> Iterator[ImageRecord | Status]:
    """The records and statuses of a piece's ``rows``, as its format reads them."""
    root = fs.as_path(table.images) if table.images is not None else fs.parent(piece.path)
    stem = PurePosixPath(fs.name(piece.path)).stem
    try:
        for row, ident, caption, cell, origin in rows:
            yield _table_row(piece, table, stem, root, row, ident, caption, cell, origin, seen)
    except FileNotFoundError:
        yield Status(piece.path, "failed", "missing-file", f"no such {piece.kind}")
    except BadShard as err:
        raise_if_store_down(err)
        yield Status(piece.path, "failed", "bad-shard", str(err))


def _table_row(
    piece: InputPiece,
    table: TableLayout,
    stem: str,
    root: str | Path,
    row: int,
    ident: Any,
    caption: Any,
    cell: ImageCell,
    origin: Origin | None,
    seen: dict[str, str],
) -> ImageRecord | Status:
    image_id = row_id(stem, row, ident)
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
    if isinstance(caption, str) and len(caption) > MAX_TEXT_BYTES // 4:
        size = len(caption.encode("utf-8", "surrogatepass"))
        if size > MAX_TEXT_BYTES:
            detail = f"{where}: caption of {size} bytes, over the {MAX_TEXT_BYTES} read for text"
            return Status(image_id, "failed", "bad-metadata", detail)
    captions = record_captions(caption if isinstance(caption, str) else "")
    kind = piece.kind
    if isinstance(cell, InFile):
        source = ParquetCell(absolute_source(piece.path), cell.row_group, cell.row, table.image)
        return ImageRecord(image_id, where, 0, 0, (), captions, None, None, kind, source, origin)
    file = _inside(cell, root)
    if file is None:
        return Status(image_id, "failed", "unsafe-path", repr(cell))
    if fs.inside(root, fs.join(root, file)) is None:  # a link out of the images folder
        return Status(image_id, "failed", "unsafe-path", f"{cell!r} resolves outside {root}")
    return ImageRecord(image_id, file, 0, 0, (), captions, root, None, kind, None, origin)


def _inside(cell: str, root: str | Path) -> str | None:
    """``cell`` as a path relative to ``root``, or ``None`` when it would leave ``root``. An
    absolute path (a URL, when ``root`` is one) is accepted when it lies inside ``root``
    (compared lexically here; the caller then resolves links with :func:`fs.inside`)."""
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
