"""``counterfactual select``: removal plans of a dataset as JSON lines.

A well-formed instances file is read as a :class:`~counterfactual.boxtable.BoxTable`
(:func:`~counterfactual.readers.coco_boxes.read_coco_boxes`); one with anything to report is
read by :func:`~counterfactual.readers.coco.read_coco`, which names each problem. The rules run
on chunks of images, in worker processes when there are several chunks and cores, and each
chunk's plans come back as JSON lines, written in image order.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from counterfactual.boxtable import BoxTable
from counterfactual.cli.common import add_selection_args, selection_config
from counterfactual.cli.options import add_options
from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.method.selection import SelectionConfig, select_rows
from counterfactual.options import declare, declared
from counterfactual.readers.coco import read_coco
from counterfactual.readers.coco_boxes import read_coco_boxes

CHUNK = 16_384
"""Images selected together, and whose plans are written with one call."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectOptions:
    """``counterfactual select``'s input, output and workers (the rules are
    :class:`SelectionConfig`'s)."""

    dataset: str = declare(
        "coco", help="format of --annotations (default: %(default)s)", choices=("coco",)
    )
    annotations: Path = declare(help="COCO instances_*.json", kind="path")
    rejected: bool = declare(
        False, help="also write rejected candidates, with the rule", kind="flag"
    )
    out: Path | None = declare(None, help="PLANS.jsonl (default: stdout)", kind="path")
    workers: int = declare(
        0,
        help=f"processes selecting chunks of {CHUNK:,} images; 0 = one per usable core, "
        "1 = in this process (default: %(default)s)",
        kind="nonnegative_int",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "select",
        help="pick removable classes per image (alpha rules) and write the plans",
        description="Write one JSON object per plan: image_id, target, removed, kept, kind "
        "(single/multi), valid, rejected_by, and the evidence (each ratio with its threshold).",
    )
    add_options(p, declared(SelectOptions, "dataset", "annotations"))
    add_selection_args(p)
    add_options(p, declared(SelectOptions, "rejected", "out", "workers"))
    p.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class _Job:
    table: BoxTable
    ids: Sequence[int | str]
    config: SelectionConfig
    seed: int
    stats: CooccurrenceStats | None
    rejected: bool


@dataclass(frozen=True, slots=True)
class _Done:
    lines: bytes
    plans: int
    refused: int


@contextmanager
def _collector_paused() -> Iterator[None]:
    """What ``select`` builds (the file's entries, the plans) forms no reference cycles, and the
    collector would walk it again and again as it grows: a third of the time. Off meanwhile
    (in the command and in each worker, which may be a fresh process)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _select(job: _Job) -> _Done:
    """One chunk's plans (and with ``rejected`` then each image's refused candidates) as JSON
    lines, ``image_id`` the input file's id as a string (as in shards and status rows)."""
    with _collector_paused():
        rows, plans, refused = select_rows(
            job.table, job.config, job.stats, job.seed, job.rejected, job.ids
        )
        return _Done(msgspec.json.Encoder().encode_lines(rows), plans, refused)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def write_plans(
    table: BoxTable,
    ids: Sequence[int | str],
    config: SelectionConfig,
    out: BinaryIO,
    stats: CooccurrenceStats | None = None,
    rejected: bool = False,
    workers: int = 1,
    seed: int = 0,
) -> tuple[int, int]:
    """Write each image's chosen plans (and with ``rejected`` then its refused candidates) as
    one JSON object per line, in table order; ``image_id`` is ``str(ids[image])``: the input
    file's id as a string, the one id type of every output (shards, ``status.jsonl``), since
    corpora's keys are strings; COCO's ``139`` is ``"139"`` (``int()`` joins it with
    ``pycocotools``). ``workers`` processes select chunks of at most :data:`CHUNK` images (1:
    this process; 0: one per usable core), as many chunks for each and of even sizes, so that
    they finish together. Returns ``(plans, rejected candidates)``."""
    ids = [str(ident) for ident in ids]
    chunks = -(-len(table) // CHUNK)
    workers = min(workers or usable_cores(), chunks)
    chunks = -(-chunks // max(workers, 1)) * max(workers, 1)
    size = max(1, -(-len(table) // max(chunks, 1)))
    jobs = (
        _Job(table.images(s, s + size), ids[s : s + size], config, seed, stats, rejected)
        for s in range(0, len(table), size)
    )
    plans = refused = 0
    for done in _map(jobs, workers):
        out.write(done.lines)
        plans += done.plans
        refused += done.refused
    return plans, refused


def _map(jobs: Iterator[_Job], workers: int) -> Iterator[_Done]:
    if workers <= 1:
        yield from map(_select, jobs)
        return
    # fork where it is safe and cheap (Linux): the workers start without importing anything
    method = "fork" if sys.platform == "linux" else "spawn"
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method)) as pool:
        yield from pool.map(_select, jobs)


def run(args: argparse.Namespace) -> int:
    with _collector_paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    config = selection_config(args)
    boxes = read_coco_boxes(args.annotations)
    unreadable = 0
    if boxes is not None:
        table, ids = boxes.table, boxes.original_ids
    else:  # something to report: the reader that names every problem
        original: dict[str, int | str] = {}
        dataset = read_coco(args.annotations, None, args.annotations.parent, original_ids=original)
        table = BoxTable.from_records(dataset.records)
        ids = [original[r.image_id] for r in dataset.records]
        unreadable = len(dataset.failures)
    stats = None
    if config.policy == "spurious":  # PMI over the whole file, before any image is chosen
        stats = CooccurrenceStats.from_table(table)
    todo = (table, ids, config)
    if args.out:
        with open(args.out, "wb") as fh:
            plans, rejected = write_plans(*todo, fh, stats, args.rejected, args.workers, args.seed)
    else:
        out = sys.stdout.buffer
        plans, rejected = write_plans(*todo, out, stats, args.rejected, args.workers, args.seed)
        out.flush()
    print(
        f"{len(table)} images, {plans} plans"
        + (f", {rejected} rejected candidates" if args.rejected else "")
        + f", {unreadable} unreadable images",
        file=sys.stderr,
    )
    return 0
