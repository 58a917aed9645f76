"""A before/after contact sheet: per row the original with the removed boxes outlined, the
edited picture, and the old and new caption underneath; built from a run's committed shards
(read with :func:`counterfactual.samples.iter_samples`)."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from counterfactual import fs
from counterfactual.imageio import SampleError
from counterfactual.records import ImageRecord
from counterfactual.samples import SampleMeta, iter_samples
from counterfactual.synth import box_scale, load_record_image

_TILE = 320
_GAP = 8


def _tile(image: np.ndarray, boxes: Sequence[Sequence[float]] = ()) -> Image.Image:
    im = Image.fromarray(image)
    scale = _TILE / max(im.size)
    im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))))
    if boxes:
        draw = ImageDraw.Draw(im)
        for x, y, w, h in boxes:
            draw.rectangle(
                [x * scale, y * scale, (x + w) * scale, (y + h) * scale],
                outline=(255, 40, 40),
                width=3,
            )
    return im


@dataclass(frozen=True, slots=True)
class SheetRow:
    """One example: ``original``/``edited`` are RGB ``uint8``; ``meta`` is the sample's json;
    ``boxes`` are the removed boxes (xywh) in the pixels of ``original``."""

    original: np.ndarray
    edited: np.ndarray
    boxes: tuple[tuple[float, float, float, float], ...]
    meta: SampleMeta


def sheet_rows(out_dir: str | Path, records: Mapping[str, ImageRecord], n: int) -> list[SheetRow]:
    """The first ``n`` samples of a run (a folder or URL) whose original picture still loads;
    ``ValueError`` on a sample that cannot be read."""
    rows: list[SheetRow] = []
    for sample in iter_samples(out_dir):
        if len(rows) >= n:
            break
        meta, jpg = sample.meta, sample.jpg
        record = records.get(meta.image_id)
        if record is None:  # a corpus picture: from its tar or table
            record = meta.source_record()
        if record is None or jpg is None:
            continue
        try:
            original = load_record_image(record, 1 << 40)
        except SampleError:
            continue
        # Boxes are in annotation pixels; scale to the decoded picture if they differ.
        sx, sy = box_scale(record, original)
        boxes = tuple((x * sx, y * sy, w * sx, h * sy) for x, y, w, h in meta.mask_boxes)
        edited = np.asarray(Image.open(io.BytesIO(jpg)).convert("RGB"))
        rows.append(SheetRow(original, edited, boxes, meta))
    return rows


def contact_sheet(examples: Sequence[SheetRow], path: fs.PathLike) -> str | Path:
    """Write a PNG (a local path or URL) with one row per example and return its path."""
    if not examples:
        raise ValueError("contact_sheet needs at least one example")
    font = ImageFont.load_default(size=14)
    rows = []
    for ex in examples:
        meta, plan = ex.meta, ex.meta.plan
        before, after = _tile(ex.original, ex.boxes), _tile(ex.edited)
        lines = [f"[{meta.image_id}] removed: {', '.join(plan.removed)} ({plan.kind})"]
        lines += textwrap.wrap(f"before: {meta.original_caption}", 80)[:2]
        lines += textwrap.wrap(f"after:  {meta.caption}", 80)[:2]
        rows.append((before, after, lines))
    width = 2 * _TILE + 3 * _GAP
    height = _GAP + sum(max(b.height, a.height) + 17 * len(t) + 2 * _GAP for b, a, t in rows)
    sheet = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    y = _GAP
    for before, after, lines in rows:
        sheet.paste(before, (_GAP, y))
        sheet.paste(after, (2 * _GAP + _TILE, y))
        y += max(before.height, after.height) + 4
        for line in lines:
            draw.text((_GAP, y), line, fill=(0, 0, 0), font=font)
            y += 17
        y += 2 * _GAP - 4
    path = fs.as_path(path)
    fs.makedirs(fs.parent(path))
    buffer = io.BytesIO()
    sheet.save(buffer, format="PNG")
    fs.write_bytes(path, buffer.getvalue())
    return path
