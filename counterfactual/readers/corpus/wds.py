"""WebDataset shards (``kind="wds"``): uncompressed tars in which the members of one sample
share a key, the member name up to the first dot of its base name, directory kept
(``a/000000123.jpg`` -> key ``a/000000123``, field ``jpg``), as :mod:`webdataset` groups them:
consecutive members with the same key form a sample. One piece per tar; its headers are read one
after another and the data between them skipped by seeking; only the small ``txt`` / ``json``
members are read, a picture is a :class:`~counterfactual.records.TarMember` (one ranged read)."""

from __future__ import annotations

import os
import re
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactual import fs
from counterfactual.imageio import SampleError
from counterfactual.readers import tarscan
from counterfactual.readers.corpus.common import (
    KEY_FIELD,
    PICTURE_FIELDS,
    BadShard,
    InputPiece,
    PlannedFile,
    WholeFiles,
    absolute_source,
    open_binary,
    raise_if_store_down,
    record_captions,
    repeated_hashes,
)
from counterfactual.readers.corpus.members import (
    TextMember,
    caption_origin,
    downloader_rows,
    duplicate_key,
)
from counterfactual.readers.keyset import key_hash, key_hashes
from counterfactual.records import ImageRecord, Status, TarMember

# webdataset.tariterators: members named __...__ at the top level, or matching this, are skipped
_SKIP_META = re.compile(r"__[^/]*__($|/)")
_BLOCK = tarfile.BLOCKSIZE
_COMPRESSED_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bzip2",
    b"\xfd7zXZ": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
}


class WebDataset(WholeFiles):
    """The :class:`~counterfactual.readers.corpus.common.CorpusFormat` of WebDataset shards."""

    kind = "wds"
    suffix = ".tar"
    root_help = "its files or their folder, e.g. 'data/{00000..00009}.tar' or 'data'"

    def default_images(self, root: str) -> str | None:
        return None

    def keys(self, file: PlannedFile) -> np.ndarray | None:
        return key_hashes(_tar_keys(file.path))

    def read(self, piece: InputPiece, seen: dict[str, str]) -> Iterator[ImageRecord | Status]:
        return _read_shard(piece.path, seen, repeated_hashes(piece))


FORMAT = WebDataset()


@dataclass(slots=True)
class _Sample:
    """The members of one WebDataset sample so far: ``field -> TarInfo``, in tar order."""

    key: str
    members: dict[str, tarfile.TarInfo]


def _read_shard(
    shard: str, seen: dict[str, str], again: frozenset[int] = frozenset()
) -> Iterator[ImageRecord | Status]:
    """``again``: the hashes of the keys an earlier piece of the run had."""
    try:
        fh = open_binary(shard)
    except FileNotFoundError:
        yield Status(shard, "failed", "missing-file", f"no such shard {shard}")
        return
    except OSError as err:
        raise_if_store_down(err)  # the store's fault, not the tar's: the run stops
        yield Status(shard, "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    with fh:
        pending: list[_Sample] = []
        try:
            for sample in _tar_samples(fh, shard, pending):
                yield _sample_row(sample, fh, shard, seen, again)
        except BadShard as err:
            raise_if_store_down(err)
            detail = str(err)
            if pending:
                detail += f"; sample {pending[0].key!r} was incomplete and is left out"
            yield Status(shard, "failed", "bad-shard", detail)
    yield from downloader_rows(shard, seen)


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
                raise BadShard(f"{name}-compressed; only plain tar can be read by seeking")
        size = _file_size(fh, path)
        fh.seek(0)
        walk = tarscan.Walk(fh)
        for info in walk:
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
                raise BadShard(f"truncated: member {info.name!r} is cut off")
            if key_field is not None:
                pending[0].members[key_field[1]] = info
        _check_end(fh, walk.offset, size)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BadShard(f"{type(err).__name__}: {err}") from err
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
        raise BadShard(f"truncated: {len(block)} bytes of a header at offset {offset}")
    if block.count(0) != _BLOCK:
        raise BadShard(f"corrupt header at offset {offset}")


def member_key_field(info: tarfile.TarInfo) -> tuple[str, str] | None:
    """``(key, field)`` of a member, or ``None`` for members webdataset skips."""
    name = info.name
    if not info.isreg():
        return None
    if "/" not in name and name.startswith("__") and name.endswith("__"):
        return None
    if _SKIP_META.match(name):
        return None
    match = KEY_FIELD.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


def _sample_row(
    sample: _Sample, fh: Any, shard: str, seen: dict[str, str], again: frozenset[int]
) -> ImageRecord | Status:
    key = sample.key
    if key in seen:
        return Status(key, "failed", "duplicate-key", f"first in {seen[key]}, again in {shard}")
    seen[key] = shard  # also when repeated: img2dataset's metadata rows of it are passed over
    if again and key_hash(key) in again:
        return duplicate_key(key, shard)
    picture = next((sample.members[f] for f in PICTURE_FIELDS if f in sample.members), None)
    name = fs.name(shard)
    if picture is None:
        fields = ", ".join(sample.members)
        return Status(key, "failed", "missing-image", f"{name}: no picture among {fields}")
    members = {
        f: TextMember(i.name, i.size, _member_reader(i, fh))
        for f in ("txt", "json")
        if (i := sample.members.get(f)) is not None
    }
    text = caption_origin(key, members.get("txt"), members.get("json"))
    if isinstance(text, Status):
        return text
    return ImageRecord(
        image_id=key,
        file=f"{name}/{picture.name}",
        width=0,
        height=0,
        objects=(),
        captions=record_captions(text[0]),
        root=None,
        dataset="wds",
        source=TarMember(absolute_source(shard), picture.offset_data, picture.size),
        origin=text[1],
    )


def _member_reader(info: tarfile.TarInfo, fh: Any) -> Callable[[], bytes]:
    return lambda: _member_bytes(info, fh)


def _member_bytes(info: tarfile.TarInfo, fh: Any) -> bytes:
    """The data of a small member. Reads with one seek on the tar's own file; tarfile seeks
    back before its next header."""
    try:
        fh.seek(info.offset_data)
        data = fh.read(info.size)
    except OSError as err:
        raise BadShard(f"{info.name}: {type(err).__name__}: {err}") from err
    if len(data) != info.size:
        raise BadShard(f"truncated: short read of member {info.name!r}")
    return data


def _tar_keys(path: str) -> list[str]:
    """A tar's sample keys, in order, read from its headers as :func:`_read_shard` reads them
    (a sample cut off by a fault is left out, as there)."""
    keys: list[str] = []
    try:
        with open_binary(path) as fh:
            keys.extend(sample.key for sample in _tar_samples(fh, path, []))
    except FileNotFoundError:
        pass  # its worker reports it missing
    except (OSError, BadShard) as err:
        raise_if_store_down(err)  # else the worker reports the tar; its keys up to the fault
    return keys


def read_member(source: TarMember) -> bytes:
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
        raise_if_store_down(err)
        raise SampleError("read-error", f"{source.path}: {type(err).__name__}: {err}") from err
    if len(data) != source.size:
        raise SampleError(
            "read-error",
            f"{source.path}: {len(data)} of {source.size} bytes at offset {source.offset}",
        )
    return data
