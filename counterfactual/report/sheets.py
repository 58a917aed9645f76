"""The one renderer of sheets: per sample a row of three tiles (the original with the removed
boxes outlined | the mask drawn from ``mask_boxes`` over a dimmed copy | the edited picture) and
a text column (key, classes, methods, the old caption with the removed phrases struck, the new
one, the verifier's lines when the sample json has ``verify``). The report draws its sampled rows
on ``sheet-XX.png``; synth's ``OUT/contact_sheet.png`` is the same sheet over the first samples
of a run (:func:`sheet_rows`, :func:`contact_sheet`)."""

from __future__ import annotations

import functools
import io
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from counterfactual import fs
from counterfactual.imageio import DEFAULT_MAX_PIXELS
from counterfactual.method.masks import box_mask, dilate
from counterfactual.records import ImageRecord
from counterfactual.report.index import SampleRef
from counterfactual.report.lines import VerdictLines, caption_segments, method_label, verdict_lines
from counterfactual.report.originals import Original, Originals
from counterfactual.shards.names import MANIFEST_FILE
from counterfactual.shards.samples import SampleMeta, iter_samples

ROWS_PER_SHEET = 8
"""Rows on one of the report's ``sheet-XX.png``."""

_TILE = 256
_GAP = 10
_TEXT_W = 540
_LINE = 18
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@functools.lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:  # wide Unicode coverage where installed; Pillow's own font otherwise
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size=size)


def _fit(image: Image.Image, side: int = _TILE) -> Image.Image:
    """``image`` scaled so that its longer side is ``side`` px (its width when it is wider)."""
    scale = side / max(image.size)
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    return image.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)


def _placeholder(width: int, height: int, text: str) -> Image.Image:
    scale = _TILE / max(width, height, 1)
    im = Image.new("RGB", (max(1, round(width * scale)), max(1, round(height * scale))), "#e9ebef")
    draw = ImageDraw.Draw(im)
    draw.rectangle([0, 0, im.width - 1, im.height - 1], outline="#b8bec8", width=2)
    font = _font(13)
    for j, line in enumerate(_wrap_plain(text, font, im.width - 16)[:6]):
        draw.text((8, 8 + 17 * j), line, fill="#6b7280", font=font)
    return im


def _wrap_plain(text: str, font: Any, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if line and font.getlength(trial) > width:
            lines.append(line)
            line = word
        else:
            line = trial
    return [*lines, line] if line else lines


@dataclass(frozen=True, slots=True)
class SheetRow:
    """One sample drawn: its ``index`` among those shown, its reference and json, its original,
    the three tiles (original | mask | edited, each at most ``_TILE`` px), the edited JPEG as
    stored in the shard (``full``; ``None`` when it has none) and the stem of its files."""

    index: int
    sample: SampleRef
    meta: SampleMeta
    original: Original
    tiles: tuple[Image.Image, Image.Image, Image.Image]
    full: bytes | None
    stem: str

    def files(self) -> dict[str, str]:
        """The row's pictures under a report folder, by kind (``original`` only when found,
        ``full`` only when stored)."""
        names = {"mask": f"{self.stem}-mask.png", "edited": f"{self.stem}-edited.jpg"}
        if self.original.image is not None:
            names["original"] = f"{self.stem}-original.jpg"
        if self.full is not None:
            names["full"] = f"{self.stem}-full.jpg"
        return {k: f"samples/{v}" for k, v in names.items()}

    def save(self, report_dir: Path) -> None:
        """Write the row's pictures (:meth:`files`) under ``report_dir``, each by a temporary
        name and a rename (a link at a name is replaced, not followed)."""
        files = self.files()
        if "original" in files:
            _save(self.tiles[0], report_dir / files["original"], "JPEG", quality=88)
        _save(self.tiles[1], report_dir / files["mask"], "PNG")
        _save(self.tiles[2], report_dir / files["edited"], "JPEG", quality=88)
        if self.full is not None:
            fs.write_bytes(report_dir / files["full"], self.full)


def render_row(
    index: int,
    sample: SampleRef,
    meta: SampleMeta,
    jpg: bytes | None,
    original: Original,
    mask_config: Mapping[str, Any],
) -> SheetRow:
    """The tiles of one sample: ``jpg`` is its edited picture as stored (a grey tile when absent
    or unreadable), ``mask_config`` the run's ``config.mask`` (a box mask is dilated as the run
    dilated it)."""
    edited: Image.Image | None = None
    if jpg is not None:
        try:
            edited = Image.open(io.BytesIO(jpg)).convert("RGB")
        except OSError:
            edited = None
    width = meta.width or (edited.width if edited else _TILE)
    height = meta.height or (edited.height if edited else _TILE)
    if edited is None:
        edited = Image.new("RGB", (width, height), "#e9ebef")
    if original.image is not None:
        base = Image.fromarray(original.image)
        boxes = original.boxes
    else:
        base = edited
        sx, sy = edited.width / width, edited.height / height
        boxes = tuple((x * sx, y * sy, w * sx, h * sy) for x, y, w, h in original.boxes)
    mask = box_mask(base.height, base.width, boxes)
    if mask_config.get("source", "box") == "box":
        mask = dilate(mask, int(mask_config.get("dilate") or 0))
    # the mask over a dimmed grey copy of the picture, composed at tile size
    small = _fit(base)
    inside = np.asarray(Image.fromarray(mask).resize(small.size, Image.Resampling.BILINEAR))
    inside = inside.astype(np.float32)[..., None] / 255
    grey = np.asarray(small.convert("L").convert("RGB"), dtype=np.float32)
    shown = inside * (0.85 * 255 + 0.15 * grey) + (1 - inside) * 0.3 * grey
    mask_tile = Image.fromarray(shown.astype(np.uint8))
    if original.image is not None:
        orig_tile = small
        scale = small.width / base.width
        draw = ImageDraw.Draw(orig_tile)
        for x, y, w, h in boxes:
            draw.rectangle(
                [x * scale, y * scale, (x + w) * scale, (y + h) * scale],
                outline=(255, 40, 40),
                width=3,
            )
    else:
        orig_tile = _placeholder(width, height, original.note)
    stem = f"{index:03d}-{_UNSAFE.sub('-', sample.key)[:80] or 'sample'}"
    tiles = (orig_tile, mask_tile, _fit(edited))
    return SheetRow(index, sample, meta, original, tiles, jpg, stem)


_INK = {
    "plain": (29, 35, 42),
    "struck": (198, 40, 40),
    "muted": (107, 114, 128),
    "ok": (27, 127, 59),
    "bad": (198, 40, 40),
}


def _rich(
    draw: ImageDraw.ImageDraw,
    xy: tuple[int, int],
    runs: Sequence[tuple[str, str]],
    font: Any,
    width: int,
    max_lines: int = 4,
) -> int:
    """Draw ``(text, style)`` runs word-wrapped into ``width`` px; return the height used."""
    x0, y = xy
    x, lines = x0, 1
    space = font.getlength(" ")
    for text, style in runs:
        for token in re.findall(r"\S+|\s+", text):
            if token.isspace():
                if x > x0:
                    if style == "struck":
                        draw.line([(x, y + 9), (x + space, y + 9)], fill=_INK[style], width=2)
                    x += space
                continue
            w = font.getlength(token)
            if x > x0 and x + w > x0 + width:
                if lines == max_lines:
                    draw.text((x, y), "…", fill=_INK["muted"], font=font)
                    return lines * _LINE
                x, y, lines = x0, y + _LINE, lines + 1
            draw.text((x, y), token, fill=_INK[style], font=font)
            if style == "struck":
                draw.line([(x, y + 9), (x + w, y + 9)], fill=_INK[style], width=2)
            x += w
    return lines * _LINE


def _text_runs(row: SheetRow) -> list[list[tuple[str, str]]]:
    """The paragraphs of a sheet row's text column."""
    m, s = row.meta, row.sample
    removed = ", ".join(s.removed) or "?"
    kept = ", ".join(m.plan.kept) or "-"
    paras = [
        [(f"#{row.index}  {s.key}", "muted")],
        [("removed: ", "muted"), (removed, "struck"), (f" · kept: {kept}", "muted")],
        [(f"image: {s.method} · text: {method_label(m.text_method)}", "muted")],
        [("before: ", "muted")]
        + [
            (t, "struck" if r else "plain")
            for t, r in caption_segments(m.original_caption, m.removed_phrases)
        ],
        [("after: ", "muted"), (m.caption, "plain")],
    ]
    if row.original.image is None:
        paras.append([(row.original.note, "bad")])
    if m.verify is not None:
        paras += [[(line, style)] for line, style in _verdict_runs(verdict_lines(m.verify))]
    return paras


def _verdict_runs(v: VerdictLines) -> list[tuple[str, str]]:
    """The verdict's lines on a sheet, each with its style."""
    lines = [
        (f"verify: {'PASS' if v.passed else 'FAIL'}  {v.settings}", "ok" if v.passed else "bad")
    ]
    if v.failed:
        lines.append(("failed: " + "; ".join(v.failed), "bad"))
    for c in v.checks:
        numbers = f"{c.label}: rank {' -> '.join(c.ranks)}, p {' -> '.join(c.probs)}"
        verdict = "  ok" if c.ok else f"  {c.problem.upper()}"
        lines.append((numbers + verdict, "plain" if c.ok else "bad"))
    if v.text is not None:
        lines.append((f"text: {v.text_summary(160)}", "muted"))
    return lines


def draw_sheet(rows: Sequence[SheetRow]) -> Image.Image:
    """One sheet: a header of column titles, then one band per row."""
    font, head = _font(14), _font(13)
    width = 3 * _TILE + 5 * _GAP + _TEXT_W
    scratch = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    heights = []
    for row in rows:
        text_h = sum(_rich(scratch, (0, 0), p, font, _TEXT_W) + 4 for p in _text_runs(row))
        heights.append(max(max(t.height for t in row.tiles), text_h) + 2 * _GAP)
    header = 28
    sheet = Image.new("RGB", (width, header + sum(heights) + _GAP), "white")
    draw = ImageDraw.Draw(sheet)
    titles = ("original (removed boxes)", "mask (from mask_boxes)", "edited", "captions")
    for j, title in enumerate(titles):
        draw.text((_GAP + j * (_TILE + _GAP), 8), title, fill=_INK["muted"], font=head)
    y = header
    for row, h in zip(rows, heights, strict=True):
        draw.line([(0, y), (width, y)], fill=(226, 229, 234), width=1)
        for j, tile in enumerate(row.tiles):
            sheet.paste(tile, (_GAP + j * (_TILE + _GAP), y + _GAP))
        ty, tx = y + _GAP, 4 * _GAP + 3 * _TILE
        for para in _text_runs(row):
            ty += _rich(draw, (tx, ty), para, font, _TEXT_W - _GAP) + 4
        y += h
    return sheet


def write_png(image: Image.Image, path: fs.PathLike) -> str | Path:
    """Write ``image`` as a PNG to a local path or URL; return the path."""
    path = fs.as_path(path)
    fs.makedirs(fs.parent(path))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=3)
    fs.write_bytes(path, buffer.getvalue())
    return path


def _save(image: Image.Image, path: Path, kind: str, **options: Any) -> None:
    """Write ``image`` as ``kind`` (``JPEG``, ``PNG``) to ``path`` atomically."""
    buffer = io.BytesIO()
    image.save(buffer, format=kind, **options)
    fs.write_bytes(path, buffer.getvalue())


def sheet_rows(out_dir: fs.PathLike, records: Mapping[str, ImageRecord], n: int) -> list[SheetRow]:
    """The first ``n`` samples of a run (a folder or URL) whose original picture loads (from
    ``records``, or a corpus's from inside its tar or table), drawn for a sheet; ``ValueError``
    on a sample that cannot be read."""
    manifest_path = fs.join(out_dir, MANIFEST_FILE)
    manifest = json.loads(fs.read_text(manifest_path)) if fs.exists(manifest_path) else {}
    config = manifest.get("config") or {}
    originals = Originals((), records, int(config.get("max_pixels") or DEFAULT_MAX_PIXELS))
    mask = config.get("mask") or {}
    rows: list[SheetRow] = []
    for sample in iter_samples(out_dir):
        if len(rows) >= n:
            break
        if sample.jpg is None:
            continue
        original = originals.load(sample.meta)
        if original.image is None:
            continue
        ref = SampleRef.from_row(sample)
        rows.append(render_row(len(rows), ref, sample.meta, sample.jpg, original, mask))
    return rows


def contact_sheet(rows: Sequence[SheetRow], path: fs.PathLike) -> str | Path:
    """Write ``rows`` as one sheet, a PNG at a local path or URL, and return its path."""
    if not rows:
        raise ValueError("contact_sheet needs at least one row")
    return write_png(draw_sheet(rows), path)


def run_contact_sheet(
    out_dir: fs.PathLike, records: Sequence[ImageRecord], n: int
) -> str | Path | None:
    """``OUT/contact_sheet.png`` of a finished synth run: its first ``n`` samples whose
    original picture is in ``records`` (:func:`sheet_rows`); its path, ``None`` when no sample
    could be drawn (nothing written)."""
    by_id = {r.image_id: r for r in records}
    found = sheet_rows(out_dir, by_id, n)
    return contact_sheet(found, fs.join(out_dir, "contact_sheet.png")) if found else None
