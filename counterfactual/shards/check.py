"""``counterfactual check OUT``: is a run folder whole and do its records agree?

Every committed shard is verified against its stats file (:func:`~counterfactual.shards.shards.verify_shard`:
size, and SHA-256 unless ``content=False``; an older stats file without them: its tar read and
its samples' keys compared), and the folder's records are compared with its shards:
``status.jsonl`` (its ``written`` rows are the shards' samples, no more, no fewer),
``manifest.json`` (``shards``, ``samples``, ``status_rows``), the dataset card's list of
shards, ``sizes.json`` and ``shardindex.json``. Shards are numbered from 0 without gaps; a tar without its stats file (a run stopped
mid-shard) or a stats file without its tar is reported too. Nothing is changed: a rerun of the
synth command remakes what is damaged.

``mix --unpair``'s folder (``orig-NNNNNN.tar``, its stats files and ``sizes.json``: the
originals of pair shards, no run records) is checked the same way, shards and index only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from counterfactual import fs
from counterfactual.shards.card import CARD_FILE
from counterfactual.shards.indexes import IndexedShard, index_problems
from counterfactual.shards.names import MANIFEST_FILE, RUN_FILE, STATUS_FILE
from counterfactual.shards.shards import (
    ORIGINALS_PREFIX,
    ShardStats,
    file_sizes,
    shard_index,
    shard_name,
    stats_name,
    verify_shard,
)


@dataclass
class RunCheck:
    """What :func:`check_run` found: ``problems`` (one line each; none: the folder is whole),
    the committed ``shards``, their ``samples`` and ``bytes``, how many were checked by hash
    (``hashed``; the rest by reading their tar, stats files older than hashes) and the
    ``seconds`` it took."""

    out_dir: fs.PathLike
    problems: list[str] = field(default_factory=list)
    shards: int = 0
    samples: int = 0
    bytes: int = 0
    hashed: int = 0
    seconds: float = 0.0
    content: bool = True
    prefix: str = "shard"
    """The shards' prefix: ``shard`` (a synth run) or ``orig`` (``mix --unpair``)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """The last line ``check`` prints."""
        checked = (
            "sizes only"
            if not self.content
            else "size and SHA-256"
            if self.hashed == self.shards
            else "size and SHA-256, or contents"
        )
        head = (
            f"{self.out_dir}: {self.shards:,} shards, {self.samples:,} samples, "
            f"{self.bytes / 1e6:,.1f} MB checked ({checked}) in {self.seconds:.1f} s"
        )
        unpaired = self.prefix == ORIGINALS_PREFIX
        if self.ok:
            if unpaired:
                return f"{head}: intact (mix --unpair's originals), and sizes.json agrees"
            return f"{head}: intact, and status.jsonl, manifest.json and {CARD_FILE} agree"
        command = "the mix --unpair command" if unpaired else "the synth command"
        return (
            f"{head}: {len(self.problems)} problem(s); rerun {command} to make damaged shards again"
        )


def check_run(out_dir: fs.PathLike, content: bool = True) -> RunCheck:
    """Check the run folder ``out_dir`` (a local folder or URL); see the module doc.
    ``content=False``: sizes only (no shard is read). ``ValueError`` when it holds no run."""
    started = time.perf_counter()
    out_dir = fs.as_path(out_dir)
    names = set(fs.listdir(out_dir))
    if not names:
        raise ValueError(f"{out_dir}: no such run folder (or an empty one)")
    prefix = _prefix(names)
    result = RunCheck(out_dir, content=content, prefix=prefix)
    problem = result.problems.append
    sizes = file_sizes(out_dir)
    tars = {
        i
        for n in names
        if n.endswith(".tar")
        and (i := shard_index(n[: -len(".tar")] + "_stats.json", prefix)) is not None
    }
    committed: dict[int, ShardStats] = {}
    for name in sorted(names):
        index = shard_index(name, prefix)
        if index is None:
            continue
        if index not in tars:
            problem(f"{name}: its tar {shard_name(prefix, index)} is missing")
            continue
        try:
            committed[index] = ShardStats.from_dict(
                json.loads(fs.read_text(fs.join(out_dir, name)))
            )
        except (ValueError, KeyError, TypeError) as err:
            problem(f"{name}: not a stats file ({type(err).__name__}: {err})")
    for index in sorted(tars - set(committed)):
        if stats_name(prefix, index) not in names:
            problem(f"{shard_name(prefix, index)}: unfinished (no stats file)")
    if committed and RUN_FILE not in names and prefix != ORIGINALS_PREFIX:
        problem(f"{RUN_FILE} is missing: the config the shards were made with is not recorded")
    for _, stats in sorted(committed.items()):
        damage = verify_shard(out_dir, stats, sizes.get(stats.shard), content)
        if damage is not None:
            problem(f"{stats.shard}: damaged: {damage}")
        result.shards += 1
        result.samples += stats.count
        result.bytes += sizes.get(stats.shard, 0)
        result.hashed += stats.sha256 is not None
    indexed = [
        IndexedShard(s.shard, s.count, s.size if s.size is not None else sizes.get(s.shard, 0))
        for _, s in sorted(committed.items())
    ]
    for found in index_problems(out_dir, names, indexed):
        problem(found)
    gaps = [i for i in range(max(committed, default=-1) + 1) if i not in committed]
    if gaps:
        problem(
            f"{len(gaps)} shard(s) missing from the numbering ({shard_name(prefix, gaps[0])}, ...)"
        )
    if prefix != ORIGINALS_PREFIX:  # the originals of pairs have no run records
        _check_records(out_dir, names, committed, problem)
    result.seconds = time.perf_counter() - started
    return result


def _prefix(names: set[str]) -> str:
    """``orig`` for a folder of ``mix --unpair``'s originals (``orig-*`` shards and no
    ``shard-*`` ones), else ``shard``."""
    has = {p: any(n.startswith(f"{p}-") for n in names) for p in ("shard", ORIGINALS_PREFIX)}
    return ORIGINALS_PREFIX if has[ORIGINALS_PREFIX] and not has["shard"] else "shard"


def damaged_shards(out_dir: fs.PathLike, content: bool = True) -> list[str]:
    """One line per committed shard that is not as committed (what ``counterfactual report``
    checks before reading a run): a stats file without its tar, or that cannot be read, a tar
    whose size (and, with ``content``, SHA-256: :func:`verify_shard`) differs from its stats
    file's. Only what a reader of the shards trusts; :func:`check_run` checks the records
    too. No lines for a folder that does not exist or holds no shards."""
    try:
        names = set(fs.listdir(out_dir))
    except FileNotFoundError:
        return []
    sizes = file_sizes(out_dir)
    lines: list[str] = []
    for name in sorted(names):
        index = shard_index(name)
        if index is None:
            continue
        tar = shard_name("shard", index)
        if tar not in names:
            lines.append(f"{fs.join(out_dir, name)}: its tar {tar} is missing")
            continue
        try:
            stats = ShardStats.from_dict(json.loads(fs.read_text(fs.join(out_dir, name))))
        except (ValueError, KeyError, TypeError) as err:
            lines.append(f"{fs.join(out_dir, name)}: not a stats file ({type(err).__name__})")
            continue
        damage = verify_shard(out_dir, stats, sizes.get(stats.shard), content)
        if damage is not None:
            lines.append(f"{fs.join(out_dir, stats.shard)}: damaged: {damage}")
    return lines


def _check_records(
    out_dir: fs.PathLike,
    names: set[str],
    committed: dict[int, ShardStats],
    problem: Callable[[str], None],
) -> None:
    """``status.jsonl``, ``manifest.json`` and the card against the committed shards."""
    keys = {k for s in committed.values() for k in s.keys}
    samples = sum(s.count for s in committed.values())
    rows = 0
    if STATUS_FILE in names:
        written: list[str] = []
        for row in _rows(fs.join(out_dir, STATUS_FILE)):
            rows += 1
            if row.get("status") == "written":
                written.append(str(row.get("key")))
        if len(written) != samples or set(written) != keys:
            extra, lost = len(set(written) - keys), len(keys - set(written))
            problem(
                f"{STATUS_FILE}: {len(written):,} written rows for the shards' {samples:,} "
                f"samples ({extra:,} in no shard, {lost:,} shard samples without a row)"
            )
    elif committed:
        problem(f"{STATUS_FILE} is missing (the run never finished: rerun the synth command)")
    if MANIFEST_FILE in names:
        try:
            manifest = json.loads(fs.read_text(fs.join(out_dir, MANIFEST_FILE)))
        except ValueError as err:
            problem(f"{MANIFEST_FILE}: not JSON ({err})")
            manifest = {}
        expected = {"shards": len(committed), "samples": samples}
        if STATUS_FILE in names:
            expected["status_rows"] = rows
        for key, value in expected.items():
            if key in manifest and manifest[key] != value:
                problem(f"{MANIFEST_FILE}: {key} is {manifest[key]:,}, the folder holds {value:,}")
    elif committed:
        problem(f"{MANIFEST_FILE} is missing (the run never finished: rerun the synth command)")
    if CARD_FILE in names:
        listed = _card_shards(fs.read_text(fs.join(out_dir, CARD_FILE)))
        held = {s.shard for s in committed.values() if s.count > 0}
        if not held:  # a run without samples lists its empty shards (it still opens)
            held = {s.shard for s in committed.values()}
        if listed is not None and set(listed) != held:
            problem(
                f"{CARD_FILE}: lists {len(listed):,} shards with samples, the folder holds "
                f"{len(held):,} ({len(held - set(listed)):,} unlisted, "
                f"{len(set(listed) - held):,} listed but not held)"
            )


def _rows(path: fs.PathLike) -> Iterator[dict[str, Any]]:
    with fs.open_file(path, "rb") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _card_shards(text: str) -> list[str] | None:
    """The shard names the card's front matter lists (``None``: no front matter)."""
    if not text.startswith("---\n"):
        return None
    end = text.find("\n---", 4)
    meta = yaml.safe_load(text[4:end]) if end > 0 else None
    if not isinstance(meta, dict):
        return None
    found: list[str] = []
    for config in meta.get("configs") or []:
        for files in config.get("data_files") or []:
            paths = files.get("path", [])
            found += [paths] if isinstance(paths, str) else list(paths)
    return found
