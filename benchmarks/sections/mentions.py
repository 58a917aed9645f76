"""The ``mentions`` section of ``make bench``: captions/s of the class-mention index (ODmAP relevance) on one core."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import Arg, Section, best_rate

from counterfactual.readers.generate import generate_coco


def bench_mentions(work: Path, n: int) -> dict[str, float]:
    from counterfactual.eval.mentions import MentionIndexer

    files = generate_coco(work / "mentions", n, seed=5, write_images=False)
    texts = [a["caption"] for a in json.loads(files.captions.read_text())["annotations"]]
    texts = list(dict.fromkeys(texts))  # the indexer parses each distinct caption once
    indexer = MentionIndexer()
    rate = best_rate(len(texts), lambda: indexer(texts), repeat=2)
    share = sum(1 for t in texts if indexer.vocabulary.may_mention(t, indexer.vocabulary.classes))
    return {"mentions_captions_per_s": rate, "mentions_share_parsed": share / len(texts)}


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_mentions(work, args.mention_images)


SECTION = Section(
    "mentions",
    run,
    args=(Arg("--mention-images", {"type": int, "default": 1_000, "help": "x5 captions"}),),
    targets={
        "mentions_captions_per_s": 3_000,
    },
)
