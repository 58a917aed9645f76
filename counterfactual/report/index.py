"""What a run folder holds, indexed once (a run may hold millions of samples): a compact
:class:`SampleRef` per sample from its json in the shards (class, methods, verdict, and where its
JPEG and json lie, read again only for the few samples shown), ``status.jsonl`` (the committed
shards' stats files for an unfinished run) and ``manifest.json``; and :func:`stratify`, the
seeded draw of the samples a report shows, spread over removed class x image method."""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from counterfactual import fs
from counterfactual.jsonl import json_objects
from counterfactual.records import Status
from counterfactual.report.lines import method_label
from counterfactual.shards.names import MANIFEST_FILE, STATUS_FILE
from counterfactual.shards.samples import (
    BAD_SHARD,
    SampleMeta,
    SampleRow,
    read_member,
    read_shard,
    shard_paths,
)
from counterfactual.shards.shards import read_stats

_PARALLEL_SHARDS = 4
DEFAULT_N = 48


@dataclass(frozen=True, slots=True)
class SampleRef:
    """One written sample, compactly (a run may hold millions): its shard, where its JPEG and
    json lie in the tar (``(offset, size)``), and what the report counts and stratifies by. The
    whole json (keys as :func:`counterfactual.synth.job.sample_meta` writes them, maybe
    ``verify``) is read again by :meth:`load_meta` for the few samples shown."""

    shard: str | Path
    key: str
    image_id: str
    target: str
    """The class the plan was drawn for (co-removed classes are in ``removed``)."""
    removed: tuple[str, ...]
    method: str
    text_method: str
    verified: bool | None
    """``verify.passed`` when the json has a ``verify`` dict, else ``None``."""
    verify_failed: tuple[str, ...] = ()
    jpg: tuple[int, int] | None = None
    json_at: tuple[int, int] | None = None

    @classmethod
    def from_row(cls, row: SampleRow) -> SampleRef:
        """The reference to a sample read by :func:`counterfactual.shards.samples.read_shard`."""
        m, plan = row.meta, row.meta.plan
        return cls(
            row.shard,
            m.key,
            m.image_id,
            plan.target or (plan.removed[0] if plan.removed else "?"),
            plan.removed,
            method_label(m.image_method),
            method_label(m.text_method),
            None if m.verify is None else m.verify.passed,
            () if m.verify is None else m.verify.failed,
            row.jpg_at,
            row.json_at,
        )

    @classmethod
    def from_meta(
        cls,
        shard: str | Path,
        meta: Mapping[str, Any],
        jpg: tuple[int, int] | None = None,
        json_at: tuple[int, int] | None = None,
    ) -> SampleRef:
        plan = meta.get("plan") or {}
        removed = tuple(str(c) for c in plan.get("removed") or ())
        verify = meta.get("verify")
        return cls(
            shard,
            str(meta.get("key", "")),
            str(meta.get("image_id", "")),
            str(plan.get("target") or (removed[0] if removed else "?")),
            removed,
            method_label(meta.get("image_method")),
            method_label(meta.get("text_method")),
            bool(verify.get("passed")) if isinstance(verify, dict) else None,
            tuple(str(f) for f in verify.get("failed") or ()) if isinstance(verify, dict) else (),
            jpg,
            json_at,
        )

    def load_meta(self) -> SampleMeta:
        """The sample's json, read again from the shard; ``ValueError`` when it is not a
        sample's or this reference was not read from a shard."""
        data = self._read(self.json_at)
        if data is None:
            raise ValueError(f"sample {self.key}: no json member known in {self.shard}")
        return SampleMeta.from_json(data)

    def read_jpg(self) -> bytes | None:
        return self._read(self.jpg)

    def _read(self, at: tuple[int, int] | None) -> bytes | None:
        return None if at is None else read_member(self.shard, at)


@dataclass
class RunIndex:
    """What a run folder holds. ``notes`` are things a reader of the report must know (a missing
    ``status.jsonl``, counts that disagree with the manifest, an unreadable shard)."""

    out_dir: Path
    manifest: dict[str, Any]
    statuses: list[Status]
    samples: list[SampleRef]
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """``status:reason`` (``written`` alone) -> rows, as ``manifest.json`` counts them."""
        c = Counter(f"{s.status}:{s.reason}" if s.reason else s.status for s in self.statuses)
        return dict(sorted(c.items()))


def read_run(out_dir: Path, workers: int | None = None) -> RunIndex:
    """Index the run in ``out_dir`` (see the module doc); ``ValueError`` if it holds none. From
    ``_PARALLEL_SHARDS`` shards on, ``workers`` processes (default: one per CPU) read them."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise FileNotFoundError(f"run folder {out_dir} does not exist")
    notes: list[str] = []
    manifest: dict[str, Any] = {}
    manifest_path = out_dir / MANIFEST_FILE
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    status_path = out_dir / STATUS_FILE
    names = {f.name for f in fields(Status)}
    if status_path.exists():
        statuses = [
            Status(**{k: v for k, v in row.value.items() if k in names})
            for row in json_objects(status_path)
        ]
    else:
        stats = read_stats(out_dir)
        statuses = [s for i in sorted(stats) for s in stats[i].status]
        if stats:
            notes.append(
                "status.jsonl is missing (the run is unfinished or was interrupted): counts are "
                f"those of the {len(stats)} committed shards; images the reader could not turn "
                "into a record are not counted"
            )
    samples: list[SampleRef] = []
    unreadable: list[Status] = []
    shards = shard_paths(out_dir)
    workers = min(workers or os.cpu_count() or 1, len(shards))
    if workers > 1 and len(shards) >= _PARALLEL_SHARDS:
        with ProcessPoolExecutor(workers) as pool:
            found = list(pool.map(_shard_samples, shards, chunksize=4))
    else:
        found = [_shard_samples(shard) for shard in shards]
    for shard, refs in zip(shards, found, strict=True):
        if isinstance(refs, str):
            notes.append(f"{fs.name(shard)} could not be read: {refs}")
        else:
            samples.extend(refs[0])
            unreadable.extend(refs[1])
    if unreadable:
        notes.append(
            f"{len(unreadable)} sample{'s' * (len(unreadable) != 1)} left out, the json is not "
            f"a sample's: {unreadable[0].detail}" + (" ..." if len(unreadable) > 1 else "")
        )
    if not samples and not statuses and not manifest:
        raise ValueError(
            f"{out_dir} is not a synth run folder (no shard-*.tar, status.jsonl or manifest.json)"
        )
    if not manifest:
        notes.append("manifest.json is missing: no config or timings to show")
    index = RunIndex(out_dir, manifest, statuses, samples, notes)
    recorded = manifest.get("counts")
    if isinstance(recorded, dict) and status_path.exists() and recorded != index.counts():
        notes.append("manifest.json counts differ from status.jsonl; the page shows status.jsonl")
    return index


def _shard_samples(shard: str | Path) -> tuple[list[SampleRef], list[Status]] | str:
    """The samples of one shard (pictures not read) and those whose json is not a sample's,
    or why the shard cannot be read."""
    refs: list[SampleRef] = []
    bad: list[Status] = []
    for row in read_shard(shard, images=False):
        if isinstance(row, SampleRow):
            refs.append(SampleRef.from_row(row))
        elif row.reason == BAD_SHARD:
            return row.detail.removeprefix(f"{fs.name(shard)}: ")
        else:
            bad.append(row)
    return refs, bad


def stratify(samples: Sequence[SampleRef], n: int = DEFAULT_N, seed: int = 0) -> list[SampleRef]:
    """About ``n`` samples spread evenly over the strata (target class x image method), drawn
    with ``seed``. Every stratum gets at least one (so more than ``n`` when there are more
    strata), then every class some plan co-removed gets at least one. Sorted by class, method
    and run order."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(seed)
    order = {id(s): i for i, s in enumerate(samples)}
    groups: dict[tuple[str, str], list[SampleRef]] = defaultdict(list)
    for s in samples:
        groups[(s.target, s.method)].append(s)
    strata = sorted(groups)
    rng.shuffle(strata)
    for k in strata:
        rng.shuffle(groups[k])
    chosen: list[SampleRef] = [groups[k][0] for k in strata]
    depth = 1
    while len(chosen) < n and any(depth < len(groups[k]) for k in strata):
        for k in strata:
            if depth < len(groups[k]) and len(chosen) < n:
                chosen.append(groups[k][depth])
        depth += 1
    covered = {c for s in chosen for c in s.removed}
    pool = list(samples)
    rng.shuffle(pool)
    for s in pool:
        if not set(s.removed) <= covered:
            chosen.append(s)
            covered.update(s.removed)
    return sorted(chosen, key=lambda s: (s.target, s.method, order[id(s)]))
