"""The synthesis steps as plain functions and the in-process runner that chains them.

``plan`` turns a record into work items (one per chosen plan and caption), ``edit`` erases,
``rewrite`` writes the new caption, ``to_sample`` packs a shard sample. The Ray pipeline in
``pipelines/`` wires the same callables into stages; :func:`run_local` runs them in this process.
Every input image ends as shard samples or a :class:`~counterfactual.records.Status` row.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from counterfactual import __version__
from counterfactual.image import EditRequest, ImageConfig, ImageEditor, make_editor
from counterfactual.imageio import (
    DEFAULT_MAX_PIXELS,
    SampleError,
    encode_jpeg,
    load_rgb,
    resolve_inside,
)
from counterfactual.masks import MaskConfig, plan_mask
from counterfactual.records import Caption, ImageRecord, Status
from counterfactual.selection import RemovalPlan, SelectionConfig, draw_index, select_many
from counterfactual.shards import Sample, ShardWriter, sample_key
from counterfactual.text import (
    RewriteRequest,
    RewriteResult,
    TextConfig,
    TextRewriter,
    make_rewriter,
)

CAPTION_CHOICES = ("one", "all")


@dataclass(frozen=True, slots=True)
class SynthConfig:
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    text: TextConfig = field(default_factory=TextConfig)
    captions: str = "one"
    """``one``: one caption per image, drawn with the seed (as the paper); ``all``: each."""
    seed: int = 0
    samples_per_shard: int = 1000
    max_pixels: int = DEFAULT_MAX_PIXELS
    jpeg_quality: int = 95
    batch_size: int = 16
    """Records handled together by the in-process runner."""

    def __post_init__(self) -> None:
        if self.captions not in CAPTION_CHOICES:
            raise ValueError(f"captions {self.captions!r} is not one of {CAPTION_CHOICES}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in [1, 100], got {self.jpeg_quality}")
        if self.batch_size < 1 or self.samples_per_shard < 1 or self.max_pixels < 1:
            raise ValueError("batch_size, samples_per_shard and max_pixels must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One counterfactual to make: a plan of a record with one of its captions."""

    record: ImageRecord
    plan: RemovalPlan
    caption: Caption
    key: str
    seed: int


@dataclass(frozen=True, slots=True)
class Edited:
    item: WorkItem
    original: np.ndarray
    mask: np.ndarray
    image: np.ndarray


@dataclass(frozen=True, slots=True)
class Counterfactual:
    """A finished counterfactual: the edited image and its new caption."""

    edited: Edited
    caption: RewriteResult


NO_CAPTION = Caption("none", "")


def item_seed(seed: int, key: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def plan(records: Sequence[ImageRecord], config: SynthConfig) -> list[list[WorkItem] | Status]:
    """Per record: its work items, or the status saying why there are none."""
    out: list[list[WorkItem] | Status] = []
    for record, selection in zip(records, select_many(records, config.selection), strict=True):
        if not selection.plans:
            out.append(Status(record.image_id, "skipped", selection.reason, ""))
            continue
        captions: Sequence[Caption] = record.captions
        if not captions:
            if config.text.method == "np-removal":
                out.append(Status(record.image_id, "failed", "no-caption", ""))
                continue
            captions = (NO_CAPTION,)
        elif config.captions == "one":
            pick = draw_index(config.seed, f"caption:{record.image_id}", len(captions))
            captions = (captions[pick],)
        items = []
        for p in selection.plans:
            for cap in captions:
                key = sample_key(record.image_id, p.target, cap.caption_id)
                items.append(WorkItem(record, p, cap, key, item_seed(config.seed, key)))
        out.append(items)
    return out


def load_record_image(record: ImageRecord, max_pixels: int) -> np.ndarray:
    """The record's picture, checked against its annotated size.

    A picture whose size differs but whose aspect ratio matches (within 1%) is used and boxes are
    scaled to it; any other size mismatch is a ``size-mismatch`` failure.
    """
    if record.root is None:
        raise SampleError("missing-file", f"record {record.image_id} has no root folder")
    image = load_rgb(resolve_inside(record.root, record.file), max_pixels)
    h, w = image.shape[:2]
    if (w, h) != (record.width, record.height):
        if abs(w / h - record.width / record.height) > 0.01 * record.width / record.height:
            raise SampleError(
                "size-mismatch", f"annotated {record.width}x{record.height}, decoded {w}x{h}"
            )
    return image


def edit(
    items: Sequence[WorkItem],
    images: Sequence[np.ndarray],
    editor: ImageEditor,
    config: SynthConfig,
) -> list[Edited]:
    """Erase each item's plan from its image (``images[i]`` belongs to ``items[i]``)."""
    masks = [
        plan_mask(it.record, it.plan, im.shape[0], im.shape[1], config.mask)
        for it, im in zip(items, images, strict=True)
    ]
    requests = [
        EditRequest(im, m, it.plan.removed, it.plan.kept, it.seed)
        for it, im, m in zip(items, images, masks, strict=True)
    ]
    outputs = editor(requests)
    return [
        Edited(it, im, m, out) for it, im, m, out in zip(items, images, masks, outputs, strict=True)
    ]


def rewrite(edited: Sequence[Edited], rewriter: TextRewriter) -> list[Counterfactual]:
    requests = [
        RewriteRequest(
            caption=e.item.caption.text,
            removed=e.item.plan.removed,
            kept=e.item.plan.kept,
            phrases=e.item.caption.phrases,
            image=e.image,
            seed=e.item.seed,
        )
        for e in edited
    ]
    return [Counterfactual(e, r) for e, r in zip(edited, rewriter(requests), strict=True)]


def sample_meta(
    cf: Counterfactual, editor_info: dict[str, Any], text_info: dict[str, Any], seed: int
) -> dict[str, Any]:
    """Everything needed to trace and reproduce a sample (SPEC 1.4)."""
    item = cf.edited.item
    return {
        "key": item.key,
        "dataset": item.record.dataset,
        "split": item.record.split,
        "image_id": item.record.image_id,
        "file": item.record.file,
        "width": int(cf.edited.image.shape[1]),
        "height": int(cf.edited.image.shape[0]),
        "caption_id": item.caption.caption_id,
        "original_caption": item.caption.text,
        "caption": cf.caption.text,
        "removed_phrases": list(cf.caption.removed_phrases),
        "plan": item.plan.to_dict(),
        "mask_boxes": [list(b) for b in item.plan.mask_boxes],
        "mask_pixels": int(np.count_nonzero(cf.edited.mask)),
        "image_method": editor_info,
        "text_method": text_info,
        "seed": seed,
        "sample_seed": item.seed,
        "counterfactual_version": __version__,
    }


def to_sample(
    cf: Counterfactual, editor_info: dict[str, Any], text_info: dict[str, Any], config: SynthConfig
) -> Sample:
    return Sample(
        key=cf.edited.item.key,
        jpg=encode_jpeg(cf.edited.image, config.jpeg_quality),
        txt=cf.caption.text or "",
        meta=sample_meta(cf, editor_info, text_info, config.seed),
    )


@dataclass
class RunResult:
    out_dir: Path
    statuses: list[Status]
    shards: list[str]
    seconds: float
    examples: list[Counterfactual] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(f"{s.status}:{s.reason}" if s.reason else s.status for s in self.statuses)
        return dict(sorted(c.items()))

    @property
    def written(self) -> int:
        return sum(s.status == "written" for s in self.statuses)


def _batches(records: Iterable[ImageRecord], size: int) -> Iterator[list[ImageRecord]]:
    batch: list[ImageRecord] = []
    for r in records:
        batch.append(r)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def process_batch(
    records: Sequence[ImageRecord],
    config: SynthConfig,
    editor: ImageEditor,
    rewriter: TextRewriter,
) -> tuple[list[Counterfactual], list[Status]]:
    """All steps for a batch of records: the finished counterfactuals (in record order) and the
    status of every record that yields none, plus failed items."""
    statuses: list[Status] = []
    items: list[WorkItem] = []
    images: list[np.ndarray] = []
    for record, planned in zip(records, plan(records, config), strict=True):
        if isinstance(planned, Status):
            statuses.append(planned)
            continue
        try:
            image = load_record_image(record, config.max_pixels)
        except SampleError as err:
            statuses.append(Status(record.image_id, "failed", err.reason, err.detail))
            continue
        items.extend(planned)
        images.extend([image] * len(planned))
    if not items:
        return [], statuses
    done = rewrite(edit(items, images, editor, config), rewriter)
    finished = []
    for cf in done:
        item = cf.edited.item
        if cf.caption.text is None:
            statuses.append(
                Status(
                    item.record.image_id,
                    "failed",
                    cf.caption.reason,
                    "",
                    item.key,
                    item.plan.target,
                )
            )
        else:
            finished.append(cf)
    return finished, statuses


def run_local(
    records: Iterable[ImageRecord],
    out_dir: Path,
    config: SynthConfig,
    editor: ImageEditor | None = None,
    rewriter: TextRewriter | None = None,
    keep_examples: int = 0,
    progress: Callable[[int, int], None] | None = None,
    failures: Sequence[Status] = (),
) -> RunResult:
    """Run every step in this process and write shards, ``status.jsonl`` and ``summary.json``
    into ``out_dir``. ``keep_examples`` counterfactuals are kept in memory for a contact sheet;
    ``failures`` (images the reader could not turn into records) join the status record.
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    editor = editor or make_editor(config.image)
    rewriter = rewriter or make_rewriter(config.text)
    editor_info, text_info = editor.describe(), rewriter.describe()
    statuses: list[Status] = list(failures)
    examples: list[Counterfactual] = []
    seen = len(failures)
    with ShardWriter(out_dir, config.samples_per_shard) as writer:
        for batch in _batches(records, config.batch_size):
            finished, batch_status = process_batch(batch, config, editor, rewriter)
            statuses.extend(batch_status)
            for cf in finished:
                item = cf.edited.item
                try:
                    writer.write(to_sample(cf, editor_info, text_info, config))
                except SampleError as err:
                    statuses.append(
                        Status(
                            item.record.image_id,
                            "failed",
                            err.reason,
                            err.detail,
                            item.key,
                            item.plan.target,
                        )
                    )
                    continue
                statuses.append(
                    Status(item.record.image_id, "written", None, "", item.key, item.plan.target)
                )
                if len(examples) < keep_examples:
                    examples.append(cf)
            seen += len(batch)
            if progress is not None:
                progress(seen, len(statuses))
    result = RunResult(out_dir, statuses, writer.written, time.perf_counter() - start, examples)
    write_status(out_dir / "status.jsonl", statuses)
    summary = {
        "images": seen,
        "samples": result.written,
        "shards": result.shards,
        "counts": result.counts(),
        "seconds": round(result.seconds, 3),
        "config": config.to_dict(),
        "image_method": editor_info,
        "text_method": text_info,
        "counterfactual_version": __version__,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return result


def write_status(path: Path, statuses: Iterable[Status]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for s in statuses:
            fh.write(json.dumps(asdict(s), ensure_ascii=False) + "\n")
