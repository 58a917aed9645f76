"""One evaluation as ``counterfactual eval`` runs it, as a function: :class:`EvalRun` (what to
score, on which gallery, where the report goes) and :func:`run_eval` (queries read, gallery and
its class mentions, every model scored, the report written). The command line and the
controlled world's experiment both call it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from counterfactual.eval.evalset import Corpus, corpus_from_records, read_karpathy, read_queries
from counterfactual.eval.evaluate import EvalConfig, ModelResult, evaluate_model, gallery_mentions

Mentions = Callable[[Sequence[str]], list[frozenset[str]]]
"""Computes the class mentions of captions (``None`` in :func:`run_eval`: in this process; the
command line hands in the Ray actor pool's for ``--runner ray``)."""


@dataclass(frozen=True)
class EvalRun:
    """What one evaluation scores and where its report goes. ``queries``: the synthetic shards'
    spec as given (a folder, glob or braces; recorded in ``report.json``); ``models``: embedder
    specs (``scratch:FOLDER``, ``hf-clip:ID``, ...); ``dataset``, ``root``, ``split_file``: the
    gallery (every caption of every split); ``test_split``: R@K's split (``recall=False``: no
    R@K); ``cache``: mentions and gallery embeddings (``None``: ``out/cache``); ``vocabulary``
    (``None``: COCO's, the demo's for the demo) and ``spacy_model``: the mention index's;
    ``device`` and ``batch_size``: the models'; ``grid``: queries in ``qualitative.png``."""

    queries: str
    models: tuple[str, ...]
    out: Path
    dataset: str = "demo"
    root: Path | None = None
    split_file: Path | None = None
    test_split: str = "test"
    recall: bool = True
    cache: Path | None = None
    vocabulary: str | None = None
    spacy_model: str | None = None
    device: str | None = None
    batch_size: int = 64
    grid: int = 6
    config: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("no model to evaluate")
        if self.batch_size < 1 or self.grid < 0:
            raise ValueError(
                f"batch_size must be >= 1 and grid >= 0, got {self.batch_size} and {self.grid}"
            )

    @property
    def cache_dir(self) -> Path:
        return self.cache or self.out / "cache"


@dataclass(frozen=True)
class EvalOutcome:
    """What :func:`run_eval` scored and wrote: each model's :class:`ModelResult` (in
    ``run.models``' order) and the report files by kind."""

    results: list[ModelResult]
    paths: dict[str, Path]


def load_corpus(run: EvalRun) -> tuple[Corpus, str | None]:
    """The gallery (every caption of every split) and the split to use for R@K."""
    if run.dataset == "demo":
        from counterfactual.readers.demo import demo_cache_dir, read_demo

        old = _queries_dir(run.queries) / "demo-data"  # where earlier versions made them
        root = run.root or (old if old.is_dir() else demo_cache_dir())
        return corpus_from_records(read_demo(root).records), None
    if run.root is None and run.split_file is None:
        raise ValueError(f"--dataset {run.dataset} needs --root or --split-file")
    split_file = run.split_file
    if split_file is None:
        candidate = run.root / f"dataset_{run.dataset}.json"
        split_file = candidate if candidate.exists() else None
    if split_file is not None:
        image_root = run.root
        if image_root is not None and run.dataset == "flickr30k":
            image_root = image_root / "flickr30k-images"
        return read_karpathy(split_file, image_root), run.test_split
    if run.dataset == "flickr30k":
        from counterfactual.readers.flickr30k import read_flickr30k

        return corpus_from_records(read_flickr30k(run.root, split=None).records), run.test_split
    raise ValueError(
        f"COCO needs Karpathy's split file: --split-file or {run.root}/dataset_coco.json"
    )


def _queries_dir(spec: str) -> Path:
    path = Path(spec)
    return path if path.is_dir() else path.parent


def vocabulary_path(dataset: str, vocabulary: str | None) -> str | None:
    """The class word lists a run over ``dataset`` matches captions with: ``vocabulary``, else
    the demo's for the demo, else ``None`` (COCO's)."""
    if vocabulary or dataset != "demo":
        return vocabulary
    from counterfactual.readers.demo import demo_vocabulary_path

    return str(demo_vocabulary_path())


def mention_parser(
    run: EvalRun, compute: Callable[..., list[frozenset[str]]] | None, log: Callable[[str], None]
) -> Mentions:
    """A ``parse`` for :func:`~counterfactual.eval.evaluate.gallery_mentions`: the mention index
    (the word lists synth matched the captions with), cached in ``run.cache_dir``; computed by
    ``compute(texts, indexer=...)`` when given; where the answer came from goes to ``log``."""
    from counterfactual.eval.mentions import MentionIndexer, cached_mentions
    from counterfactual.vocab import load_vocabulary

    def parse(texts: Sequence[str]) -> list[frozenset[str]]:
        vocabulary = load_vocabulary(vocabulary_path(run.dataset, run.vocabulary))
        indexer = MentionIndexer(vocabulary, run.spacy_model)
        pool = None if compute is None else (lambda t: compute(t, indexer=indexer))
        start = time.perf_counter()
        found, hit = cached_mentions(texts, indexer, run.cache_dir, pool)
        where = "from the cache" if hit else f"in {time.perf_counter() - start:.1f} s"
        log(f"mentions of {len(texts)} captions {where}")
        return found

    return parse


def run_eval(
    run: EvalRun,
    shards: Sequence[str],
    compute: Callable[..., list[frozenset[str]]] | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> EvalOutcome:
    """Score every model of ``run`` on the queries in ``shards`` (the files of ``run.queries``,
    :func:`counterfactual.train.mix.expand_shards`) and write ``report.json``, ``report.md``,
    ``odmap_at_k.png`` and ``qualitative.png`` into ``run.out``. ``compute``: the mention
    index's parallel form (``compute(texts, indexer=...)``; default: this process); ``log``:
    the lines a person reads on the way. ``ValueError`` when no query is usable."""
    from counterfactual.eval.report import write_report
    from counterfactual.models import load_embedder

    queries, problems = read_queries(shards)
    if not queries:
        raise ValueError(f"no usable query in {run.queries} ({len(problems)} unusable samples)")
    gallery, test_split = load_corpus(run)
    test = gallery.split(test_split) if run.recall else None
    splits = sorted({q.split or "none" for q in queries})
    if test_split is not None and splits != [test_split]:
        log(f"warning: queries come from splits {splits}, not {test_split}")
    log(
        f"{len(queries)} queries, gallery of {len(gallery.captions)} captions "
        f"({gallery.splits}), {len(problems)} unusable samples"
    )
    mentions = gallery_mentions(gallery, mention_parser(run, compute, log))
    results = []
    for spec in run.models:
        embedder = load_embedder(spec, device=run.device, batch_size=run.batch_size)
        results.append(
            evaluate_model(
                embedder, spec, queries, gallery, mentions, test, run.config, run.cache_dir, log
            )
        )
    context: dict[str, Any] = {
        "dataset": run.dataset,
        "queries": str(run.queries),
        "query_splits": splits,
        "unusable_samples": [asdict(p) for p in problems],
        "gallery_captions": len(gallery.captions),
        "gallery_splits": gallery.splits,
        "test_split": test_split,
        "mentioning_captions": sum(1 for m in mentions if m),
        "config": {"odmap_ks": list(run.config.odmap_ks), "curve_k": run.config.curve_k},
    }
    paths = write_report(run.out, results, queries, gallery.captions, mentions, context, run.grid)
    return EvalOutcome(results, paths)


__all__ = ["EvalOutcome", "EvalRun", "Mentions", "load_corpus", "run_eval", "vocabulary_path"]
