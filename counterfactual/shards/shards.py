"""WebDataset shards: per sample ``<key>.jpg``, ``<key>.txt`` and ``<key>.json`` (with
``--pairs`` also ``<key>.orig.jpg`` and ``<key>.mask.png``).

Shards are ``{prefix}-{index:06d}.tar`` in a local folder or under an fsspec URL. The worker
that makes a shard writes it whole (:class:`ShardWriter`): the tar first, atomically (a local
temporary name renamed when complete; on an object store an upload that completes or leaves
nothing; locally fsynced, file and folder), then ``{prefix}-{index:06d}_stats.json``, the commit
marker: a shard without its stats file is unfinished, and a rerun redoes it. The stats file
records the tar's size and SHA-256, so a tar damaged after its commit (truncated, emptied,
bytes changed) is found (:func:`verify_shard`) and made again. Which input goes into which shard is decided by the
config and the input alone (see :mod:`counterfactual.synth.tasks`), so a shard's bytes do not depend
on the runner, the number of workers or the order they finish in. Keys are stable and contain
no dots, so WebDataset splits ``key.ext`` correctly.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import msgspec

from counterfactual import fs
from counterfactual.json_types import JsonType, check_type, json_type, merge_types
from counterfactual.records import Status

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def sample_key(*parts: str) -> str:
    """``parts`` joined by ``_``, with every character outside ``[A-Za-z0-9_-]`` replaced by
    ``-``; when anything was replaced a short hash of the raw parts keeps keys distinct."""
    raw = "_".join(parts)
    safe = _UNSAFE.sub("-", "_".join(p.replace("_", "-") for p in parts))
    if safe == raw:
        return safe
    return f"{safe}-{hashlib.blake2b(raw.encode(), digest_size=4).hexdigest()}"


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample as the writer takes it: ``jpg`` the edited picture, ``txt`` its caption,
    ``meta`` its json; ``extra`` more members as ``(extension, bytes)`` (``--pairs``:
    ``orig.jpg`` and ``mask.png``)."""

    key: str
    jpg: bytes
    txt: str
    meta: dict[str, Any]
    extra: tuple[tuple[str, bytes], ...] = ()


ORIGINALS_PREFIX = "orig"
"""The prefix of ``mix --unpair``'s shards (:mod:`counterfactual.train.pairs`), which
``counterfactual check`` also reads."""


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}.tar"


def stats_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}_stats.json"


class ShardStats(msgspec.Struct, frozen=True):
    """The commit marker of one shard, written after the tar: its samples' keys, the status
    row of every input image and item of the shard (written or not), the fingerprint of the
    input it was made from (a rerun over other input is refused) and where it was made; the
    tar's ``size`` and ``sha256`` (``None`` in a stats file older than them: such a shard is
    checked by size only when it has samples, and by reading its tar). A msgspec struct:
    :meth:`from_dict` checks every key, naming the path of a bad one (``$.status[3].key``)."""

    shard: str
    count: int
    items: int
    keys: tuple[str, ...]
    status: tuple[Status, ...]
    seconds: dict[str, int | float]
    input: str = ""
    node: str = ""
    images: int = 0
    """Input images (records and reader failures) of the shard's task."""
    json_schema: JsonType | None = None
    """The type of its samples' json merged over them (:mod:`counterfactual.json_types`), for
    the dataset card; ``None`` without samples, or in a stats file older than this key."""
    size: int | None = None
    """Bytes of the tar as committed."""
    sha256: str | None = None
    """SHA-256 of the tar as committed (``sha256sum`` prints the same)."""
    config: str = ""
    """:func:`config_digest` of the run's config fingerprint (``run.json``): a folder whose
    ``run.json`` is gone is resumed only when every shard says the same config."""
    inputs: dict[str, str] = msgspec.field(default_factory=dict)
    """The input fingerprint by part (:func:`counterfactual.synth.tasks.input_parts`: ``ids``,
    ``annotations``, ``sizes``, ``stamps``, ``content``); empty in older stats files, whose
    ``input`` is the ``ids`` part alone."""

    def counts(self) -> dict[str, int]:
        """Rows by ``status`` and ``status:reason`` (as the run summary counts them)."""
        out: dict[str, int] = {}
        for s in self.status:
            out[s.outcome] = out.get(s.outcome, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "count": self.count,
            "items": self.items,
            "keys": list(self.keys),
            "status": [s.to_dict() for s in self.status],
            "seconds": {k: round(v, 6) for k, v in sorted(self.seconds.items())},
            "input": self.input,
            "node": self.node,
            "images": self.images,
            "json_schema": self.json_schema,
            "size": self.size,
            "sha256": self.sha256,
            "config": self.config,
            "inputs": dict(self.inputs),
        }

    def __post_init__(self) -> None:
        if self.json_schema is not None:
            check_type(self.json_schema)

    @classmethod
    def from_dict(cls, d: Any) -> ShardStats:
        """A stats file's json; ``ValueError`` naming the path of a missing, unexpected or
        mistyped key. A ``null`` ``config`` or ``inputs`` reads as empty."""
        if isinstance(d, dict):
            d = {**d, "config": d.get("config") or "", "inputs": d.get("inputs") or {}}
        try:
            return msgspec.convert(d, cls)
        except msgspec.ValidationError as err:
            raise ValueError(str(err)) from err


def shard_index(name: str, prefix: str = "shard") -> int | None:
    """The index of a stats file's name (``shard-000012_stats.json`` -> 12), else ``None``."""
    m = re.fullmatch(rf"{re.escape(prefix)}-(\d{{6,}})_stats\.json", name)
    return int(m.group(1)) if m else None


def iter_stats(
    out_dir: fs.PathLike, prefix: str = "shard", indices: Iterable[int] | None = None
) -> Iterator[tuple[int, ShardStats]]:
    """The committed shards in ``out_dir`` (a folder or URL), one stats file read at a time, in
    index order (``indices``: only those)."""
    wanted = None if indices is None else set(indices)
    for index, name in committed_names(fs.listdir(out_dir), prefix):
        if wanted is None or index in wanted:
            path = fs.join(out_dir, name)
            try:
                stats = ShardStats.from_dict(json.loads(fs.read_text(path)))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(
                    f"{path}: not a stats file ({type(err).__name__}: {err}); delete it to "
                    "make its shard again"
                ) from err
            yield index, stats


def committed_names(names: Iterable[str], prefix: str = "shard") -> list[tuple[int, str]]:
    """``(index, stats file name)`` of the committed shards among a folder's file ``names``
    (those whose stats file and tar are both there), in index order."""
    names = list(names)
    present = set(names)
    found = [(i, name) for name in names if (i := shard_index(name, prefix)) is not None]
    return sorted((i, name) for i, name in found if shard_name(prefix, i) in present)


def read_stats(out_dir: fs.PathLike, prefix: str = "shard") -> dict[int, ShardStats]:
    """:func:`iter_stats` as a dict by index."""
    return dict(iter_stats(out_dir, prefix))


def config_digest(fingerprint: dict[str, Any]) -> str:
    """A short digest of a config fingerprint (``run.json``'s ``config``), kept in each stats
    file."""
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def file_sizes(out_dir: fs.PathLike) -> dict[str, int]:
    """Bytes of every file directly in ``out_dir`` by name, from one listing (on an object
    store one ``ls``, not a request per shard)."""
    p = fs.as_path(out_dir)
    if isinstance(p, Path):
        try:
            return {e.name: e.stat().st_size for e in os.scandir(p) if e.is_file()}
        except FileNotFoundError:
            return {}
    remote, inside = fs.filesystem(p)
    try:
        entries = remote.ls(inside, detail=True, refresh=True)
    except FileNotFoundError:
        return {}
    return {
        fs.name(e["name"]): int(e.get("size") or 0) for e in entries if e.get("type") != "directory"
    }


def verify_shard(
    out_dir: fs.PathLike, stats: ShardStats, size: int | None = None, content: bool = True
) -> str | None:
    """What is wrong with a committed shard's tar, or ``None`` when it is as committed.

    Always its size against the stats file's (``size``: as listed; else one stat); with
    ``content``, its SHA-256 too (the whole tar is read: about 0.8 s per GB of CPU on one core
    besides the read). A stats file older than size and hash: a tar with samples must be at
    least a tar's end blocks (1,024 bytes) and, with ``content``, hold exactly the samples
    its stats file lists."""
    path = fs.join(out_dir, stats.shard)
    if size is None:
        try:
            size = fs.size(path)
        except FileNotFoundError:
            return "its tar is missing"
    if stats.size is not None and size != stats.size:
        return f"{size:,} bytes, its stats file says {stats.size:,} (truncated or damaged)"
    if stats.size is None and stats.count and size < 1024:
        return f"{size:,} bytes, too short for a tar of {stats.count:,} samples"
    if not content:
        return None
    try:
        if stats.sha256 is not None:
            if fs.file_sha256(path) != stats.sha256:
                return "its SHA-256 is not the one its stats file records (bytes changed)"
            return None
        with fs.open_file(path, "rb") as fh, tarfile.open(fileobj=fh, mode="r:") as tar:
            keys = {m.name.rsplit(".", 1)[0] for m in tar if m.isfile()}
    except FileNotFoundError:
        return "its tar is missing"
    except (tarfile.TarError, OSError, EOFError) as err:
        return f"not a readable tar ({type(err).__name__}: {err})"
    if keys != set(stats.keys):
        return f"its tar holds {len(keys):,} samples, its stats file lists {stats.count:,}"
    return None


class _Hashed:
    """The file a tar is written to, counting its bytes and hashing them as they pass (the
    stats file's ``size`` and ``sha256`` without reading the tar again)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.size = 0
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self._fh.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


class _TarStream:
    """A tar file written member by member, with fixed owner, mode and mtime so that the same
    samples give the same bytes, committed atomically (and durably) by :meth:`close`; ``run``:
    the run token its temporary name carries. (Plain ``tarfile``: importing webdataset would
    import torch.)"""

    def __init__(self, path: fs.PathLike, mtime: float, run: str | None = None) -> None:
        self.path = path
        self.mtime = mtime
        self._stack = ExitStack()
        self._file: IO[bytes] = self._stack.enter_context(
            fs.atomic_write(path, run=run, durable=True)
        )
        self.hashed = _Hashed(self._file)
        self._tar = tarfile.open(fileobj=self.hashed, mode="w", format=tarfile.PAX_FORMAT)

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), self.mtime, 0o444
        info.uname = info.gname = "counterfactual"
        with self._no_space():
            self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        """Finish the tar and make it appear under its name (on an error, :meth:`abort`)."""
        with self._no_space():
            self._tar.close()
        self._stack.close()

    @contextmanager
    def _no_space(self) -> Iterator[None]:
        """A full disk while writing the tar as :class:`~counterfactual.fs.OutputError`."""
        try:
            yield
        except OSError as err:
            full = fs.disk_full(err, self.path)
            if full is None:
                raise
            raise full from err

    def abort(self) -> None:
        """Drop what was written: no file appears."""
        self._stack.__exit__(_Aborted, _Aborted(), None)


class _Aborted(Exception):
    """Raised into :func:`counterfactual.fs.atomic_write` to discard an unfinished shard."""


@dataclass
class ShardWriter:
    """One shard, written by the worker that makes it, item by item in output order.

    Each item arrives once through :meth:`add`, as a sample or as a status saying why there is
    none (rows without an item, such as skipped images, arrive with ``sample=None`` too).
    :meth:`commit` completes the tar and then writes the stats file, the commit marker (with
    the tar's size and SHA-256, ``config`` and the input fingerprint's ``inputs``);
    :meth:`abort` leaves nothing behind. ``run``: the run token of its temporary names.
    """

    out_dir: fs.PathLike
    index: int
    input: str = ""
    node: str = ""
    prefix: str = "shard"
    mtime: float = 0.0
    keys: list[str] = field(default_factory=list)
    status: list[Status] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    items: int = 0
    images: int = 0
    json_schema: JsonType | None = None
    run: str | None = None
    config: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    _tar: _TarStream | None = None

    def __post_init__(self) -> None:
        if "." in self.prefix or "/" in self.prefix:
            raise ValueError(f"shard prefix {self.prefix!r} must not contain '.' or '/'")

    @property
    def name(self) -> str:
        return shard_name(self.prefix, self.index)

    def add(
        self,
        sample: Sample | None,
        status: Status,
        seconds: dict[str, float] | None = None,
        item: bool = True,
    ) -> None:
        """Take one row: an item's sample (or ``None``) and its status; ``item=False`` for a
        row that is no work item (an image that yields none)."""
        if sample is not None and "." in sample.key:
            raise ValueError(f"sample key {sample.key!r} contains a dot")
        self.status.append(status)
        self.items += item
        for k, v in (seconds or {}).items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v
        if sample is None:
            return
        if self._tar is None:
            self._tar = _TarStream(fs.join(self.out_dir, self.name), self.mtime, self.run)
        meta = json.dumps(sample.meta, ensure_ascii=False, sort_keys=True)
        members = [
            ("jpg", sample.jpg),
            ("json", meta.encode("utf-8")),
            ("txt", sample.txt.encode("utf-8")),
            *sample.extra,
        ]
        if len({ext for ext, _ in members}) != len(members):
            raise ValueError(f"sample {sample.key!r} repeats a member: {[e for e, _ in members]}")
        # members in the order WebDataset's TarWriter uses: extensions sorted
        for ext, data in sorted(members, key=lambda m: m[0]):
            self._tar.add(f"{sample.key}.{ext}", data)
        self.keys.append(sample.key)
        self.json_schema = merge_types(self.json_schema, json_type(sample.meta))

    def commit(self) -> ShardStats:
        """Write the tar (an empty but valid one when no item made a sample), then the stats."""
        if self._tar is None:
            self._tar = _TarStream(fs.join(self.out_dir, self.name), self.mtime, self.run)
        try:
            self._tar.close()
        except BaseException:
            self.abort()  # no temporary file left behind (a full disk: OutputError)
            raise
        hashed, self._tar = self._tar.hashed, None
        stats = ShardStats(
            self.name,
            len(self.keys),
            self.items,
            tuple(self.keys),
            tuple(self.status),
            self.seconds,
            self.input,
            self.node,
            self.images,
            self.json_schema,
            hashed.size,
            hashed.sha256.hexdigest(),
            self.config,
            dict(self.inputs),
        )
        text = json.dumps(stats.to_dict(), indent=1, ensure_ascii=False)
        path = fs.join(self.out_dir, stats_name(self.prefix, self.index))
        fs.write_text(path, text, run=self.run, durable=True)
        return stats

    def abort(self) -> None:
        """Drop the unfinished tar."""
        if self._tar is not None:
            self._tar.abort()
            self._tar = None
