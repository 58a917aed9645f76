"""``counterfactual report``: index the run, draw a stratified sample, find the originals, render
the rows, then write ``sheet-XX.png``, the thumbnails and ``index.html`` into the report
folder."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from counterfactual import fs
from counterfactual.imageio import DEFAULT_MAX_PIXELS
from counterfactual.outdir import OutKind, real_folder, without_links
from counterfactual.reasons import no_samples_line
from counterfactual.records import ImageRecord
from counterfactual.report.index import DEFAULT_N, RunIndex, SampleRef, read_run, stratify
from counterfactual.report.originals import Originals, dataset_roots
from counterfactual.report.page import page
from counterfactual.report.sheets import ROWS_PER_SHEET, draw_sheet, render_row, write_png

REPORT_DIR = "report"
_TEMP = r"(?:\.[0-9a-f]{12}\.tmp)?"
_OURS = re.compile(
    r"^(sheet-\d+\.png|\d{3,}-[A-Za-z0-9_-]+-(original|mask|edited|full)\.(jpg|png))$"
)
"""Files an earlier report wrote: removed before writing (nothing else in the folder is)."""
REPORT_NAMES = re.compile(rf"(?:index\.html|sheet-\d+\.png|samples){_TEMP}")
"""Every name a report writes in its folder (temporary names included)."""
_SAMPLE_NAMES = re.compile(
    rf"\d{{3,}}-[A-Za-z0-9_-]+-(?:original|mask|edited|full)\.(?:jpg|png){_TEMP}"
)
_TITLE = "<title>counterfactual report:"


def is_report(folder: Path) -> bool:
    """Whether ``folder`` holds a report, by content: an ``index.html`` (a file, not a link)
    that :func:`~counterfactual.report.page.page` wrote, or, of a report cut short before it,
    only PNG sheets and a ``samples`` folder of its pictures."""
    index = folder / "index.html"
    if not index.is_symlink() and index.is_file():
        return _TITLE.encode() in _head(index, 4096)
    entries = list(folder.iterdir())
    return bool(entries) and all(_cut_short(p) for p in entries)


def _cut_short(path: Path) -> bool:
    """Whether ``path`` is what a report writes before its ``index.html``."""
    if path.is_symlink():
        return False
    if path.name == "samples" and path.is_dir():
        return all(_SAMPLE_NAMES.fullmatch(p.name) for p in path.iterdir())
    return bool(_OURS.match(path.name)) and _head(path, 8) == b"\x89PNG\r\n\x1a\n"


def _head(path: Path, n: int) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


REPORT_OUT = OutKind("a report", REPORT_NAMES, is_report)
"""What ``report --out`` holds (:func:`~counterfactual.outdir.claim_out`)."""


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`write_report` wrote: the page, the sheets and the samples shown."""

    index: Path
    sheets: tuple[Path, ...]
    shown: tuple[SampleRef, ...]
    missing_originals: int
    empty: str | None = None
    """Why the run holds no samples (:func:`~counterfactual.report.lines.no_samples_line`),
    ``None`` when it holds some."""


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
    (:func:`dataset_roots`); a sample whose original is not found is shown edited only.
    Nothing is written or deleted through a link: a link at ``out_dir/report``, at
    ``samples`` or at a name the report writes is removed first (the caller claims a
    ``report_dir`` it was handed: :data:`REPORT_OUT`)."""
    run = read_run(out_dir)
    if report_dir is None:  # inside the run: a link there is not ours and is replaced
        report_dir = real_folder(Path(out_dir) / REPORT_DIR)
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    without_links(report_dir, REPORT_NAMES)  # nothing written or deleted through a link
    samples = real_folder(report_dir / "samples")
    without_links(samples, _SAMPLE_NAMES)
    for old in [*report_dir.glob("sheet-*.png"), *samples.iterdir()]:
        if _OURS.match(old.name) and old.is_file() and not old.is_symlink():
            old.unlink()
    config = run.manifest.get("config") or {}
    max_pixels = int(config.get("max_pixels") or DEFAULT_MAX_PIXELS)
    roots = dataset_roots(Path(out_dir), run.manifest, root)
    originals = Originals(roots, records, max_pixels)
    mask = config.get("mask") or {}
    shown = stratify(run.samples, n, seed) if run.samples else []
    rows = []
    for i, sample in enumerate(shown):
        meta = sample.load_meta()
        original = originals.load(meta)
        rows.append(render_row(i, sample, meta, sample.read_jpg(), original, mask))
    for row in rows:
        row.save(report_dir)
    sheets = []
    for k in range(math.ceil(len(rows) / ROWS_PER_SHEET)):
        chunk = rows[k * ROWS_PER_SHEET : (k + 1) * ROWS_PER_SHEET]
        sheets.append(Path(write_png(draw_sheet(chunk), report_dir / f"sheet-{k:02d}.png")))
    text = page(run, rows, [s.name for s in sheets], roots)
    index = report_dir / "index.html"
    fs.write_bytes(index, text.encode("utf-8", errors="replace"))
    missing = sum(r.original.image is None for r in rows)
    return Report(index, tuple(sheets), tuple(shown), missing, empty_reason(run))


def empty_reason(run: RunIndex) -> str | None:
    """Why ``run`` holds no samples, or ``None`` when it holds some."""
    if run.samples:
        return None
    unit = run.manifest.get("input_unit", "images")
    inputs = run.manifest.get("inputs", len({s.image_id for s in run.statuses}))
    return no_samples_line(run.counts(), inputs, unit)
