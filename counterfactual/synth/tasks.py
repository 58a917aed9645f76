"""Shards as units of work: which input makes which shard, and the worker that makes one.

A run's input is cut into :class:`ShardTask` s before any pixel is touched, and each task makes
exactly one output shard: ``images_per_shard`` consecutive images of an annotated dataset (the
driver holds its records and hands each task its slice), or one piece of a corpus (a WebDataset
tar, a range of Parquet or CSV rows), which the worker reads itself, so the driver never holds
a corpus's samples (img2dataset's model: output shards derived from input shards). Which input
makes which shard depends only on the input and the config, so a shard's bytes do not depend
on the runner, the number of workers or the order they finish in.

:class:`ShardMaker` is the worker's side: it reads the task's records, plans them
(:func:`counterfactual.synth.plan.plan`: the alpha rules, the policy, the captions), runs the steps
batch by batch and writes the shard with :class:`~counterfactual.shards.shards.ShardWriter`: tar, then
stats file. Both runners use it: in process, and in the Ray actors of ``pipelines/``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, TypeVar

from counterfactual import fs
from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.readers.spec import InputStamps, RunInput
from counterfactual.records import ImageRecord, Status
from counterfactual.shards.frames import DEFAULT_RULE, FrameRule, scan_rule
from counterfactual.shards.shards import ShardStats, ShardWriter
from counterfactual.synth.job import Job
from counterfactual.synth.plan import Runtime, SynthConfig, plan
from counterfactual.synth.staging import Process

if TYPE_CHECKING:
    from counterfactual.readers.corpus import InputPiece

T = TypeVar("T")


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


@dataclass(frozen=True)
class ShardTask:
    """The input of one shard: ``rows`` (records, and statuses of images that are already
    known to fail, in input order) or a corpus ``piece`` for the worker to read. ``stats``:
    dataset-wide co-occurrence counts for the spurious policy. ``inputs``: the fingerprint of
    the input by part (:func:`input_parts`), kept in the shard's stats file, so that a rerun
    over changed input is refused naming what changed (:func:`input_change`); ``input`` its
    ``ids`` part, what older stats files hold. ``run``: the run's token (its temporary names);
    ``config``: the digest of its config (:func:`~counterfactual.shards.shards.config_digest`);
    both set by the driver as it hands the task out. ``exif``: the frame of the boxes on
    EXIF-tagged pictures whose size cannot tell it, the same for every task of a run
    (:func:`~counterfactual.shards.frames.scan_rule`)."""

    index: int
    rows: tuple[ImageRecord | Status, ...] = ()
    piece: InputPiece | None = None
    stats: CooccurrenceStats | None = None
    input: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    run: str | None = None
    config: str = ""
    exif: FrameRule = DEFAULT_RULE


def _fingerprint(parts: Iterable[str]) -> str:
    h = hashlib.blake2b(digest_size=12)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass") + b"\n")
    return h.hexdigest()


def _row_id(row: ImageRecord | Status) -> str:
    return row.image_id if isinstance(row, ImageRecord) else f"!{row.image_id}:{row.reason}"


def piece_fingerprint(piece: InputPiece) -> str:
    """The piece's file name and its range (rows, and a CSV's byte offsets): the ``ids`` part
    of a corpus piece's fingerprint."""
    fields = (piece.kind, piece.index, piece.start, piece.stop, piece.offset, piece.end)
    return _fingerprint([fs.name(piece.path), *map(str, fields)])


PARTS = {
    "ids": "other images (another dataset, split, limit or file)",
    "keys": "other of its keys repeat an earlier piece's (duplicate-key rows; an input file "
    "before it was added, removed or changed)",
    "annotations": "the annotations of its images changed (boxes, classes or captions)",
    "sizes": "its input files changed (their sizes differ)",
    "stamps": "its input files were modified (their modification times or ETags differ; "
    "--hash-inputs compares contents instead)",
    "content": "its input files' contents changed",
}
"""The parts of a shard's input fingerprint, and what a difference in each one means."""


def input_parts(
    rows: Sequence[ImageRecord | Status] = (),
    piece: InputPiece | None = None,
    stamps: InputStamps | None = None,
) -> dict[str, str]:
    """What decides a shard's content, part by part (:data:`PARTS`), each a short digest.

    ``ids``: the images (ids, and the reader's failures) or the piece (file name and range);
    ``keys``: a piece's rows or keys that repeat an earlier piece's (only when it has any);
    ``annotations``: each record's file, size, objects and captions as read (an annotated
    dataset, or a corpus's first rows under ``--limit``); ``sizes`` and ``stamps``: of each
    picture file, the file a picture lies in, or the piece's file (its files, for a folder):
    bytes, and the modification time or an object store's ETag; ``content``: their SHA-256,
    only when ``stamps`` hashes (``--hash-inputs``)."""
    stamps = stamps or InputStamps()
    sizes, marks, content = (hashlib.blake2b(digest_size=12) for _ in range(3))

    def stamp(path: fs.PathLike) -> None:
        s = stamps.of(path)
        sizes.update(f"{s.size}\n".encode())
        marks.update(s.stamp.encode("utf-8", "surrogatepass") + b"\n")
        content.update(s.content.encode() + b"\n")

    if piece is not None:
        parts = {"ids": piece_fingerprint(piece)}
        if piece.repeated or piece.repeated_keys:
            rows = ",".join(map(str, sorted(piece.repeated)))
            keys = hashlib.blake2b(piece.repeated_keys, digest_size=12).hexdigest()
            parts["keys"] = _fingerprint([rows, keys])
        stamp(piece.path)
    else:
        annotations = hashlib.blake2b(digest_size=12)
        for row in rows:
            if isinstance(row, Status):
                continue
            annotations.update(_record_text(row))
            if row.source is not None:
                stamp(row.source.path)
            elif isinstance(row.root, str):
                stamp(fs.join(row.root, row.file))
            else:
                stamp(os.path.join(row.root or "", row.file))
        parts = {"ids": _fingerprint(map(_row_id, rows)), "annotations": annotations.hexdigest()}
    parts |= {"sizes": sizes.hexdigest(), "stamps": marks.hexdigest()}
    if stamps.content:
        parts["content"] = content.hexdigest()
    return parts


def _record_text(record: ImageRecord) -> bytes:
    """What a record says of its picture, as bytes: the plain tuples it pickles as, less its
    root (a dataset moved elsewhere is the same dataset; its pictures' stamps tell)."""
    _, (_id, file, width, height, objects, captions, _root, *_rest) = record.__reduce__()
    text = repr((file, width, height, objects, captions))
    return text.encode("utf-8", "surrogatepass") + b"\n"


def input_change(recorded: dict[str, str], input: str, now: dict[str, str]) -> str | None:
    """What differs between a committed shard's input fingerprint (``recorded``, and its
    ``input``: an older stats file has only that, the ``ids`` part) and this run's (``now``),
    as :data:`PARTS` words it; ``None`` when the shard may be kept. With contents on both
    sides, modification times and ETags are not compared (a copied dataset resumes)."""
    if not recorded:
        return None if input == now.get("ids") else PARTS["ids"]
    names = ["ids", "keys", "annotations", "sizes"]
    names.append("content" if "content" in recorded and "content" in now else "stamps")
    for name in names:
        if recorded.get(name) != now.get(name):
            return PARTS[name]
    return None


def shard_tasks(
    inputs: RunInput, config: SynthConfig, stamps: InputStamps | None = None
) -> Iterator[ShardTask]:
    """The run's tasks in shard order, made lazily (records are sliced as they stream by),
    each with its input fingerprint (:func:`input_parts`; ``stamps``: how input files are
    stamped, by default size and modification time).

    With the spurious policy a first pass over the records counts class co-occurrences
    (counts only, each image id once) and every task carries them. With annotated boxes and
    ``--exif-frame auto`` a pass over the pictures' headers finds the dataset's EXIF frame
    (:func:`~counterfactual.shards.frames.scan_rule`), which every task carries. A repeated
    image id makes its
    later occurrence a ``failed: duplicate-id`` row; the first is processed.
    """
    stamps = stamps or InputStamps()
    if inputs.pieces is not None:
        for i, piece in enumerate(inputs.pieces):
            parts = input_parts(piece=piece, stamps=stamps)
            yield ShardTask(i, piece=piece, input=parts["ids"], inputs=parts)
        return
    records: Iterable[ImageRecord] = inputs.records
    stats = None
    if config.selection.policy == "spurious":
        if not isinstance(records, Sequence):
            records = list(records)
        stats = CooccurrenceStats.streamed(_first_of_each_id(records))
    exif = FrameRule(config.exif_frame, given=True) if config.exif_frame != "auto" else None
    if exif is None and config.detect is None:
        if not isinstance(records, Sequence):
            records = list(records)
        exif = scan_rule(_first_of_each_id(records))
    first: dict[str, int] = {}
    for i, chunk in enumerate(batched(records, config.images_per_shard)):
        rows: list[ImageRecord | Status] = []
        for k, record in enumerate(chunk):
            where = i * config.images_per_shard + k
            if first.setdefault(record.image_id, where) != where:
                detail = f"image id already used by image {first[record.image_id]} of the input"
                rows.append(Status(record.image_id, "failed", "duplicate-id", detail))
            else:
                rows.append(record)
        parts = input_parts(rows, stamps=stamps)
        yield ShardTask(
            i, tuple(rows), stats=stats, input=parts["ids"], inputs=parts, exif=exif or DEFAULT_RULE
        )


def _first_of_each_id(records: Iterable[ImageRecord]) -> Iterator[ImageRecord]:
    """``records`` without the later occurrences of a repeated image id."""
    seen: set[str] = set()
    for record in records:
        if record.image_id not in seen:
            seen.add(record.image_id)
            yield record


@dataclass(frozen=True)
class ShardDone:
    """What the driver hears of a finished shard: counts, not samples."""

    index: int
    shard: str
    images: int
    items: int
    samples: int
    counts: dict[str, int]
    seconds: dict[str, float]
    node: str = ""
    input: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    config: str = ""

    def outcomes(self) -> dict[str, int]:
        """Status rows by outcome: ``written``, ``skipped``, ``failed`` (every row, as the end
        of the run counts them)."""
        out = {"written": 0, "skipped": 0, "failed": 0}
        for name, n in self.counts.items():
            out[name.split(":", 1)[0]] += n
        return out

    @classmethod
    def of(cls, index: int, stats: ShardStats) -> ShardDone:
        return cls(
            index,
            stats.shard,
            stats.images,
            stats.items,
            stats.count,
            stats.counts(),
            dict(stats.seconds),
            stats.node,
            stats.input,
            dict(stats.inputs),
            stats.config,
        )


@dataclass
class ShardMaker:
    """Make one shard from its task: read, plan, process in batches, write.

    ``process`` runs the steps on one batch of jobs (a :class:`~counterfactual.synth.staging.Chain`
    in process; on Ray the CPU steps here and the model steps on their actors), of
    ``batch_size`` jobs (:attr:`Runtime.batch_size`). ``on_batch(items)`` is called after each
    batch (progress).
    """

    config: SynthConfig
    out_dir: fs.PathLike
    process: Process
    node: str = ""
    on_batch: Callable[[int], None] | None = None
    batch_size: int = Runtime().batch_size

    def __call__(self, task: ShardTask) -> ShardDone:
        rows = task.rows if task.piece is None else tuple(_read_piece(task.piece))
        records = [r for r in rows if isinstance(r, ImageRecord)]
        writer = ShardWriter(
            self.out_dir,
            task.index,
            input=task.input,
            node=self.node,
            run=task.run,
            config=task.config,
            inputs=dict(task.inputs),
        )
        writer.images = len(rows)
        for row in rows:
            if isinstance(row, Status):
                writer.add(None, row, item=False)
        not_drawn: list[Status] = []
        jobs: list[Job] = []
        for planned in plan(records, self.config, not_drawn=not_drawn, stats=task.stats):
            if isinstance(planned, Status):
                writer.add(None, planned, item=False)
                continue
            jobs.extend(Job(task.index, len(jobs), item, exif=task.exif) for item in planned)
        for row in not_drawn:
            writer.add(None, row, item=False)
        try:
            for batch in batched(jobs, self.batch_size):
                for job in self.process(batch):
                    done = job.done()
                    writer.add(done.sample, done.status, done.seconds)
                if self.on_batch is not None:
                    self.on_batch(len(batch))
        except BaseException:
            writer.abort()
            raise
        return ShardDone.of(task.index, writer.commit())


def _read_piece(piece: InputPiece) -> Iterator[ImageRecord | Status]:
    from counterfactual.readers.corpus import read_piece

    return read_piece(piece)
