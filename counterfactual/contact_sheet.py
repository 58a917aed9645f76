"""A before/after contact sheet: per row the original with the removed boxes outlined, the
edited picture, and the old and new caption underneath."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from counterfactual.synth import Counterfactual

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


def contact_sheet(examples: Sequence[Counterfactual], path: Path) -> Path:
    """Write a PNG with one row per example and return its path."""
    if not examples:
        raise ValueError("contact_sheet needs at least one example")
    font = ImageFont.load_default(size=14)
    rows = []
    for cf in examples:
        item = cf.edited.item
        # Boxes are in annotation pixels; scale to the decoded picture if they differ.
        sx = cf.edited.original.shape[1] / item.record.width
        sy = cf.edited.original.shape[0] / item.record.height
        boxes = [(x * sx, y * sy, w * sx, h * sy) for x, y, w, h in item.plan.mask_boxes]
        before, after = _tile(cf.edited.original, boxes), _tile(cf.edited.image)
        lines = [
            f"[{item.record.image_id}] removed: {', '.join(item.plan.removed)} ({item.plan.kind})"
        ]
        lines += textwrap.wrap(f"before: {item.caption.text}", 80)[:2]
        lines += textwrap.wrap(f"after:  {cf.caption.text}", 80)[:2]
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(path)
    return path
