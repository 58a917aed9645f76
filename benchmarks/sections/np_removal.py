"""The ``np-removal`` section of ``make bench``."""

from __future__ import annotations

import argparse
from pathlib import Path

from common import Arg, Section, best_rate

from counterfactual.method.selection import SelectionConfig, select_many
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco
from counterfactual.text import RewriteRequest, TextConfig, make_rewriter


def bench_np_removal(work: Path, n: int) -> dict[str, float]:
    files = generate_coco(work / "cap", n, seed=3, write_images=False)
    records = read_coco(files.instances, files.captions, files.images).records
    selections = select_many(records, SelectionConfig())
    requests = [
        RewriteRequest(c.text, s.plans[0].removed, s.plans[0].kept)
        for r, s in zip(records, selections, strict=True)
        if s.plans
        for c in r.captions
    ]
    rewriter = make_rewriter(TextConfig())

    def run() -> None:
        rewriter._cache.clear()  # type: ignore[attr-defined]  # measure parses, not the cache
        for i in range(0, len(requests), 256):
            rewriter(requests[i : i + 256])

    rate = best_rate(len(requests), run, repeat=2)
    mentioning = [r for r in requests if rewriter.vocabulary.may_mention(r.caption, r.removed)]  # type: ignore[attr-defined]

    def run_mentioning() -> None:
        rewriter._cache.clear()  # type: ignore[attr-defined]
        for i in range(0, len(mentioning), 256):
            rewriter(mentioning[i : i + 256])

    rate_mentioning = best_rate(len(mentioning), run_mentioning, repeat=2)
    texts = [r.caption for r in requests]
    from counterfactual.text.nlp import load_spacy

    full = load_spacy(rewriter.model_name)  # type: ignore[attr-defined]
    parse = best_rate(len(texts), lambda: list(full.pipe(texts, batch_size=256)), repeat=1)
    return {
        "np_removal_captions_per_s": rate,
        "spacy_full_pipeline_parse_per_s": parse,
        "np_removal_vs_spacy_parse": rate / parse,
        "np_removal_share_parsed": len(mentioning) / len(requests),
        "np_removal_parsed_only_captions_per_s": rate_mentioning,
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_np_removal(work, args.captions_images)


SECTION = Section(
    "np-removal",
    run,
    args=(Arg("--captions-images", {"type": int, "default": 1_000}),),
    targets={
        "np_removal_captions_per_s": 3_000,
    },
)
