"""Score a retrieval model on the counterfactual queries (ODmAP@k) and on the test split (R@K).

The steps, each a plain function so a notebook can run any of them alone:

1. :func:`embed_gallery`: the model's text embeddings of every gallery caption, cached on disk
   (a ``.npy`` keyed by the model and a hash of the captions, reused across evaluations).
2. :func:`odmap_scores`: embed the query images, take each query's top ``k`` gallery captions
   (:func:`~counterfactual.eval.metrics.topk_chunked`, exact and memory-bounded), judge each with
   the class mentions (:func:`~counterfactual.eval.metrics.od_relevance`) and average
   (:func:`~counterfactual.eval.metrics.odmap_at_k`).
3. :func:`recall_scores`: standard image<->text R@K on the test split's images and captions.

:func:`evaluate_model` runs all three for one model and returns a :class:`ModelResult`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from counterfactual.eval.evalset import Corpus, Query
from counterfactual.eval.mentions import texts_sha256
from counterfactual.eval.metrics import (
    RECALL_KS,
    Hubness,
    RecallAtK,
    hubness,
    od_relevance,
    odmap_at_k,
    recall_at_k,
    topk_chunked,
)
from counterfactual.imageio import SampleError
from counterfactual.models import Embedder
from counterfactual.options import declare

ODMAP_KS = (1, 5, 10)
"""The k of the paper's Table 1."""


@dataclass(frozen=True)
class EvalConfig:
    """``odmap_ks``: the k reported in the table; ``curve_k``: ODmAP@k is also computed for
    every k from 1 to this (the plot); ``recall_ks``: the K of R@K; ``chunk``: gallery rows
    scored at once; ``device``: where top-k runs (None: numpy; ``"cuda"``: torch);
    ``embed_batch``: texts or images handed to the model at once."""

    odmap_ks: tuple[int, ...] = declare(
        ODMAP_KS,
        help=f"k of the ODmAP@k columns, one or more (default: {' '.join(map(str, ODMAP_KS))})",
        kind="positive_int",
        nargs="+",
        flags=("--ks",),
    )
    curve_k: int = declare(
        20, help="plot ODmAP@k for k = 1..this (default: %(default)s)", kind="positive_int"
    )
    recall_ks: tuple[int, ...] = RECALL_KS
    chunk: int = 65536
    device: str | None = declare(
        None,
        help="top-k on torch here, e.g. cuda (default: numpy on the CPU)",
        flags=("--topk-device",),
    )
    embed_batch: int = 1024

    def __post_init__(self) -> None:
        for name in ("curve_k", "chunk", "embed_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("odmap_ks", "recall_ks"):
            ks = getattr(self, name)
            if not ks or any(k < 1 for k in ks):
                raise ValueError(f"{name} must be positive integers, got {ks}")

    @property
    def depth(self) -> int:
        """How many captions are retrieved per query."""
        return max(self.curve_k, *self.odmap_ks)


@dataclass
class ModelResult:
    """One model's scores. ``odmap`` and ``recall`` are fractions and percents as the paper
    prints them (``odmap`` 0-1, shown as percent in the report). ``topk`` holds each query's
    retrieved gallery rows (for the qualitative grid); ``failures`` the test images that could
    not be read, by reason; ``odmap_by_removed`` the ``odmap`` table over the queries of each
    removed-class set, with their count (which classes a model still sees when they are gone);
    ``hubness`` how unevenly the gallery captions are retrieved (k-occurrence skewness at each
    ``odmap_ks`` k, the largest share of queries with one caption at top-1)."""

    model: str
    odmap: dict[int, float]
    odmap_curve: dict[int, float]
    recall: RecallAtK | None
    queries: int
    gallery: int
    test_images: int = 0
    test_captions: int = 0
    topk: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int64), repr=False)
    failures: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    odmap_by_removed: dict[str, tuple[int, dict[int, float]]] = field(default_factory=dict)
    hubness: Hubness | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "odmap": {str(k): v for k, v in self.odmap.items()},
            "odmap_curve": {str(k): v for k, v in self.odmap_curve.items()},
            "odmap_by_removed": {
                key: {"queries": n, "odmap": {str(k): v for k, v in table.items()}}
                for key, (n, table) in self.odmap_by_removed.items()
            },
            "hubness": None
            if self.hubness is None
            else {
                "skewness": {str(k): v for k, v in self.hubness.skewness.items()},
                "top1_share": self.hubness.top1_share,
                "top1_caption": self.hubness.top1_item,
            },
            "recall": None
            if self.recall is None
            else {
                "image_to_text": {str(k): v for k, v in self.recall.image_to_text.items()},
                "text_to_image": {str(k): v for k, v in self.recall.text_to_image.items()},
            },
            "queries": self.queries,
            "gallery": self.gallery,
            "test_images": self.test_images,
            "test_captions": self.test_captions,
            "test_image_failures": self.failures,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
        }


def model_token(model: str) -> str:
    """What identifies a model's weights for the embedding cache: the spec, plus each file's
    size and mtime when the spec names a local folder or file (a retrained checkpoint in the
    same folder is a new model)."""
    parts = [model]
    for piece in model.split(":"):
        path = Path(piece)
        if piece and path.exists():
            files = sorted(path.rglob("*")) if path.is_dir() else [path]
            for f in files:
                if f.is_file():
                    st = f.stat()
                    parts.append(
                        f"{f.relative_to(path) if path.is_dir() else f.name}:"
                        f"{st.st_size}:{st.st_mtime_ns}"
                    )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _embed_all(
    embed: Callable[[Sequence[Any]], np.ndarray], items: Sequence[Any], batch: int
) -> np.ndarray:
    parts = [np.asarray(embed(chunk), np.float32) for chunk in _batches(items, batch)]
    if not parts:
        return np.zeros((0, 0), np.float32)
    return np.concatenate(parts)


def embed_gallery(
    embedder: Embedder,
    captions: Sequence[str],
    model: str,
    cache_dir: Path | None = None,
    batch: int = 1024,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """``(len(captions), D)`` float32 text embeddings. With ``cache_dir``, read from or written
    to ``cache_dir/texts-<hash>.npy`` (the hash covers the model and the captions; the file is
    written under a temporary name and renamed, so a killed run leaves no bad cache)."""
    path = None
    if cache_dir is not None:
        key = hashlib.sha256(f"{model_token(model)}\n{texts_sha256(captions)}".encode())
        path = Path(cache_dir) / f"texts-{key.hexdigest()[:24]}.npy"
        if path.exists():
            emb = np.load(path, mmap_mode="r")
            if emb.shape[0] == len(captions):
                return emb
    out: np.ndarray | None = None
    tmp = path.with_name(path.name + ".tmp.npy") if path is not None else None
    for start in range(0, len(captions), batch):
        rows = np.asarray(embedder.embed_texts(captions[start : start + batch]), np.float32)
        if out is None:
            shape = (len(captions), rows.shape[1])
            if tmp is not None:
                tmp.parent.mkdir(parents=True, exist_ok=True)
                out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
            else:
                out = np.empty(shape, np.float32)
        out[start : start + len(rows)] = rows
        if progress is not None:
            progress(start + len(rows), len(captions))
    if out is None:
        return np.zeros((0, 0), np.float32)
    if tmp is not None and path is not None and isinstance(out, np.memmap):
        out.flush()
        del out
        tmp.replace(path)
        return np.load(path, mmap_mode="r")
    return out


def gallery_mentions(
    gallery: Corpus, parse: Callable[[Sequence[str]], list[frozenset[str]]]
) -> list[frozenset[str]]:
    """The classes each gallery caption mentions: its annotated phrase classes where the corpus
    has them (Flickr30k Entities, as np-removal uses them), ``parse`` (e.g. a cached
    :class:`~counterfactual.eval.mentions.MentionIndexer`) for the others, in one call."""
    annotated = gallery.annotated or (None,) * len(gallery.captions)
    todo = [i for i, a in enumerate(annotated) if a is None]
    found: list[frozenset[str]] = [a or frozenset() for a in annotated]
    if todo:
        parsed = parse([gallery.captions[i] for i in todo])
        for i, classes in zip(todo, parsed, strict=True):
            found[i] = classes
    return found


@dataclass(frozen=True)
class OdmapScores:
    """One model's ODmAP on a query set: ``table`` at ``config.odmap_ks``, ``curve`` at
    k = 1..``curve_k``, ``by_removed`` the table over the queries of each removed-class set
    (``"dog"``; several classes joined by ``+`` in name order) with their count, ``top``
    the retrieved gallery rows of each query and ``hubness`` the gallery's, from ``top`` at
    ``config.odmap_ks``."""

    table: dict[int, float]
    curve: dict[int, float]
    by_removed: dict[str, tuple[int, dict[int, float]]]
    top: np.ndarray
    hubness: Hubness


def removed_key(removed: Sequence[str]) -> str:
    """The ``by_removed`` key of a query's removed classes."""
    return "+".join(sorted(removed))


def odmap_scores(
    query_emb: np.ndarray,
    queries: Sequence[Query],
    gallery_emb: np.ndarray,
    mentions: Sequence[frozenset[str]],
    config: EvalConfig,
) -> OdmapScores:
    """ODmAP@k of ``queries`` against the gallery captions (their class ``mentions``)."""
    if len(mentions) != len(gallery_emb):
        raise ValueError(f"{len(mentions)} mention sets for {len(gallery_emb)} gallery captions")
    top = topk_chunked(query_emb, gallery_emb, config.depth, config.chunk, config.device)
    relevance = od_relevance(
        top.indices, mentions, [q.removed for q in queries], [q.kept for q in queries]
    )
    groups: dict[str, list[int]] = {}
    for i, query in enumerate(queries):
        groups.setdefault(removed_key(query.removed), []).append(i)
    by_removed = {
        key: (len(rows), odmap_at_k(relevance[rows], list(config.odmap_ks)))
        for key, rows in sorted(groups.items())
    }
    return OdmapScores(
        odmap_at_k(relevance, list(config.odmap_ks)),
        odmap_at_k(relevance, list(range(1, config.curve_k + 1))),
        by_removed,
        top.indices,
        hubness(top.indices, len(gallery_emb), config.odmap_ks),
    )


def load_test_images(test: Corpus) -> tuple[list[Image.Image], Corpus, dict[str, int]]:
    """The test split's pictures; an image that cannot be read is dropped with its captions and
    counted by reason (R@K over the rest), rather than failing the evaluation."""
    pictures: list[Image.Image] = []
    keep: list[int] = []
    failures: dict[str, int] = {}
    for i in range(len(test.images)):
        try:
            pictures.append(test.load_image(i))
            keep.append(i)
        except SampleError as err:
            failures[err.reason] = failures.get(err.reason, 0) + 1
    if len(keep) < len(test.images):
        test = test.subset(keep)
    return pictures, test, failures


def recall_scores(
    image_emb: np.ndarray, text_emb: np.ndarray, test: Corpus, ks: Sequence[int]
) -> RecallAtK:
    """R@K both ways on the test split (images by captions, cosine of normalised rows)."""
    return recall_at_k(image_emb @ text_emb.T, test.caption_image, ks)


def evaluate_model(
    embedder: Embedder,
    model: str,
    queries: Sequence[Query],
    gallery: Corpus,
    mentions: Sequence[frozenset[str]],
    test: Corpus | None,
    config: EvalConfig | None = None,
    cache_dir: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> ModelResult:
    """Both tables' numbers for one model. ``test=None`` skips R@K."""
    config = config or EvalConfig()
    say = log or (lambda _msg: None)
    if not queries:
        raise ValueError("no queries: the synthetic shards hold no usable sample")
    seconds: dict[str, float] = {}
    start = time.perf_counter()
    say(f"{model}: embedding {len(gallery.captions)} gallery captions")
    gallery_emb = embed_gallery(embedder, gallery.captions, model, cache_dir, config.embed_batch)
    seconds["embed_gallery"] = time.perf_counter() - start
    start = time.perf_counter()
    query_emb = _embed_all(embedder.embed_images, [q.image for q in queries], 64)
    seconds["embed_queries"] = time.perf_counter() - start
    start = time.perf_counter()
    scores = odmap_scores(query_emb, queries, gallery_emb, mentions, config)
    seconds["odmap_topk"] = time.perf_counter() - start
    result = ModelResult(
        model,
        scores.table,
        scores.curve,
        None,
        len(queries),
        len(gallery.captions),
        topk=scores.top,
        odmap_by_removed=scores.by_removed,
        hubness=scores.hubness,
    )
    if test is not None:
        start = time.perf_counter()
        pictures, test, failures = load_test_images(test)
        say(f"{model}: R@K on {len(pictures)} test images, {len(test.captions)} captions")
        image_emb = _embed_all(embedder.embed_images, pictures, 64)
        text_emb = _embed_all(embedder.embed_texts, test.captions, config.embed_batch)
        result.recall = recall_scores(image_emb, text_emb, test, config.recall_ks)
        result.test_images, result.test_captions = len(pictures), len(test.captions)
        result.failures = failures
        seconds["recall"] = time.perf_counter() - start
    result.seconds = seconds
    return result
