"""A visual audit of a synth run, for a person to judge it in a minute: ``report/index.html``
plus PNG contact sheets, all files linked relatively (no network, no scripts, copy the folder).

:func:`read_run` indexes a run folder: a compact :class:`SampleRef` per sample from its json in
the shards (class, methods, verdict, and where its JPEG and json lie, read again only for the few
samples shown), ``status.jsonl`` (the committed shards' stats files for an unfinished run) and
``manifest.json``. :func:`stratify` draws a seeded sample
spread over removed class x image method. :class:`Originals` finds each sample's original
picture as synth's contact sheet does (:func:`counterfactual.synth.load_record_image` on the
record; without the records, a record rebuilt from the sample's ``file`` under a dataset folder).
:func:`write_report` renders the page: run summary (counts by status and reason, methods,
config), a per-class table, the contact sheets (original with the removed boxes | mask from
``mask_boxes`` | edited | old caption with the removed phrases struck, new caption, verifier
scores when the sample json has ``"verify"``), a sample table with thumbnails and every failed
item with its reason.
"""

from __future__ import annotations

import functools
import html
import io
import json
import math
import os
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from counterfactual import fs
from counterfactual.imageio import DEFAULT_MAX_PIXELS, SampleError, resolve_inside
from counterfactual.jsonl import json_objects
from counterfactual.masks import box_mask, dilate
from counterfactual.readers.spec import DataSpec
from counterfactual.records import ImageRecord, Status
from counterfactual.run import MANIFEST_FILE, STATUS_FILE
from counterfactual.samples import (
    BAD_SHARD,
    SampleMeta,
    SampleRow,
    VerifyMeta,
    read_member,
    read_shard,
    shard_paths,
)
from counterfactual.shards import read_stats
from counterfactual.synth import box_scale, load_record_image

REPORT_DIR = "report"
_PARALLEL_SHARDS = 4
DEFAULT_N = 48
ROWS_PER_SHEET = 8
MAX_FAILURES_LISTED = 2000

_TILE = 256
_GAP = 10
_TEXT_W = 540
_LINE = 18
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127])
_OURS = re.compile(
    r"^(sheet-\d+\.png|\d{3,}-[A-Za-z0-9_-]+-(original|mask|edited|full)\.(jpg|png))$"
)


@dataclass(frozen=True, slots=True)
class SampleRef:
    """One written sample, compactly (a run may hold millions): its shard, where its JPEG and
    json lie in the tar (``(offset, size)``), and what the report counts and stratifies by. The
    whole json (keys as :func:`counterfactual.stages.sample_meta` writes them, maybe
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
        """The reference to a sample read by :func:`counterfactual.samples.read_shard`."""
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


def method_label(described: Any) -> str:
    """``"blur"``, ``"inpaint:opencv"``, ... from a step's ``describe()`` dict in a sample json."""
    if not isinstance(described, dict):
        return "?" if described is None else str(described)
    method = str(described.get("method", "?"))
    return f"{method}:{described['backend']}" if described.get("backend") else method


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


@dataclass(frozen=True, slots=True)
class Original:
    """A sample's original picture (RGB ``uint8``, ``None`` when not found), its removed boxes
    (``xywh`` in the pixels of ``image``) and, when not found, why."""

    image: np.ndarray | None
    boxes: tuple[tuple[float, float, float, float], ...]
    note: str = ""


class Originals:
    """Finds a sample's original picture. With ``records`` (image id -> record, as synth has
    them) exactly as :func:`counterfactual.contact_sheet.sheet_rows` does; else a corpus
    sample's from inside its tar or table (the absolute path its json records), any other from
    the sample's ``file`` under the first of ``roots`` that holds it, with the edited picture's
    size as the annotated size (the boxes are then drawn unscaled)."""

    def __init__(
        self,
        roots: Sequence[Path] = (),
        records: Mapping[str, ImageRecord] | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.roots = [Path(r) for r in roots]
        self.records = records
        self.max_pixels = max_pixels

    def load(self, meta: SampleMeta) -> Original:
        boxes = tuple((float(x), float(y), float(w), float(h)) for x, y, w, h in meta.mask_boxes)
        record = self._record(meta)
        if record is None:
            if not self.roots:
                return Original(None, boxes, "original not found: no dataset folder (--root)")
            where = ", ".join(str(r) for r in self.roots)
            return Original(None, boxes, f"original not found: {meta.file} in {where}")
        try:
            image = load_record_image(record, self.max_pixels)
        except SampleError as err:
            return Original(None, boxes, f"original not loaded: {err.reason} {err.detail}".strip())
        # Boxes are in annotation pixels; scale to the decoded picture if they differ.
        sx, sy = box_scale(record, image)
        return Original(image, tuple((x * sx, y * sy, w * sx, h * sy) for x, y, w, h in boxes))

    def _record(self, meta: SampleMeta) -> ImageRecord | None:
        image_id = meta.image_id
        if self.records is not None:
            return self.records.get(image_id)
        file = meta.file
        if meta.source is not None:  # inside a tar or Parquet file of a corpus
            return meta.source_record()
        width, height = meta.width, meta.height
        if not file or width < 1 or height < 1:
            return None
        for root in self.roots:
            try:
                if not resolve_inside(root, file).is_file():
                    continue
            except SampleError:
                return None  # a file name leaving the root is never read
            return ImageRecord(image_id, file, width, height, (), (), root=root)
        return None


def dataset_roots(
    out_dir: Path, manifest: Mapping[str, Any], root: Path | None = None
) -> list[Path]:
    """Folders a sample's ``file`` may be relative to, most likely first, existing ones only:
    ``root`` (and its ``images``/``train2017``/``val2017``/``flickr30k-images``) when given, else
    the data spec the run recorded (``images``, ``root``; a corpus's ``images`` or its tables'
    folders; the demo's ``OUT/demo-data``).

    A run records absolute paths (:meth:`DataSpec.absolute`), found from any working
    directory. A relative path (in an older manifest) is looked for under the working
    directory, then under each folder that holds ``out_dir``, nearest first: the run was made
    from one of them when its ``--out`` was relative too."""
    subdirs = ("images", "train2017", "val2017", "flickr30k-images")
    candidates: list[Path] = []
    if root is not None:
        candidates += [Path(root), *(Path(root) / s for s in subdirs)]
    else:
        data = manifest.get("data")
        spec = DataSpec.from_dict(data) if isinstance(data, dict) else None
        if spec is not None:
            bases = [Path.cwd(), *Path(out_dir).absolute().parents]
            for anchored in dict.fromkeys(spec.absolute(base) for base in bases):
                candidates += _spec_folders(anchored)
        candidates.append(Path(out_dir) / "demo-data" / "images")
    return list(dict.fromkeys(c for c in candidates if c.is_dir()))


def _spec_folders(spec: DataSpec) -> list[Path]:
    """The local folders ``spec`` names that sample file names may be relative to."""
    out: list[Path] = []
    if spec.images and not fs.is_url(spec.images):
        out.append(Path(spec.images))
    if not spec.root or fs.is_url(spec.root):
        return out
    if not spec.corpus:
        base = Path(spec.root)
        return [*out, base / spec.coco_set, base / "images", base / "flickr30k-images"]
    if spec.kind != "wds" and not spec.images:  # a table's path cells: relative to its folder
        from counterfactual.readers.corpus import expand_pattern

        try:
            tables = expand_pattern(spec.root, spec.kind)
        except ValueError:  # no table left where the run found them
            return out
        out += [Path(t).parent for t in tables if not isinstance(t, str)]
    return out


def caption_segments(caption: str, removed_phrases: Iterable[str]) -> list[tuple[str, bool]]:
    """``caption`` cut into ``(text, removed)`` pieces: each removed phrase is marked where it
    first occurs after the previous one (case-insensitive), the rest in between unmarked."""
    spans: list[tuple[int, int]] = []
    lower, start = caption.lower(), 0
    for phrase in removed_phrases:
        phrase = str(phrase).strip()
        if not phrase:
            continue
        at = lower.find(phrase.lower(), start)
        if at < 0:
            at = lower.find(phrase.lower())
            if at < 0 or any(a < at + len(phrase) and at < b for a, b in spans):
                continue
        spans.append((at, at + len(phrase)))
        start = at + len(phrase)
    out: list[tuple[str, bool]] = []
    pos = 0
    for a, b in sorted(spans):
        if a > pos:
            out.append((caption[pos:a], False))
        out.append((caption[a:b], True))
        pos = b
    if pos < len(caption):
        out.append((caption[pos:], False))
    return out


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`write_report` wrote: the page, the sheets and the samples shown."""

    index: Path
    sheets: tuple[Path, ...]
    shown: tuple[SampleRef, ...]
    missing_originals: int


def write_report(
    out_dir: Path,
    report_dir: Path | None = None,
    *,
    n: int = DEFAULT_N,
    seed: int = 0,
    root: Path | None = None,
    records: Mapping[str, ImageRecord] | None = None,
) -> Report:
    """Write the report of the run in ``out_dir`` into ``report_dir`` (default
    ``out_dir/report``): ``index.html``, ``sheet-XX.png`` and ``samples/`` thumbnails. Originals
    come from ``records`` when given, else from ``root`` or the folders the run's command names
    (:func:`dataset_roots`); a sample whose original is not found is shown edited only."""
    run = read_run(out_dir)
    report_dir = Path(report_dir) if report_dir is not None else Path(out_dir) / REPORT_DIR
    (report_dir / "samples").mkdir(parents=True, exist_ok=True)
    for old in [*report_dir.glob("sheet-*.png"), *(report_dir / "samples").iterdir()]:
        if _OURS.match(old.name) and old.is_file():
            old.unlink()
    max_pixels = int((run.manifest.get("config") or {}).get("max_pixels") or DEFAULT_MAX_PIXELS)
    roots = dataset_roots(Path(out_dir), run.manifest, root)
    originals = Originals(roots, records, max_pixels)
    shown = stratify(run.samples, n, seed) if run.samples else []
    rows = []
    for i, sample in enumerate(shown):
        meta = sample.load_meta()
        rows.append(_render_row(i, sample, meta, originals.load(meta), run.manifest))
    for row in rows:
        row.save(report_dir)
    sheets = []
    for k in range(math.ceil(len(rows) / ROWS_PER_SHEET)):
        chunk = rows[k * ROWS_PER_SHEET : (k + 1) * ROWS_PER_SHEET]
        sheet = report_dir / f"sheet-{k:02d}.png"
        _sheet(chunk).save(sheet, compress_level=3)
        sheets.append(sheet)
    page = _page(run, rows, [s.name for s in sheets], roots)
    tmp = report_dir / "index.html.tmp"
    tmp.write_text(page, encoding="utf-8", errors="replace")
    index = tmp.replace(report_dir / "index.html")
    missing = sum(r.original.image is None for r in rows)
    return Report(index, tuple(sheets), tuple(shown), missing)


# --- pictures -------------------------------------------------------------------------------


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


@dataclass
class _Row:
    index: int
    sample: SampleRef
    meta: SampleMeta
    original: Original
    tiles: tuple[Image.Image, Image.Image, Image.Image]
    full: bytes | None
    stem: str

    def files(self) -> dict[str, str]:
        names = {"mask": f"{self.stem}-mask.png", "edited": f"{self.stem}-edited.jpg"}
        if self.original.image is not None:
            names["original"] = f"{self.stem}-original.jpg"
        if self.full is not None:
            names["full"] = f"{self.stem}-full.jpg"
        return {k: f"samples/{v}" for k, v in names.items()}

    def save(self, report_dir: Path) -> None:
        files = self.files()
        if "original" in files:
            self.tiles[0].save(report_dir / files["original"], quality=88)
        self.tiles[1].save(report_dir / files["mask"])
        self.tiles[2].save(report_dir / files["edited"], quality=88)
        if self.full is not None:
            (report_dir / files["full"]).write_bytes(self.full)


def _render_row(
    index: int, sample: SampleRef, meta: SampleMeta, original: Original, manifest: Mapping
) -> _Row:
    jpg = sample.read_jpg()
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
    mask_cfg = (manifest.get("config") or {}).get("mask") or {}
    if mask_cfg.get("source", "box") == "box":
        mask = dilate(mask, int(mask_cfg.get("dilate") or 0))
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
    return _Row(index, sample, meta, original, (orig_tile, mask_tile, _fit(edited)), jpg, stem)


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


def _text_runs(row: _Row) -> list[list[tuple[str, str]]]:
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
        paras += [[(line, style)] for line, style in _verify_lines(m.verify)]
    return paras


def _verify_lines(v: VerifyMeta) -> list[tuple[str, str]]:
    """Short lines summarising a sample's verdict, each with its style."""
    head = "verify: " + ("PASS" if v.passed else "FAIL")
    lines = [(f"{head}  model={v.model}, k={v.k}", "ok" if v.passed else "bad")]
    if v.failed:
        lines.append(("failed: " + "; ".join(v.failed), "bad"))
    for cls, r in v.removal.items():
        lines.append(
            (
                f"removed {cls}: rank {r.rank_before} -> {r.rank_after}, "
                f"p {_num(r.prob_before)} -> {_num(r.prob_after)}"
                + ("  ok" if r.removed else "  STILL SEEN"),
                "plain" if r.removed else "bad",
            )
        )
    for cls, k in v.retention.items():
        lines.append(
            (
                f"kept {cls}: rank {k.rank}, p {_num(k.prob)}" + ("  ok" if k.kept else "  LOST"),
                "plain" if k.kept else "bad",
            )
        )
    if v.text is not None:
        lines.append(("text: " + _compact(v.text.to_dict()), "muted"))
    return lines


def _num(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else "?" if x is None else str(x)


def _compact(d: Mapping[str, Any], limit: int = 160) -> str:
    text = ", ".join(
        f"{k}={_num(v) if isinstance(v, float | int | type(None)) else json.dumps(v, ensure_ascii=False)}"
        for k, v in d.items()
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sheet(rows: Sequence[_Row]) -> Image.Image:
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


# --- the page -------------------------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
margin:0;color:#1d232a;background:#f5f6f8}
main{max-width:1360px;margin:0 auto;padding:20px 28px 60px}
h1{font-size:22px;margin:0 0 2px}h2{font-size:17px;margin:30px 0 10px;padding-bottom:4px;
border-bottom:1px solid #dfe3e8}
nav a{margin-right:14px;color:#3358d4;text-decoration:none}
.sub{color:#6b7280;margin:0 0 12px;word-break:break-all}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #e3e6ea;border-radius:8px;padding:8px 14px;min-width:96px}
.card b{display:block;font-size:21px}.card span{color:#6b7280;font-size:12px}
table{border-collapse:collapse;background:#fff;width:100%;border:1px solid #e3e6ea}
th,td{border-bottom:1px solid #eceef1;padding:5px 9px;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600;font-size:13px}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
del{color:#c62828;text-decoration-thickness:2px}.muted{color:#6b7280}
.pass{color:#1b7f3b;font-weight:600}.fail{color:#c62828;font-weight:600}
.written{color:#1b7f3b}.failed{color:#c62828}.skipped{color:#8a6d00}
.bar{display:inline-block;height:9px;border-radius:2px;background:#7c95f0;vertical-align:middle}
#samples td.cap{min-width:260px}#samples td.plan{min-width:120px;max-width:170px;
overflow-wrap:anywhere}#samples td.vf{min-width:190px}.wide{overflow-x:auto}
.thumbs{white-space:nowrap}.thumbs img{max-height:96px;max-width:120px;margin-right:4px;border-radius:3px;
border:1px solid #e3e6ea;vertical-align:top}
.nothumb{display:inline-block;width:128px;height:96px;margin-right:4px;background:#e9ebef;
color:#6b7280;font-size:11px;padding:6px;box-sizing:border-box;vertical-align:top;
border-radius:3px;white-space:normal}
figure{margin:0 0 18px}figure img{max-width:100%;border:1px solid #e3e6ea;background:#fff}
figcaption{color:#6b7280;font-size:12px}
.note{background:#fff8e1;border:1px solid #f0d27a;padding:8px 12px;border-radius:6px;margin:6px 0}
pre{background:#fff;border:1px solid #e3e6ea;padding:10px;overflow:auto;font-size:12px}
.cap p{margin:0 0 3px}.verify{font-size:12px}.verify td{padding:1px 4px;border:0}
.small{font-size:12px}
"""


def _e(value: Any) -> str:
    """Text for HTML: control characters dropped, ``<>&"'`` escaped."""
    return html.escape(str(value).translate(_CONTROL), quote=True)


def _table(head: Sequence[str], rows: Iterable[str], id_: str, numeric: Iterable[int] = ()) -> str:
    nums = set(numeric)
    ths = "".join(f"<th{' class=n' if i in nums else ''}>{_e(h)}</th>" for i, h in enumerate(head))
    return f'<table id="{id_}"><thead><tr>{ths}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _page(run: RunIndex, rows: Sequence[_Row], sheets: Sequence[str], roots: Sequence[Path]) -> str:
    m = run.manifest
    counts = Counter(s.status for s in run.statuses)
    samples_v = [s for s in run.samples if s.verified is not None]
    passed_v = sum(bool(s.verified) for s in samples_v)
    unit = m.get("input_unit", "images")
    inputs = m.get("inputs", m.get("images", len({s.image_id for s in run.statuses})))
    rows_text = ", ".join(f"{counts.get(k, 0):,} {k}" for k in ("written", "skipped", "failed"))
    cards = [  # what each counts: inputs, image x caption items, samples, status rows
        (f"input {unit}", inputs),
        ("items", m.get("items", "?")),
        ("samples", m.get("samples", counts.get("written", 0))),
        ("shards", m.get("shards", len({s.shard for s in run.samples}))),
        (f"status rows ({rows_text})", len(run.statuses)),
        ("samples shown here", len(rows)),
    ]
    if samples_v:
        cards.append(("verify pass", f"{passed_v}/{len(samples_v)}"))
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width,initial-scale=1">',
        f"<title>counterfactual report: {_e(run.out_dir.name)}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>Run report: {_e(run.out_dir.name)}</h1>",
        f'<p class="sub">{_e(run.out_dir.resolve())}</p>',
        '<nav><a href="#summary">Summary</a><a href="#classes">Classes</a>'
        '<a href="#sheets">Contact sheets</a><a href="#samples">Samples</a>'
        '<a href="#failures">Failures</a><a href="#config">Config</a></nav>',
        '<div class="cards" id="cards">'
        + "".join(
            f'<div class="card" data-name="{_e(k)}"><b>{_e(v)}</b><span>{_e(k)}</span></div>'
            for k, v in cards
        )
        + "</div>",
    ]
    parts += [f'<p class="note">{_e(n)}</p>' for n in run.notes]
    if ((m.get("config") or {}).get("mask") or {}).get("source", "box") != "box":
        parts.append(
            '<p class="note">This run painted segmentation masks; the masks shown are the '
            "removed boxes (mask_boxes), which contain them.</p>"
        )
    note = _originals_note(rows, roots)
    if note:
        parts.append(f'<p class="note" id="originals-note">{_e(note)}</p>')
    parts.append(_summary(run, rows, samples_v))
    parts.append(_classes(run, rows))
    parts.append('<h2 id="sheets">Contact sheets</h2>')
    if not sheets:
        parts.append('<p class="muted">No samples were written.</p>')
    for k, name in enumerate(sheets):
        first, last = k * ROWS_PER_SHEET, min(len(rows), (k + 1) * ROWS_PER_SHEET) - 1
        parts.append(
            f'<figure><a href="{_e(name)}"><img src="{_e(name)}" loading="lazy" '
            f'alt="contact sheet {k}"></a><figcaption>{_e(name)}: samples #{first}-#{last}'
            "</figcaption></figure>"
        )
    parts.append(_samples(rows))
    parts.append(_failures(run))
    config = json.dumps(m.get("config", {}), indent=1, ensure_ascii=False, default=str)
    meta = {k: m[k] for k in ("runner", "started", "seconds", "git_revision", "python") if k in m}
    parts += [
        '<h2 id="config">Config</h2>',
        f"<p class=small>{_e(', '.join(f'{k}: {v}' for k, v in meta.items()))}</p>",
        f"<details><summary>config</summary><pre>{_e(config)}</pre></details>",
        f"<details><summary>package versions</summary><pre>"
        f"{_e(json.dumps(m.get('versions', {}), indent=1))}</pre></details>",
        f"<details><summary>originals searched in</summary><pre>"
        f"{_e(chr(10).join(_searched(rows, roots)) or '(none)')}</pre></details>",
        "</main></body></html>",
    ]
    return "\n".join(parts) + "\n"


def _searched(rows: Sequence[_Row], roots: Sequence[Path]) -> list[str]:
    """Where the originals were looked for: the folders, and the corpus files read."""
    files = dict.fromkeys(str(r.meta.source.path) for r in rows if r.meta.source is not None)
    return [*(str(r) for r in roots), *(f"{f} (inside)" for f in files)]


def _originals_note(rows: Sequence[_Row], roots: Sequence[Path]) -> str:
    """What the page says when some originals shown are missing (empty when none is): a
    sample whose original lies in a dataset folder needs one (``--root``); a corpus sample's
    lies inside its tar or table, read from the path its json records."""
    missing = [r for r in rows if r.original.image is None]
    if not missing:
        return ""
    text = f"{len(missing)} of {len(rows)} originals shown not found or not loaded"
    by_file = [r for r in missing if r.meta.source is None]
    if by_file and not roots:
        return (
            f"{text}: no dataset folder found for the originals; rerun with --root (the folder "
            "the samples' file names are relative to)."
        )
    hint = "; rerun with --root if the dataset folder moved" if by_file else ""
    return f"{text}, e.g. {missing[0].meta.key}: {missing[0].original.note}{hint}."


def _summary(run: RunIndex, rows: Sequence[_Row], samples_v: Sequence[SampleRef]) -> str:
    total = max(1, len(run.statuses))
    body = []
    for key, count in run.counts().items():
        status, _, reason = key.partition(":")
        bar = f'<span class="bar" style="width:{max(1, round(120 * count / total))}px"></span>'
        body.append(
            f'<tr data-status="{_e(status)}" data-reason="{_e(reason)}">'
            f'<td class="{_e(status)}">{_e(status)}</td><td>{_e(reason or "-")}</td>'
            f'<td class="n">{count}</td><td class="n">{100 * count / total:.1f}%</td>'
            f"<td>{bar}</td></tr>"
        )
    out = [
        '<h2 id="summary">Summary</h2>',
        "<p class=muted>status.jsonl has a row for every input that yields no item, every "
        "plan the policy did not draw and every item (image x caption), so it has more rows "
        "than inputs; the shares below are of its rows.</p>",
        _table(("status", "reason", "rows", "share", ""), body, "counts", (2, 3)),
    ]
    cfg = run.manifest.get("config") or {}
    image_m = Counter(s.method for s in run.samples)
    text_m = Counter(s.text_method for s in run.samples)
    sel = cfg.get("selection") or {}
    facts = [
        ("image methods", ", ".join(f"{k} ({v})" for k, v in image_m.most_common()) or "-"),
        ("text methods", ", ".join(f"{k} ({v})" for k, v in text_m.most_common()) or "-"),
        (
            "selection",
            ", ".join(f"{k}={sel[k]}" for k in ("alpha1", "alpha2", "alpha3", "policy") if k in sel)
            or "-",
        ),
        ("mask", ", ".join(f"{k}={v}" for k, v in (cfg.get("mask") or {}).items()) or "-"),
        ("captions / seed", f"{cfg.get('captions', '?')} / {cfg.get('seed', '?')}"),
    ]
    if isinstance(run.manifest.get("verify"), dict):
        facts.append(("verify (manifest)", _compact(run.manifest["verify"], 400)))
    if samples_v:
        reasons = Counter(r for s in samples_v for r in s.verify_failed)
        facts.append(
            (
                "verify failures",
                ", ".join(f"{k} ({v})" for k, v in reasons.most_common()) or "none",
            )
        )
    out.append(
        '<table id="facts" style="margin-top:10px">'
        + "".join(
            f'<tr><th style="width:180px">{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in facts
        )
        + "</table>"
    )
    return "\n".join(out)


def _classes(run: RunIndex, rows: Sequence[_Row]) -> str:
    written: Counter[str] = Counter()
    not_drawn: Counter[str] = Counter()
    failed: dict[str, Counter[str]] = defaultdict(Counter)
    for s in run.statuses:
        if s.target is None:
            continue
        if s.status == "written":
            written[s.target] += 1
        elif s.status == "failed":
            failed[s.target][s.reason or "unknown"] += 1
        elif s.reason == "not-drawn":
            not_drawn[s.target] += 1
    shown = Counter(r.sample.target for r in rows)
    verify: dict[str, list[bool]] = defaultdict(list)
    for sample in run.samples:
        if sample.verified is not None:
            verify[sample.target].append(sample.verified)
    classes = sorted(
        set(written) | set(failed) | set(not_drawn) | {s.target for s in run.samples},
        key=lambda c: (-written[c], c),
    )
    body = []
    for c in classes:
        fails = failed.get(c, Counter())
        why = ", ".join(f"{r} ({k})" for r, k in fails.most_common())
        v = verify.get(c)
        rate = f"{sum(v)}/{len(v)} ({100 * sum(v) / len(v):.0f}%)" if v else "-"
        body.append(
            f'<tr data-class="{_e(c)}"><td>{_e(c)}</td><td class="n">{written[c]}</td>'
            f'<td class="n">{shown[c]}</td><td class="n">{sum(fails.values())}</td>'
            f'<td class="small">{_e(why or "-")}</td><td class="n">{not_drawn[c]}</td>'
            f'<td class="n">{_e(rate)}</td></tr>'
        )
    return "\n".join(
        [
            '<h2 id="classes">Per class (the class each plan was drawn for)</h2>',
            _table(
                ("class", "written", "shown", "failed", "failures by reason", "not drawn",
                 "verify passed"),
                body,
                "classes",
                (1, 2, 3, 5, 6),
            ),
        ]
    )  # fmt: skip


def _samples(rows: Sequence[_Row]) -> str:
    body = []
    for row in rows:
        s, m, files = row.sample, row.meta, row.files()
        if "original" in files:
            orig = f'<img src="{_e(files["original"])}" alt="original" loading="lazy">'
        else:
            orig = f'<span class="nothumb">{_e(row.original.note)}</span>'
        edited = f'<img src="{_e(files["edited"])}" alt="edited" loading="lazy">'
        if "full" in files:
            edited = f'<a href="{_e(files["full"])}">{edited}</a>'
        thumbs = f'{orig}<img src="{_e(files["mask"])}" alt="mask" loading="lazy">{edited}'
        before = "".join(
            f"<del>{_e(t)}</del>" if r else _e(t)
            for t, r in caption_segments(m.original_caption, m.removed_phrases)
        )
        cap = (
            f'<div class="cap"><p><span class="muted">before:</span> {before}</p>'
            f'<p><span class="muted">after:</span> {_e(m.caption)}</p>'
            f'<p class="muted small">removed phrases: '
            f"{_e(', '.join(m.removed_phrases) or '-')}</p></div>"
        )
        what = (
            f"<b>{_e(s.target)}</b><br><span class=small>removed: {_e(', '.join(s.removed))}"
            f"<br>kept: {_e(', '.join(m.plan.kept) or '-')}<br>{_e(s.method)} / "
            f"{_e(method_label(m.text_method))}<br>{_e(s.key)}<br>"
            f"{_e(fs.name(s.shard))}</span>"
        )
        body.append(
            f'<tr data-key="{_e(s.key)}" data-class="{_e(s.target)}"><td class="n">{row.index}'
            f'</td><td class="thumbs">{thumbs}</td><td class="plan">{what}</td>'
            f'<td class="cap">{cap}</td><td class="vf">{_verify_html(m.verify)}</td></tr>'
        )
    return "\n".join(
        [
            '<h2 id="samples">Samples shown (stratified by class x image method)</h2>',
            "<p class=muted>original with the removed boxes | mask | edited (click for the "
            "picture as stored in the shard)</p>",
            '<div class="wide">',
            _table(("#", "original | mask | edited", "plan", "captions", "verify"), body,
                   "samples"),
            "</div>",
        ]
    )  # fmt: skip


def _verify_html(v: VerifyMeta | None) -> str:
    if v is None:
        return '<span class="muted">-</span>'
    verdict = "pass" if v.passed else "fail"
    out = [f'<div class="verify"><span class="{verdict}">{verdict}</span>']
    out.append(f' <span class="muted">{_e(f"model={v.model}, k={v.k}")}</span>')
    if v.failed:
        out.append(f'<div class="fail">{_e("; ".join(v.failed))}</div>')
    rows = []
    for cls, r in v.removal.items():
        ok = r.removed
        rows.append(
            f"<tr><td>removed {_e(cls)}</td><td>rank {_e(r.rank_before)}&rarr;"
            f"{_e(r.rank_after)}</td><td>p {_e(_num(r.prob_before))}&rarr;"
            f'{_e(_num(r.prob_after))}</td><td class="{"pass" if ok else "fail"}">'
            f"{'ok' if ok else 'still seen'}</td></tr>"
        )
    for cls, k in v.retention.items():
        ok = k.kept
        rows.append(
            f"<tr><td>kept {_e(cls)}</td><td>rank {_e(k.rank)}</td>"
            f'<td>p {_e(_num(k.prob))}</td><td class="{"pass" if ok else "fail"}">'
            f"{'ok' if ok else 'lost'}</td></tr>"
        )
    if rows:
        out.append(f"<table>{''.join(rows)}</table>")
    if v.text is not None:
        out.append(f'<div class="muted">text: {_e(_compact(v.text.to_dict(), 400))}</div>')
    return "".join(out) + "</div>"


def _failures(run: RunIndex) -> str:
    failed = [s for s in run.statuses if s.status == "failed"]
    body = [
        f'<tr data-reason="{_e(s.reason)}"><td>{_e(s.image_id)}</td><td>{_e(s.key or "-")}</td>'
        f'<td>{_e(s.target or "-")}</td><td class="failed">{_e(s.reason)}</td>'
        f'<td class="small">{_e(s.detail)}</td></tr>'
        for s in failed[:MAX_FAILURES_LISTED]
    ]
    out = [f'<h2 id="failures">Failures ({len(failed)}, no sample written)</h2>']
    if not failed:
        out.append('<p class="muted">None.</p>')
    else:
        out.append(_table(("image", "key", "class", "reason", "detail"), body, "failures"))
        if len(failed) > MAX_FAILURES_LISTED:
            out.append(
                f'<p class="note">{len(failed) - MAX_FAILURES_LISTED} more in status.jsonl.</p>'
            )
    return "\n".join(out)
