"""The evaluation report: ``report.json``, ``report.md`` (tables shaped like the paper's Tables 1
and 2), ``odmap_at_k.png`` (ODmAP@k against k) and ``qualitative.png`` (like its Figure 3: each
query image with the classes removed from it in red, and every model's top captions, marked
correct or not, a mention of a removed class in red)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from counterfactual._lazy import require
from counterfactual.eval.evalset import Query
from counterfactual.eval.evaluate import ModelResult

RED = (200, 20, 20)
GREEN = (20, 130, 40)
BLACK = (0, 0, 0)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100.0 * value:.1f}"


def markdown_tables(results: Sequence[ModelResult], dataset: str) -> str:
    """Table 1 (ODmAP@k, percent, with the gallery's hubness: k-occurrence skewness S@k and the
    largest share of queries, percent, whose top-1 is one caption) and Table 2 (R@K both ways,
    percent) as Markdown."""
    ks = sorted({k for r in results for k in r.odmap})
    hub_ks = sorted({k for r in results if r.hubness for k in r.hubness.skewness})
    head = [f"ODmAP@{k}" for k in ks] + [f"S@{k}" for k in hub_ks] + ["top-1 hub"] * bool(hub_ks)
    lines = [
        f"### Object decorrelation ({dataset}): ODmAP@k, %; hubness: skewness S@k, top-1 hub %",
        "",
        "| Model | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for r in results:
        cells = [_pct(r.odmap.get(k)) for k in ks]
        if hub_ks:
            skew = r.hubness.skewness if r.hubness else {}
            cells += [f"{skew[k]:.2f}" if k in skew else "-" for k in hub_ks]
            cells.append(_pct(r.hubness.top1_share if r.hubness else None))
        lines.append(f"| {r.model} | " + " | ".join(cells) + " |")
    scored = [r for r in results if r.recall is not None]
    if scored:
        rks = sorted({k for r in scored for k in r.recall.image_to_text})  # type: ignore[union-attr]
        head = [f"i→t R@{k}" for k in rks] + [f"t→i R@{k}" for k in rks]
        lines += [
            "",
            f"### Standard retrieval ({dataset}, test images): R@K, %",
            "",
            "| Model | " + " | ".join(head) + " | RSUM |",
            "|---|" + "---:|" * (len(head) + 1),
        ]
        for r in scored:
            assert r.recall is not None
            values = [r.recall.image_to_text[k] for k in rks] + [
                r.recall.text_to_image[k] for k in rks
            ]
            cells = " | ".join(f"{v:.1f}" for v in values)
            lines.append(f"| {r.model} | {cells} | {sum(values):.1f} |")
    return "\n".join(lines) + "\n"


def odmap_plot(results: Sequence[ModelResult], path: Path, dataset: str) -> Path:
    """ODmAP@k (percent) against k, one line per model."""
    matplotlib = require("matplotlib", "eval")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for r in results:
        ks = sorted(r.odmap_curve)
        ax.plot(ks, [100.0 * r.odmap_curve[k] for k in ks], marker="o", ms=3, label=r.model)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("k")
    ax.set_ylabel("ODmAP@k (%)")
    ax.set_title(f"Object decorrelation, {dataset}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def qualitative_grid(
    queries: Sequence[Query],
    results: Sequence[ModelResult],
    captions: Sequence[str],
    mentions: Sequence[frozenset[str]],
    path: Path,
    rows: int = 6,
    top: int = 2,
) -> Path:
    """One row per query (the first ``rows``): the image, ``removed: ...`` in red, and for each
    model its ``top`` captions, green when correct for ODmAP, red when they mention a removed
    class, black otherwise (no kept class mentioned)."""
    font = ImageFont.load_default(size=13)
    thumb, gap, column, line = 160, 10, 330, 16
    chosen = list(range(min(rows, len(queries))))
    wrap = 44
    height = gap
    layouts = []
    for q in chosen:
        blocks = []
        for r in results:
            texts = []
            for rank, g in enumerate(r.topk[q, :top].tolist(), start=1):
                found = mentions[g]
                removed = not found.isdisjoint(queries[q].removed)
                correct = not removed and not found.isdisjoint(queries[q].kept)
                colour = GREEN if correct else RED if removed else BLACK
                wrapped = textwrap.wrap(f"{rank}. {captions[g]}", wrap) or [""]
                texts.append((wrapped, colour))
            blocks.append((r.model, texts))
        lines_needed = max(1 + sum(len(w) for w, _ in texts) for _, texts in blocks)
        row_h = max(thumb + 2 * line, lines_needed * line) + gap
        layouts.append((q, blocks, row_h))
        height += row_h
    width = gap + thumb + gap + column * max(1, len(results))
    sheet = Image.new("RGB", (width, max(height, 40)), (255, 255, 255))
    draw = ImageDraw.Draw(sheet)
    y = gap
    for q, blocks, row_h in layouts:
        query = queries[q]
        image = query.image.copy()
        image.thumbnail((thumb, thumb))
        sheet.paste(image, (gap, y))
        label = "removed: " + ", ".join(query.removed)
        draw.text((gap, y + image.height + 2), label, RED, font=font)
        for c, (model, texts) in enumerate(blocks):
            x = gap + thumb + gap + c * column
            draw.text((x, y), model[-wrap:], BLACK, font=font)
            yy = y + line
            for wrapped, colour in texts:
                for text in wrapped:
                    draw.text((x, yy), text, colour, font=font)
                    yy += line
        y += row_h
    sheet.save(path)
    return path


def write_report(
    out_dir: Path,
    results: Sequence[ModelResult],
    queries: Sequence[Query],
    captions: Sequence[str],
    mentions: Sequence[frozenset[str]],
    context: Mapping[str, Any],
    grid_rows: int = 6,
) -> dict[str, Path]:
    """Write the four report files into ``out_dir``; return their paths by kind.
    ``context`` (dataset, queries source, gallery size, versions...) goes into the JSON."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dataset = str(context.get("dataset", ""))
    paths = {
        "json": out_dir / "report.json",
        "markdown": out_dir / "report.md",
        "plot": out_dir / "odmap_at_k.png",
    }
    report = {**context, "models": [r.to_dict() for r in results]}
    paths["json"].write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", "utf-8")
    paths["markdown"].write_text(markdown_tables(results, dataset), "utf-8")
    odmap_plot(results, paths["plot"], dataset)
    if grid_rows > 0 and queries:
        paths["grid"] = qualitative_grid(
            queries, results, captions, mentions, out_dir / "qualitative.png", grid_rows
        )
    return paths
