"""The report's HTML page: run summary (counts by status and reason, methods, config), a
per-class table, the sheets, a table of the samples shown with thumbnails and every failed item
with its reason; self-contained (relative links, no scripts, no network)."""

from __future__ import annotations

import html
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from counterfactual import fs
from counterfactual.method.verify import VerifyMeta
from counterfactual.reasons import no_samples_line
from counterfactual.report.index import RunIndex, SampleRef
from counterfactual.report.lines import (
    caption_segments,
    compact,
    method_label,
    verdict_lines,
)
from counterfactual.report.sheets import ROWS_PER_SHEET, SheetRow

MAX_FAILURES_LISTED = 2000
_CONTROL = dict.fromkeys([*range(0, 9), 11, 12, *range(14, 32), 127])

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


def page(
    run: RunIndex, rows: Sequence[SheetRow], sheets: Sequence[str], roots: Sequence[Path]
) -> str:
    """The page of ``run`` showing ``rows`` (their pictures under ``samples/``), the sheets by
    file name (:data:`ROWS_PER_SHEET` rows each) and the folders originals were looked for in."""
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
    if not run.samples:
        line = no_samples_line(run.counts(), inputs, unit)
        parts.append(f'<p class="note" id="no-samples">{_e(line)}</p>')
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


def _searched(rows: Sequence[SheetRow], roots: Sequence[Path]) -> list[str]:
    """Where the originals were looked for: the folders, and the corpus files read."""
    files = dict.fromkeys(str(r.meta.source.path) for r in rows if r.meta.source is not None)
    return [*(str(r) for r in roots), *(f"{f} (inside)" for f in files)]


def _originals_note(rows: Sequence[SheetRow], roots: Sequence[Path]) -> str:
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


def _summary(run: RunIndex, rows: Sequence[SheetRow], samples_v: Sequence[SampleRef]) -> str:
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
        facts.append(("verify (manifest)", compact(run.manifest["verify"], 400)))
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


def _classes(run: RunIndex, rows: Sequence[SheetRow]) -> str:
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


def _samples(rows: Sequence[SheetRow]) -> str:
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


def _verify_html(meta: VerifyMeta | None) -> str:
    if meta is None:
        return '<span class="muted">-</span>'
    v = verdict_lines(meta)
    verdict = "pass" if v.passed else "fail"
    out = [f'<div class="verify"><span class="{verdict}">{verdict}</span>']
    out.append(f' <span class="muted">{_e(v.settings)}</span>')
    if v.failed:
        out.append(f'<div class="fail">{_e("; ".join(v.failed))}</div>')
    rows = [
        f"<tr><td>{_e(c.label)}</td><td>rank {'&rarr;'.join(_e(r) for r in c.ranks)}</td>"
        f"<td>p {'&rarr;'.join(_e(p) for p in c.probs)}</td>"
        f'<td class="{"pass" if c.ok else "fail"}">{"ok" if c.ok else c.problem}</td></tr>'
        for c in v.checks
    ]
    if rows:
        out.append(f"<table>{''.join(rows)}</table>")
    if v.text is not None:
        out.append(f'<div class="muted">text: {_e(v.text_summary(400))}</div>')
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
