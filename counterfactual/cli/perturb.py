"""``counterfactual perturb``: linguistic-structure perturbations of referring expressions."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactual.cli.options import add_options, positive_int
from counterfactual.options import declare, declared
from counterfactual.text.perturb import MODES, REQUIRED_FIELDS, perturb_records, read_jsonl

EPILOG = """\
input: JSON Lines, one object per line (blank lines are skipped), e.g.
  {"image": "COCO_train2014_000000000009.jpg", "expression": "the blue bike behind the red car",
   "box": [10, 20, 110, 220]}
  "expression" (string) is always needed; "image" (string or integer) and "box" (4 numbers, any
  box format, carried along unchanged) only for --mode negatives. Other fields pass through.

output: the same objects, in order, with fields added:
  shuffle    "expression_shuffled": the words in a random order (seeded per line from --seed)
  nouns-adj  "expression_nouns_adj": only the nouns, proper nouns and adjectives (spaCy POS)
  negatives  "negative_partner": 0-based index of the partner object j != i drawn from the
             same batch (never another expression of the same image and box),
             "negative_image_swapped": {image_j, expression_i, box_j} and
             "negative_expression_swapped": {image_i, expression_j, box_i}
  negatives with --negatives K or all: several partners per line, for Sum-H / Max-H
             (counterfactual.train.hinge): the lists "negative_partners" (ascending),
             "negatives_image_swapped" and "negatives_expression_swapped", in that order

Malformed JSON or a missing field stops the run with the file and line; nothing is written.
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "perturb",
        help="shuffle words, keep nouns+adjectives, or build in-batch contrastive negatives",
        description="Perturb the linguistic structure of referring expressions (Akula et al.,\n"
        "2020): word shuffling, nouns+adjectives only, and in-batch contrastive negatives.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, declared(PerturbOptions))
    parser.set_defaults(func=run)


def _negatives_count(text: str) -> int | None:
    """argparse type of ``--negatives``: ``all`` (None) or a whole number > 0."""
    return None if text == "all" else int(positive_int(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class PerturbOptions:
    """``counterfactual perturb``'s options."""

    input: str = declare(help="input records", metavar="IN.jsonl")
    output: str = declare(help="output records", metavar="OUT.jsonl")
    mode: str = declare(help="which perturbation", choices=MODES)
    seed: int = declare(0, help="random seed (default: 0)", kind="int")
    spacy_model: str | None = declare(
        None,
        help="spaCy pipeline name or path for nouns-adj (default: en_core_web_sm if installed)",
        metavar="NAME",
    )
    batch_size: int = declare(
        0,
        help="negatives: partners come from batches of N consecutive lines "
        "(default 0: the whole file is one batch)",
        kind="int",
        metavar="N",
    )
    negatives: int | None = declare(
        1,
        help="negatives: partners per line, drawn from its batch without repeats, or 'all' of "
        "them (Sum-H over n-1; Akula et al.'s appendix samples 64); default 1",
        parse=_negatives_count,
        metavar="K|all",
    )


def run(args: argparse.Namespace) -> int:
    if args.negatives != 1 and args.mode != "negatives":
        raise ValueError(f"--negatives {args.negatives or 'all'} needs --mode negatives")
    records = read_jsonl(args.input, REQUIRED_FIELDS[args.mode])
    nlp = None
    if args.mode == "nouns-adj":
        from counterfactual.text.nlp import load_spacy

        nlp = load_spacy(args.spacy_model)
    rows = perturb_records(
        records,
        args.mode,
        seed=args.seed,
        nlp=nlp,
        batch_size=args.batch_size,
        negatives=args.negatives,
    )
    with Path(args.output).open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return 0
