"""Shard lists that training loaders read beside the shards, written at the end of every run.

- ``sizes.json``: open_clip's format, ``{"shard-000000.tar": n, ...}``, the samples of every
  committed shard (empty ones as 0), so open_clip's ``get_dataset_size`` (and with it
  ``--train-num-samples``) needs no count by hand.
- ``shardindex.json``: the ``wids`` shard index (``__kind__: wids-shard-index-v1``,
  ``wids_version: 1``, a ``shardlist`` of ``{"url", "nsamples", "filesize"}``, the name its
  ``widsindex create`` gives), the shards that hold samples with urls relative to the index,
  so ``wids.ShardListDataset("OUT/shardindex.json")`` gives random access by sample index.

Both are rebuilt from the committed shards' stats files by :func:`write_indexes` whenever a run
finishes, a resumed one included, so they always list exactly the shards of the run folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from counterfactual import fs

SIZES_FILE = "sizes.json"
WIDS_FILE = "shardindex.json"
WIDS_KIND = "wids-shard-index-v1"


@dataclass(frozen=True, slots=True)
class IndexedShard:
    """A committed shard: its file name in OUT, its samples and its bytes."""

    name: str
    samples: int
    size: int


def sizes_json(shards: Sequence[IndexedShard]) -> dict[str, int]:
    """open_clip's ``sizes.json``: samples by shard file name, every shard listed."""
    return {s.name: s.samples for s in shards}


def wids_index(shards: Sequence[IndexedShard], name: str = "counterfactual") -> dict[str, Any]:
    """The wids shard index of the shards that hold samples (a shard of 0 samples would be a
    range of no indices), urls relative to the index's folder."""
    return {
        "__kind__": WIDS_KIND,
        "wids_version": 1,
        "name": name,
        "shardlist": [
            {"url": s.name, "nsamples": s.samples, "filesize": s.size}
            for s in shards
            if s.samples > 0
        ],
    }


def write_indexes(
    out_dir: fs.PathLike, shards: Sequence[IndexedShard], run: str | None = None
) -> None:
    """``sizes.json`` and ``shardindex.json`` in ``out_dir``, each written whole (``run``: the
    run token its temporary name carries)."""
    for file, data in ((SIZES_FILE, sizes_json(shards)), (WIDS_FILE, wids_index(shards))):
        fs.write_text(fs.join(out_dir, file), json.dumps(data, indent=1) + "\n", run=run)


def index_problems(
    out_dir: fs.PathLike, names: set[str], shards: Sequence[IndexedShard]
) -> list[str]:
    """What ``sizes.json`` and ``shardindex.json`` in ``out_dir`` (whose files are ``names``)
    say that differs from the committed ``shards`` (a missing one is none: runs before these
    files, or one that never finished, have neither)."""
    problems: list[str] = []
    for file, expected in (
        (SIZES_FILE, sizes_json(shards)),
        (WIDS_FILE, wids_index(shards)["shardlist"]),
    ):
        if file not in names:
            continue
        try:
            data = json.loads(fs.read_text(fs.join(out_dir, file)))
        except ValueError as err:
            problems.append(f"{file}: not JSON ({err})")
            continue
        found = data.get("shardlist") if file == WIDS_FILE and isinstance(data, dict) else data
        if found != expected:
            problems.append(f"{file} does not list the committed shards and their samples")
    return problems


__all__: Sequence[str] = (
    "SIZES_FILE",
    "WIDS_FILE",
    "WIDS_KIND",
    "IndexedShard",
    "index_problems",
    "sizes_json",
    "wids_index",
    "write_indexes",
)
