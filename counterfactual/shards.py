"""WebDataset shards: per sample ``<key>.jpg``, ``<key>.txt`` and ``<key>.json``.

Shards are ``{prefix}-{index:06d}.tar``; each is written under a temporary name, renamed when
complete, and followed by ``{prefix}-{index:06d}_stats.json``, written last: a shard without
its stats file is unfinished. Keys are stable and contain no dots, so WebDataset splits
``key.ext`` correctly.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass
class ShardWriter:
    """Writes samples into shards of ``samples_per_shard`` each, in the order given."""

    out_dir: Path
    samples_per_shard: int = 1000
    prefix: str = "shard"
    start_index: int = 0
    written: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.samples_per_shard < 1:
            raise ValueError(f"samples_per_shard must be >= 1, got {self.samples_per_shard}")
        if "." in self.prefix or "/" in self.prefix:
            raise ValueError(f"shard prefix {self.prefix!r} must not contain '.' or '/'")
        self.out_dir = Path(self.out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._index = self.start_index
        self._writer: Any = None
        self._keys: list[str] = []

    def write(self, sample: Sample) -> None:
        if "." in sample.key:
            raise ValueError(f"sample key {sample.key!r} contains a dot")
        if self._writer is None:
            self._open()
        self._writer.write(
            {
                "__key__": sample.key,
                "jpg": sample.jpg,
                "txt": sample.txt,
                "json": json.dumps(sample.meta, ensure_ascii=False, sort_keys=True),
            }
        )
        self._keys.append(sample.key)
        if len(self._keys) >= self.samples_per_shard:
            self._finish()

    def close(self) -> None:
        if self._writer is not None:
            self._finish()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        import webdataset as wds

        self._tmp = self.out_dir / (shard_name(self.prefix, self._index) + ".tmp")
        self._stream = open(self._tmp, "wb")  # noqa: SIM115 - closed in _finish
        self._writer = wds.TarWriter(self._stream)
        self._keys = []

    def _finish(self) -> None:
        self._writer.close()
        self._stream.close()
        name = shard_name(self.prefix, self._index)
        os.replace(self._tmp, self.out_dir / name)
        stats = {"shard": name, "count": len(self._keys), "keys": self._keys}
        tmp_stats = self.out_dir / (stats_name(self.prefix, self._index) + ".tmp")
        tmp_stats.write_text(json.dumps(stats, indent=1), encoding="utf-8")
        os.replace(tmp_stats, self.out_dir / stats_name(self.prefix, self._index))
        self.written.append(name)
        self._writer = None
        self._index += 1
