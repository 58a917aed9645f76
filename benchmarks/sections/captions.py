"""The ``captions`` section of ``make bench``: caption quality of np-removal on ``benchmarks/data/captions.tsv`` (captions written
for it, with the classes to remove): shares fully removed, fluent by the rules of
:mod:`counterfactual.text.fluency`, unchanged, and captions/s, for the default (repair on)
and the paper's exact output (``--no-repair-captions``) side by side.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import ROOT, Section, best_rate

from counterfactual.text import RewriteRequest, TextConfig, make_rewriter
from counterfactual.vocab import coco_vocabulary

CAPTION_CORPUS = ROOT / "benchmarks" / "data" / "captions.tsv"


def read_caption_corpus(path: Path = CAPTION_CORPUS) -> list[tuple[str, tuple[str, ...]]]:
    """``(caption, classes to remove)`` per line of the caption corpus (``#`` lines skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        caption, classes = line.split("\t")
        rows.append((caption, tuple(c.strip() for c in classes.split(","))))
    return rows


def bench_captions(repeat: int = 3) -> dict[str, float]:
    from counterfactual.text.fluency import caption_quality

    rows = read_caption_corpus()
    vocabulary = coco_vocabulary()
    unknown = {c for _, r in rows for c in r} - set(vocabulary.classes)
    if unknown:
        raise ValueError(f"{CAPTION_CORPUS}: not COCO classes: {sorted(unknown)}")
    requests = [RewriteRequest(c, r) for c, r in rows]
    figures: dict[str, float] = {"captions_corpus_size": len(rows)}
    for name, repair in (("default", True), ("paper", False)):
        rewriter = make_rewriter(TextConfig(repair=repair))

        def run(rewriter=rewriter) -> None:
            rewriter._cache.clear()  # type: ignore[attr-defined]  # measure parses, not the cache
            rewriter(requests)

        rate = best_rate(len(requests), run, repeat=repeat)
        texts = [r.text for r in rewriter(requests)]
        quality = caption_quality(
            [c for c, _ in rows], [r for _, r in rows], texts, vocabulary, rewriter.nlp
        )  # type: ignore[attr-defined]
        figures |= {
            f"captions_{name}_fully_removed": quality.fully_removed,
            f"captions_{name}_fluent": quality.fluent,
            f"captions_{name}_unchanged": quality.unchanged,
            f"captions_{name}_empty": quality.empty,
            f"captions_{name}_per_s": rate,
        }
    figures["captions_originals_fluent"] = quality.originals_fluent
    return figures


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_captions()


SECTION = Section(
    "captions",
    run,
    args=(),
    note="np-removal with the default COCO vocabulary on benchmarks/data/captions.tsv (COCO-style "
    "captions written for this benchmark, each with the classes to remove). default: "
    "repair on; paper: --no-repair-captions, the paper's exact output. fully_removed: "
    "share whose rewrite names no removed class (ClassVocabulary.mentioned; no caption "
    "left counts as removed); fluent: share whose rewrite breaks none of the rules of "
    "counterfactual/text/fluency.py (dangling article, conjunction or preposition, doubled "
    "word, orphan comma, 'between' with one object); unchanged: share returned as they "
    "were; empty: no words left; per_s: captions per second, parse cache cleared, best of 3 "
    "on one core; originals_fluent: the human-written originals that pass the rules.",
)
