"""Box-less image-text corpora: WebDataset shards, Parquet tables and CSV tables.

These corpora have pictures and captions but no boxes, so every record has ``objects=()``,
``width = height = 0`` (unknown until decoded; a detector supplies the objects later), one
:class:`~counterfactual.records.Caption` with ``caption_id`` ``"0"`` (or none), ``split=None``
and ``dataset`` ``"wds"``, ``"parquet"`` or ``"csv"``.

Formats:

- **WebDataset** (:func:`iter_wds`): uncompressed tar shards in which the members of one sample
  share a key, the member name up to the first dot of its base name, directory kept
  (``a/000000123.jpg`` -> key ``a/000000123``, field ``jpg``), as :mod:`webdataset` groups them:
  consecutive members with the same key form a sample. img2dataset writes ``jpg``, ``txt`` (the
  caption) and ``json`` (metadata, with ``caption`` among other fields) per sample. The picture
  is the first of the fields ``jpg``, ``jpeg``, ``png``, ``webp`` that the sample has; the
  caption is ``txt`` (UTF-8, stripped), else ``json["caption"]``.
- **Parquet** (:func:`iter_table`, ``kind="parquet"``): one row per picture. The image column
  holds the encoded picture (a binary column, or a struct ``{bytes, path}`` as Hugging Face
  datasets write images) or a path to a picture file.
- **CSV** (:func:`iter_table`, ``kind="csv"``): like Parquet, but the image column holds paths.

Streaming: readers never read picture data. A shard's tar headers are read one after another
and the data between them is skipped by seeking; only the small ``txt`` / ``json`` members are
read. Parquet is read by row group, only the id and caption columns, plus the image column when
the row group's statistics do not rule out empty cells. A picture inside another file gets a
``source`` (:class:`~counterfactual.records.TarMember`: byte offset and size;
:class:`~counterfactual.records.ParquetCell`: row group, row and column), which a worker reads
with :func:`read_source` (one seek for a tar member); a picture file of its own gets ``file``
relative to ``root``, as in the annotated datasets.

Bad data never raises; it becomes a ``failed`` :class:`~counterfactual.records.Status`:

- ``missing-image``: a sample without a picture member, or a row whose image cell is null
  (a struct with neither ``bytes`` nor ``path``; in a CSV, an empty cell).
- ``duplicate-key``: a key or id already seen earlier in the same stream (any shard or file);
  the first one is kept, ``detail`` names both places.
- ``bad-metadata``: the caption would come from a member that cannot be read as text (a ``txt``
  that is not UTF-8, a ``json`` that does not parse or is not an object, text members over
  1 MiB).
- ``unsafe-path``: a path cell that is absolute outside the images folder, climbs out with
  ``..``, names a drive or URL, or is an empty string (Parquet).
- ``missing-file`` (``image_id`` = the path): a shard or table that does not exist.
- ``bad-shard`` (``image_id`` = the path): a tar that is corrupt, truncated or compressed, or a
  table that cannot be read. Records read before the problem are kept; a sample that was still
  being grouped when it occurred is dropped (it may be incomplete) and named in ``detail``.

Bad configuration raises ``ValueError`` up front: a pattern that matches nothing, a named
column that a table lacks, a table with no caption or image column to be found, a caption or
image column of the wrong type.
"""

from __future__ import annotations

import csv
import functools
import glob
import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from braceexpand import braceexpand

from counterfactual._lazy import require
from counterfactual.imageio import SampleError
from counterfactual.readers import safe_relative_path
from counterfactual.records import (
    Caption,
    Dataset,
    ImageRecord,
    ImageSource,
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


def expand_pattern(pattern: str | Path) -> list[Path]:
    """The files named by ``pattern``: brace expansion (``data/{00000..00009}.tar``), then shell
    globs (``*``, ``?``, ``[...]``) on each result, sorted within a glob, brace order kept.

    A brace result without glob characters is kept even when it does not exist (the readers
    report it as ``missing-file``); a glob keeps only the files it matches. Raises
    ``ValueError`` naming the pattern when no existing file results.
    """
    text = os.fspath(pattern)
    if not text:
        raise ValueError("empty file pattern")
    paths: list[Path] = []
    for part in braceexpand(text):
        if _GLOB_MAGIC.search(part):
            paths += [Path(p) for p in sorted(glob.glob(part)) if os.path.isfile(p)]
        else:
            paths.append(Path(part))
    if not any(p.is_file() for p in paths):
        raise ValueError(f"no file matches {text!r}")
    return paths


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
    return _iter_shards(expand_pattern(pattern))


def _iter_shards(shards: list[Path]) -> Iterator[ImageRecord | Status]:
    seen: dict[str, int] = {}
    for index, shard in enumerate(shards):
        yield from _iter_shard(shard, index, shards, seen)


def read_wds(pattern: str | Path) -> Dataset:
    """:func:`iter_wds` collected: ``Dataset("wds", records, failures=statuses)``."""
    return _collect("wds", iter_wds(pattern))


def _iter_shard(
    shard: Path, index: int, shards: list[Path], seen: dict[str, int]
) -> Iterator[ImageRecord | Status]:
    try:
        fh = open(shard, "rb")
    except FileNotFoundError:
        yield Status(str(shard), "failed", "missing-file", f"no such shard {shard}")
        return
    except OSError as err:
        yield Status(str(shard), "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    with fh:
        pending: list[_Sample] = []
        try:
            for sample in _tar_samples(fh, pending):
                yield _sample_row(sample, fh, shard, index, shards, seen)
        except _BadShard as err:
            detail = str(err)
            if pending:
                detail += f"; sample {pending[0].key!r} was incomplete and is left out"
            yield Status(str(shard), "failed", "bad-shard", detail)


def _tar_samples(fh: Any, pending: list[_Sample]) -> Iterator[_Sample]:
    """The samples of one open tar, grouped as webdataset groups them. ``pending`` holds the
    sample being grouped, so that the caller can name it when the shard turns out bad."""
    try:
        head = fh.read(_BLOCK)
        for magic, name in _COMPRESSED_MAGIC.items():
            if head.startswith(magic):
                raise _BadShard(f"{name}-compressed; only plain tar can be read by seeking")
        size = os.fstat(fh.fileno()).st_size
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
    sample: _Sample, fh: Any, shard: Path, index: int, shards: list[Path], seen: dict[str, int]
) -> ImageRecord | Status:
    key = sample.key
    if key in seen:
        first = shards[seen[key]]
        return Status(key, "failed", "duplicate-key", f"first in {first}, again in {shard}")
    seen[key] = index
    picture = next((sample.members[f] for f in PICTURE_FIELDS if f in sample.members), None)
    if picture is None:
        fields = ", ".join(sample.members)
        return Status(key, "failed", "missing-image", f"{shard.name}: no picture among {fields}")
    text = _wds_caption(sample, fh)
    if isinstance(text, Status):
        return text
    return ImageRecord(
        image_id=key,
        file=f"{shard.name}/{picture.name}",
        width=0,
        height=0,
        objects=(),
        captions=(Caption("0", text),) if text else (),
        root=None,
        dataset="wds",
        source=TarMember(str(shard.absolute()), picture.offset_data, picture.size),
    )


def _wds_caption(sample: _Sample, fh: Any) -> str | Status:
    """The stripped caption (``""`` when there is none), or a ``bad-metadata`` status."""
    txt = sample.members.get("txt")
    if txt is not None:
        data = _member_bytes(txt, fh)
        try:
            text = data.decode("utf-8").strip() if data is not None else None
        except UnicodeDecodeError as err:
            return Status(sample.key, "failed", "bad-metadata", f"{txt.name}: not UTF-8 ({err})")
        if text is None:
            return Status(sample.key, "failed", "bad-metadata", _too_large(txt))
        if text:
            return text
    meta = sample.members.get("json")
    if meta is None:
        return ""
    data = _member_bytes(meta, fh)
    if data is None:
        return Status(sample.key, "failed", "bad-metadata", _too_large(meta))
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return Status(sample.key, "failed", "bad-metadata", f"{meta.name}: not JSON ({err})")
    if not isinstance(value, dict):
        return Status(sample.key, "failed", "bad-metadata", f"{meta.name}: not a JSON object")
    caption = value.get("caption")
    return caption.strip() if isinstance(caption, str) else ""


def _too_large(info: tarfile.TarInfo) -> str:
    return f"{info.name}: {info.size} bytes, over the {MAX_TEXT_BYTES} read for text"


def _member_bytes(info: tarfile.TarInfo, fh: Any) -> bytes | None:
    """The data of a small member (``None`` when it is over :data:`MAX_TEXT_BYTES`). Reads with
    one seek on the tar's own file; tarfile seeks back before its next header."""
    if info.size > MAX_TEXT_BYTES:
        return None
    try:
        fh.seek(info.offset_data)
        data = fh.read(info.size)
    except OSError as err:
        raise _BadShard(f"{info.name}: {type(err).__name__}: {err}") from err
    if len(data) != info.size:
        raise _BadShard(f"truncated: short read of member {info.name!r}")
    return data


# --------------------------------------------------------------------------- Parquet and CSV


@dataclass(frozen=True, slots=True)
class _Table:
    """One table file and how to read it: the columns chosen, and what the image column holds
    (``"bytes"``: binary; ``"struct"``: ``{bytes, path}``; ``"path"``: a path string). ``error``
    is set when the file could not be opened (a ``missing-file`` or ``bad-shard`` row)."""

    path: Path
    caption: str = ""
    image: str = ""
    id: str | None = None
    holds: str = "path"
    error: Status | None = None


def iter_table(
    pattern: str | Path,
    kind: str,
    images: Path | None = None,
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
    plans = [
        _plan_table(path, kind, caption_column, image_column, id_column)
        for path in expand_pattern(pattern)
    ]
    return _iter_tables(plans, kind, None if images is None else Path(images))


def read_table(
    pattern: str | Path,
    kind: str,
    images: Path | None = None,
    caption_column: str | None = None,
    image_column: str | None = None,
    id_column: str | None = None,
) -> Dataset:
    """:func:`iter_table` collected: ``Dataset(kind, records, failures=statuses)``."""
    rows = iter_table(pattern, kind, images, caption_column, image_column, id_column)
    return _collect(kind, rows)


def _collect(name: str, rows: Iterator[ImageRecord | Status]) -> Dataset:
    records: list[ImageRecord] = []
    failures: list[Status] = []
    for row in rows:
        if isinstance(row, Status):
            failures.append(row)
        else:
            records.append(row)
    return Dataset(name, tuple(records), class_names=(), failures=tuple(failures))


def _pyarrow() -> tuple[ModuleType, ModuleType]:
    return require("pyarrow", "corpora"), require("pyarrow.parquet", "corpora")


def _pick(
    path: Path, columns: Sequence[str], named: str | None, defaults: tuple[str, ...], role: str
) -> str | None:
    """The column to use for ``role``: ``named`` (which must exist), else the first default
    present, else ``None``."""
    if named is not None:
        if named not in columns:
            raise ValueError(f"{path}: no {role} column {named!r}; its columns: {list(columns)}")
        return named
    return next((c for c in defaults if c in columns), None)


def _plan_table(
    path: Path,
    kind: str,
    caption_column: str | None,
    image_column: str | None,
    id_column: str | None,
) -> _Table:
    """Choose the columns of one file, reading only its header or Parquet footer."""
    try:
        columns, types = _parquet_schema(path) if kind == "parquet" else (_csv_header(path), {})
    except FileNotFoundError:
        return _Table(path, error=Status(str(path), "failed", "missing-file", f"no such {kind}"))
    except _BadShard as err:
        return _Table(path, error=Status(str(path), "failed", "bad-shard", str(err)))
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
    return _Table(path, caption, image, ident, holds)


def _parquet_schema(path: Path) -> tuple[list[str], dict[str, Any]]:
    pa, pq = _pyarrow()
    try:
        with pq.ParquetFile(path) as pf:
            schema = pf.schema_arrow
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise _BadShard(f"not a readable Parquet file: {err}") from err
    return list(schema.names), {f.name: f.type for f in schema}


def _csv_header(path: Path) -> list[str]:
    try:
        with open(path, encoding="utf-8", newline="") as fh:
            header = next(csv.reader(fh), None)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err
    if not header:
        raise _BadShard("no header row")
    return header


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


def _iter_tables(
    plans: list[_Table], kind: str, images: Path | None
) -> Iterator[ImageRecord | Status]:
    seen: dict[str, tuple[Path, int]] = {}
    for plan in plans:
        if plan.error is not None:
            yield plan.error
            continue
        root = images if images is not None else plan.path.parent
        rows = _parquet_rows(plan) if kind == "parquet" else _csv_rows(plan)
        try:
            for row, ident, caption, cell in rows:
                yield _table_row(plan, kind, root, row, ident, caption, cell, seen)
        except FileNotFoundError:
            yield Status(str(plan.path), "failed", "missing-file", f"no such {kind}")
        except _BadShard as err:
            yield Status(str(plan.path), "failed", "bad-shard", str(err))


@dataclass(frozen=True, slots=True)
class _InFile:
    """An image cell whose picture lies in the table itself."""

    row_group: int
    row: int


_Cell = _InFile | str | None
"""An image cell: the picture in the table, a path, or nothing."""


def _table_row(
    plan: _Table,
    kind: str,
    root: Path,
    row: int,
    ident: Any,
    caption: Any,
    cell: _Cell,
    seen: dict[str, tuple[Path, int]],
) -> ImageRecord | Status:
    image_id = f"{plan.path.stem}-{row:08d}" if ident is None or ident == "" else str(ident)
    where = f"{plan.path.name}#{row}"
    if image_id in seen:
        first_path, first_row = seen[image_id]
        return Status(
            image_id,
            "failed",
            "duplicate-key",
            f"first at {first_path}#{first_row}, again at {plan.path}#{row}",
        )
    seen[image_id] = (plan.path, row)
    if cell is None:
        return Status(image_id, "failed", "missing-image", f"{where}: {plan.image!r} is empty")
    text = caption.strip() if isinstance(caption, str) else ""
    captions = (Caption("0", text),) if text else ()
    if isinstance(cell, _InFile):
        source = ParquetCell(str(plan.path.absolute()), cell.row_group, cell.row, plan.image)
        return ImageRecord(image_id, where, 0, 0, (), captions, None, None, kind, source)
    file = _inside(cell, root)
    if file is None:
        return Status(image_id, "failed", "unsafe-path", repr(cell))
    return ImageRecord(image_id, file, 0, 0, (), captions, root, None, kind)


def _inside(cell: str, root: Path) -> str | None:
    """``cell`` as a path relative to ``root``, or ``None`` when it would leave ``root``. An
    absolute path is accepted when it lies inside ``root`` (compared lexically; symlinks are
    checked when the picture is loaded)."""
    if os.path.isabs(cell):
        base = os.path.abspath(root)
        path = os.path.normpath(cell)
        if path == base or os.path.commonpath([base, path]) != base:
            return None
        cell = os.path.relpath(path, base)
    return safe_relative_path(cell)


def _parquet_rows(plan: _Table) -> Iterator[tuple[int, Any, Any, _Cell]]:
    """``(row in file, id, caption, image cell)`` for each row, one row group at a time."""
    pa, pq = _pyarrow()
    try:
        with pq.ParquetFile(plan.path) as pf:
            offset = 0
            for group in range(pf.num_row_groups):
                rows = pf.metadata.row_group(group).num_rows
                yield from _group_rows(pf, plan, group, offset, rows)
                offset += rows
    except FileNotFoundError:
        raise
    except (OSError, pa.ArrowException) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err


def _group_rows(
    pf: Any, plan: _Table, group: int, offset: int, rows: int
) -> Iterator[tuple[int, Any, Any, _Cell]]:
    leaf = f"{plan.image}.bytes" if plan.holds == "struct" else plan.image
    read_image = plan.holds == "path" or not _no_nulls(pf, group, leaf)
    wanted = [c for c in (plan.id, plan.caption, plan.image if read_image else None) if c]
    table = pf.read_row_group(group, columns=list(dict.fromkeys(wanted)))
    ids = table.column(plan.id).to_pylist() if plan.id is not None else [None] * rows
    captions = table.column(plan.caption).to_pylist()
    cells: list[_Cell]
    if not read_image:
        cells = [_InFile(group, i) for i in range(rows)]
    else:
        cells = _image_cells(table.column(plan.image).combine_chunks(), plan.holds, group)
    for i in range(rows):
        yield offset + i, ids[i], captions[i], cells[i]


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


def _image_cells(column: Any, holds: str, group: int) -> list[_Cell]:
    if holds == "path":
        return column.to_pylist()
    if holds == "bytes":
        return [None if null else _InFile(group, i) for i, null in enumerate(column.is_null())]
    fields = dict(zip((f.name for f in column.type), column.flatten(), strict=True))
    has_bytes = fields["bytes"].is_valid().to_pylist()
    paths = fields["path"].to_pylist() if "path" in fields else [None] * len(column)
    return [
        _InFile(group, i) if b else p for i, (b, p) in enumerate(zip(has_bytes, paths, strict=True))
    ]


def _csv_rows(plan: _Table) -> Iterator[tuple[int, Any, Any, _Cell]]:
    """``(row in file, id, caption, path)`` for each non-blank data row; empty cells are
    ``None``."""
    try:
        with open(plan.path, encoding="utf-8", newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, None) or []
            at = {name: header.index(name) for name in dict.fromkeys(header)}
            wanted = (plan.id, plan.caption, plan.image)
            index = [None if name is None else at[name] for name in wanted]
            row = 0
            for cells in reader:
                if not cells:
                    continue
                ident, caption, image = (
                    cells[i] if i is not None and i < len(cells) and cells[i] else None
                    for i in index
                )
                yield row, ident, caption, image
                row += 1
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise _BadShard(f"{type(err).__name__}: {err}") from err


# --------------------------------------------------------------------------- reading pictures


def read_source(source: ImageSource) -> bytes:
    """The encoded picture that ``source`` points to.

    Raises :class:`~counterfactual.imageio.SampleError` ``missing-file`` when the tar or
    Parquet file is gone and ``read-error`` when the bytes are not there (a short read, an
    index out of range, an empty cell).
    """
    if isinstance(source, TarMember):
        return _read_member(source)
    if isinstance(source, ParquetCell):
        return _read_cell(source)
    raise TypeError(f"not an image source: {source!r}")


def _read_member(source: TarMember) -> bytes:
    try:
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
        stat = os.stat(source.path)
        column = _group_column(
            source.path, stat.st_mtime_ns, stat.st_size, source.row_group, source.column
        )
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


@functools.lru_cache(maxsize=2)
def _group_column(path: str, mtime_ns: int, size: int, row_group: int, column: str) -> Any:
    """One column of one row group, kept for the next rows of the same group (a worker reads a
    table's rows in order). ``mtime_ns`` and ``size`` are part of the key so that a rewritten
    file is read again."""
    _, pq = _pyarrow()
    with pq.ParquetFile(path) as pf:
        if not 0 <= row_group < pf.num_row_groups:
            raise KeyError(f"no row group {row_group} (the file has {pf.num_row_groups})")
        if column not in pf.schema_arrow.names:
            raise KeyError(f"no column {column!r}")
        return pf.read_row_group(row_group, columns=[column]).column(column)


__all__ = [
    "CAPTION_COLUMNS",
    "ID_COLUMNS",
    "IMAGE_COLUMNS",
    "PICTURE_FIELDS",
    "expand_pattern",
    "iter_table",
    "iter_wds",
    "read_source",
    "read_table",
    "read_wds",
]
