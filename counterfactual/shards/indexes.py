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
from counterfactual.messages import one_line

SIZES_FILE = "sizes.json"
WIDS_FILE = "shardindex.json"
WIDS_KIND = "wids-shard-index-v1"
# DataLoader workers a training loader is likely to run per GPU: open_clip's recipes (and ours)
# pass --workers 8. Each worker reads whole shards, so with fewer shards some read none.
LOADER_WORKERS = 8


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


def few_shards_note(
    sizes: dict[str, int], out: fs.PathLike, workers: int = LOADER_WORKERS
) -> str | None:
    """One line when fewer than ``workers`` shards of ``sizes`` (``out``'s ``sizes.json``)
    hold samples, but some do: a loader's workers beyond the shard count read nothing
    (webdataset 1.x then raises "No samples found", open_clip's trainer refuses unless
    resampled); ``None`` otherwise."""
    held = sum(1 for n in sizes.values() if n > 0)
    if held == 0 or held >= workers:
        return None
    return one_line(
        f"note: {held} shard{'' if held == 1 else 's'} hold{'s' if held == 1 else ''} samples, "
        f"fewer than the {workers} DataLoader workers a trainer often runs, and a worker reads "
        "whole shards: load with "
        f"counterfactual.load.webdataset({str(out)!r}), or open_clip's "
        "--dataset-resampled (the flags counterfactual mix prints), or write more shards "
        "(a smaller --images-per-shard)"
    )


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
    "LOADER_WORKERS",
    "IndexedShard",
    "few_shards_note",
    "index_problems",
    "sizes_json",
    "wids_index",
    "write_indexes",
)
