"""WebDataset shards: per sample ``<key>.jpg``, ``<key>.txt`` and ``<key>.json``.

Shards are ``{prefix}-{index:06d}.tar``; each is written under a temporary name, renamed when
complete, and followed by ``{prefix}-{index:06d}_stats.json``, written last: a shard without
its stats file is unfinished, and a rerun redoes it. Which items go into which shard is decided
before any work starts (see :mod:`counterfactual.run`), so a shard's contents do not depend on
the order in which parallel workers finish. Keys are stable and contain no dots, so WebDataset
splits ``key.ext`` correctly.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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
    key: str
    jpg: bytes
    txt: str
    meta: dict[str, Any]


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}.tar"


def stats_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:06d}_stats.json"


@dataclass(frozen=True, slots=True)
class ShardStats:
    """The commit marker of one shard, written after the tar: its samples' keys and the status
    row of every item planned for it, written or not."""

    shard: str
    count: int
    items: int
    keys: tuple[str, ...]
    status: tuple[Status, ...]
    seconds: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "count": self.count,
            "items": self.items,
            "keys": list(self.keys),
            "status": [asdict(s) for s in self.status],
            "seconds": {k: round(v, 6) for k, v in sorted(self.seconds.items())},
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShardStats:
        return cls(
            d["shard"],
            int(d["count"]),
            int(d["items"]),
            tuple(d["keys"]),
            tuple(Status(**s) for s in d["status"]),
            dict(d.get("seconds", {})),
        )


def read_stats(out_dir: Path, prefix: str = "shard") -> dict[int, ShardStats]:
    """The committed shards in ``out_dir`` by index: those whose stats file exists and whose
    tar is there too."""
    done = {}
    pattern = re.compile(rf"{re.escape(prefix)}-(\d{{6,}})_stats\.json$")
    for path in Path(out_dir).glob(f"{prefix}-*_stats.json"):
        m = pattern.match(path.name)
        if not m:
            continue
        stats = ShardStats.from_dict(json.loads(path.read_text(encoding="utf-8")))
        if (path.parent / stats.shard).exists():
            done[int(m.group(1))] = stats
    return done


class _TarStream:
    """A tar file written member by member, with fixed owner, mode and mtime so that the same
    samples give the same bytes. (Plain ``tarfile``: importing webdataset would import torch.)"""

    def __init__(self, path: Path, mtime: float) -> None:
        self.mtime = mtime
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._tar = tarfile.open(fileobj=self._file, mode="w", format=tarfile.PAX_FORMAT)

    def add(self, name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = len(data), self.mtime, 0o444
        info.uname = info.gname = "counterfactual"
        self._tar.addfile(info, io.BytesIO(data))

    def close(self) -> None:
        self._tar.close()
        self._file.close()


@dataclass
class _Open:
    size: int
    next: int = 0
    waiting: dict[int, tuple[Sample | None, Status, dict[str, float]]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    status: list[Status] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    writer: _TarStream | None = None


class ShardAssembler:
    """Writes shards whose contents are fixed in advance, from items arriving in any order.

    ``sizes[i]`` is the number of items planned for shard ``i``; each item arrives once, through
    :meth:`add`, as a sample or as a status saying why there is none. Samples are written in
    item order as soon as their predecessors are in (out-of-order ones wait in memory), so a
    shard's bytes do not depend on arrival order. When its last item is in, the tar is renamed
    from ``.tmp`` and its stats file written: the commit marker. A repeated item is ignored.
    """

    def __init__(
        self, out_dir: Path, sizes: dict[int, int], prefix: str = "shard", mtime: float = 0.0
    ) -> None:
        if "." in prefix or "/" in prefix:
            raise ValueError(f"shard prefix {prefix!r} must not contain '.' or '/'")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.mtime = mtime
        self.duplicates = 0
        self._open = {i: _Open(n) for i, n in sizes.items()}
        self.committed: dict[int, ShardStats] = {}
        for i in [i for i, n in sizes.items() if n == 0]:
            self._commit(i)

    @property
    def pending(self) -> list[int]:
        return sorted(self._open)

    def add(
        self,
        shard: int,
        index: int,
        sample: Sample | None,
        status: Status,
        seconds: dict[str, float] | None = None,
    ) -> ShardStats | None:
        """Take one item; return the shard's stats when this item completed it."""
        state = self._open.get(shard)
        if state is None:
            if shard in self.committed:
                self.duplicates += 1
                return None
            raise ValueError(f"shard {shard} is not planned in this run")
        if not 0 <= index < state.size:
            raise ValueError(f"item {index} is outside shard {shard} of {state.size} items")
        if index < state.next or index in state.waiting:
            self.duplicates += 1
            return None
        if sample is not None and "." in sample.key:
            raise ValueError(f"sample key {sample.key!r} contains a dot")
        state.waiting[index] = (sample, status, seconds or {})
        while state.next in state.waiting:
            self._write(shard, state, *state.waiting.pop(state.next))
            state.next += 1
        if state.next == state.size:
            return self._commit(shard)
        return None

    def abort(self) -> None:
        """Close unfinished shards and remove their temporary files."""
        for i, state in self._open.items():
            if state.writer is not None:
                state.writer.close()
                self._tmp(i).unlink(missing_ok=True)
                state.writer = None

    def _tmp(self, i: int) -> Path:
        return self.out_dir / (shard_name(self.prefix, i) + ".tmp")

    def _write(
        self,
        i: int,
        state: _Open,
        sample: Sample | None,
        status: Status,
        seconds: dict[str, float],
    ) -> None:
        state.status.append(status)
        for k, v in seconds.items():
            state.seconds[k] = state.seconds.get(k, 0.0) + v
        if sample is None:
            return
        if state.writer is None:
            state.writer = _TarStream(self._tmp(i), self.mtime)
        meta = json.dumps(sample.meta, ensure_ascii=False, sort_keys=True)
        # members in the order WebDataset's TarWriter uses: extensions sorted
        state.writer.add(f"{sample.key}.jpg", sample.jpg)
        state.writer.add(f"{sample.key}.json", meta.encode("utf-8"))
        state.writer.add(f"{sample.key}.txt", sample.txt.encode("utf-8"))
        state.keys.append(sample.key)

    def _commit(self, i: int) -> ShardStats:
        state = self._open.pop(i)
        name = shard_name(self.prefix, i)
        if state.writer is None:  # every item failed: an empty but valid tar
            state.writer = _TarStream(self._tmp(i), self.mtime)
        state.writer.close()
        os.replace(self._tmp(i), self.out_dir / name)
        stats = ShardStats(
            name, len(state.keys), state.size, tuple(state.keys), tuple(state.status), state.seconds
        )
        tmp_stats = self.out_dir / (stats_name(self.prefix, i) + ".tmp")
        tmp_stats.write_text(json.dumps(stats.to_dict(), indent=1, ensure_ascii=False), "utf-8")
        os.replace(tmp_stats, self.out_dir / stats_name(self.prefix, i))
        self.committed[i] = stats
        return stats
