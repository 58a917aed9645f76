"""``counterfactual filter-captions``: drop masked-name captions without enough context."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactual.cli.options import add_options, build
from counterfactual.options import declare, declared
from counterfactual.tools.grounding.persons import (
    CaptionFilter,
    FilterConfig,
    read_samples,
    summarize,
)

INPUT_FORMAT = """\
input: JSON Lines, one sample per line (blank lines are skipped), e.g.
  {"id": "000123", "caption": "[NAME] shakes hands with [NAME] as [NAME] watches",
   "names": [0, 1, 0], "boxes": [[10, 20, 50, 120], [200, 30, 40, 100]],
   "truth": {"0": 1, "1": 0}}
  id      string or integer, unique in the file
  caption text with every masked name written [NAME]
  names   person id (integer >= 0) of each [NAME], in caption order; repeated ids are the
          same person
  boxes   person detections, [x, y, w, h] pixels (top-left corner, width, height)
  truth   person id (as a string key) -> 0-based box index; persons without a box left out
Other fields are carried along. Malformed input stops the run with the file and line.
"""

EPILOG = (
    INPUT_FORMAT
    + """
Each person's [NAME]s become one common first name (distinct persons, distinct names), the
caption is parsed with spaCy, and a sample is dropped when
  no_verb          no token has POS VERB or AUX
  conjunct_names   a name is joined by `conj` to names of two or more other persons
  too_many_persons more persons than stand-in first names (not parsed)
--output gets the kept samples, unchanged, in input order; --decisions one line per sample:
  {"id", "kept", "reasons", "text" (names substituted), "verbs", "conjunct_persons"}.
Prints {"total", "kept", "dropped", "reasons": {reason: count}}; a sample dropped for two
reasons counts under both.
"""
)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterCaptionsOptions:
    """``counterfactual filter-captions``'s files and pipeline (its batch size is
    :class:`FilterConfig`'s)."""

    input: str = declare(help="samples to filter", metavar="IN.jsonl")
    output: str = declare(help="kept samples", metavar="KEPT.jsonl")
    decisions: str | None = declare(
        None, help="per-sample decisions (default: not written)", metavar="DECISIONS.jsonl"
    )
    spacy_model: str | None = declare(
        None,
        help="spaCy pipeline name or path (default: en_core_web_sm if installed)",
        metavar="NAME",
    )
    lexical_verbs_only: bool = declare(
        False,
        help="count only POS VERB as a verb, not auxiliaries and copulas (AUX)",
        kind="flag",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "filter-captions",
        help="drop person-grounding captions with no verb or a chain of conjunct names",
        description="Caption-context filters for person grounding with masked names "
        "(Luo et al., 2022): drop captions with no verb or with three or more conjunct names.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, declared(FilterCaptionsOptions))
    add_options(parser, declared(FilterConfig, "batch_size"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    verb_pos = frozenset({"VERB"}) if args.lexical_verbs_only else frozenset({"VERB", "AUX"})
    config = build(FilterConfig, args, verb_pos=verb_pos)
    samples = read_samples(args.input)
    from counterfactual.text.nlp import load_spacy

    decisions = CaptionFilter(load_spacy(args.spacy_model), config)(samples)
    with Path(args.output).open("w", encoding="utf-8") as handle:
        for sample, decision in zip(samples, decisions, strict=True):
            if decision.kept:
                handle.write(json.dumps(dict(sample.raw), ensure_ascii=False) + "\n")
    if args.decisions:
        with Path(args.decisions).open("w", encoding="utf-8") as handle:
            for decision in decisions:
                handle.write(json.dumps(decision.as_dict(), ensure_ascii=False) + "\n")
    print(json.dumps(summarize(decisions).as_dict(), indent=2))
    return 0
