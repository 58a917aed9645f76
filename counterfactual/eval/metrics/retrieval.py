"""Retrieval metrics on plain arrays: ODmAP@k (SPEC 1.5), exact top-k and COCO-style R@K.

Conventions shared by every function here:

* Similarity matrices are ``(queries, gallery)``; a larger score ranks earlier.
* Ties rank the **lower gallery index first**, so results are deterministic and equal to a
  stable descending sort (``np.argsort(-scores, kind="stable")``) whatever the chunking or
  backend. NaN scores raise ``ValueError``: they have no place in a ranking.
* Relevance matrices are ``(queries, ranks)`` booleans, column ``i`` is rank ``i + 1``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, overload

import numpy as np
from numpy.typing import ArrayLike

from counterfactual._lazy import require

RECALL_KS = (1, 5, 10)
"""The K of the standard R@K table."""

_BLOCK_ELEMENTS = 1 << 24
"""Most score-matrix elements :func:`recall_at_k` holds at once (64 MiB of float32)."""


class TopK(NamedTuple):
    """The best ``k`` gallery items per query, best first (unpacks as ``scores, indices``).

    ``scores``: ``(Q, k')`` in the similarity dtype; ``indices``: ``(Q, k')`` ``int64``
    gallery rows, with ``k' = min(k, gallery size)``.
    """

    scores: np.ndarray
    indices: np.ndarray


@dataclass(frozen=True)
class RecallAtK:
    """R@K in percent (0-100) for both directions, keyed by K."""

    image_to_text: dict[int, float]
    text_to_image: dict[int, float]


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _no_nan(scores: Any, name: str) -> None:
    if bool(scores.isnan().any() if hasattr(scores, "isnan") else np.isnan(scores).any()):
        raise ValueError(f"{name} contains NaN; a ranking needs comparable scores")


def _select_topk(scores: Any, first: Any, k: int) -> tuple[Any, Any]:
    """Top ``k`` of each row of ``scores`` (numpy or torch, ``(Q, n)``, ``k <= n``).

    Ties go to the lower column. ``first`` is ``None`` or a ``(Q, n)`` gallery-index array
    aligned with ``scores``; among equal scores, column order must follow gallery order.
    Linear in ``n``: the k-th largest value is found by partial selection, every larger score
    is kept, and the remaining places go to the leftmost scores equal to it.
    Returns ``(scores, columns_or_indices)`` as ``(Q, k)``, best first.
    """
    if hasattr(scores, "isnan"):  # torch
        torch = require("torch", "models")
        kth = torch.topk(scores, k, dim=1, sorted=False).values.min(dim=1, keepdim=True).values
        above = scores > kth
        tied = scores == kth
        room = k - above.sum(dim=1, keepdim=True)
        keep = above | (tied & (tied.cumsum(dim=1) <= room))
        cols = keep.nonzero()[:, 1].reshape(-1, k)
        picked = scores.gather(1, cols)
        picked, order = torch.sort(picked, dim=1, descending=True, stable=True)
        cols = cols.gather(1, order)
        return picked, cols if first is None else first.gather(1, cols)
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1 : k]
    above = scores > kth
    tied = scores == kth
    room = k - above.sum(axis=1, keepdims=True)
    keep = above | (tied & (np.cumsum(tied, axis=1, dtype=np.int32) <= room))
    cols = np.nonzero(keep)[1].reshape(-1, k)
    picked = np.take_along_axis(scores, cols, axis=1)
    order = np.argsort(-picked, axis=1, kind="stable")
    cols = np.take_along_axis(cols, order, axis=1)
    picked = np.take_along_axis(picked, order, axis=1)
    return picked, cols if first is None else np.take_along_axis(first, cols, axis=1)


def topk(scores: ArrayLike, k: int) -> TopK:
    """Exact top-``k`` of each row of a ``(Q, G)`` score matrix, ties to the lower index.

    Non-floating scores are compared as float64. Equals the first ``min(k, G)`` columns of ``np.argsort(-scores, axis=1, kind="stable")``.
    """
    k = _positive_int(k, "k")
    matrix = np.asarray(scores)
    if matrix.ndim != 2:
        raise ValueError(f"scores must have shape (queries, gallery), got {matrix.shape}")
    _no_nan(matrix, "scores")
    if not np.issubdtype(matrix.dtype, np.floating):
        matrix = matrix.astype(np.float64)
    width = min(k, matrix.shape[1])
    if width == 0 or matrix.shape[0] == 0:
        return TopK(matrix[:, :width].copy(), np.zeros((matrix.shape[0], width), np.int64))
    picked, cols = _select_topk(matrix, None, width)
    return TopK(picked, cols.astype(np.int64))


def _as_embeddings(array: ArrayLike, name: str) -> np.ndarray:
    matrix = np.asarray(array)
    if matrix.ndim != 2:
        raise ValueError(f"{name} must have shape (N, D), got {matrix.shape}")
    return matrix


def _normalized(rows: Any, name: str, offset: int) -> Any:
    """L2-normalised ``rows`` (numpy or torch); a zero row raises ``ValueError``."""
    is_torch = hasattr(rows, "isnan")
    norms = rows.norm(dim=1, keepdim=True) if is_torch else np.linalg.norm(rows, axis=1)[:, None]
    zero = (norms == 0).flatten()
    if bool(zero.any()):
        row = int(zero.nonzero()[0][0]) if is_torch else int(np.flatnonzero(zero)[0])
        raise ValueError(f"{name} row {offset + row} has zero norm; cosine is undefined")
    return rows / norms


def topk_chunked(
    query_emb: ArrayLike,
    gallery_emb: ArrayLike,
    k: int,
    chunk: int = 65536,
    device: str | None = None,
    *,
    normalize: bool = False,
    query_chunk: int = 256,
) -> TopK:
    """Exact top-``k`` gallery rows per query by dot product, streaming over the gallery.

    ``query_emb`` is ``(Q, D)``, ``gallery_emb`` ``(G, D)`` (a ``np.memmap`` works: rows are read
    ``chunk`` at a time). Scores are ``query @ gallery.T`` in
    ``np.result_type(query, gallery, float32)``; ``normalize=True`` L2-normalises both sides
    first (cosine; a zero row raises). Memory holds ``query_chunk x (chunk + k)`` scores at once.
    ``device=None`` computes with numpy; a device name (``"cpu"``, ``"cuda"``, ``"cuda:1"``) with
    torch (``pip install 'counterfactual-vl[models]'``). Ties go to the lower gallery index, so the
    result equals a full stable sort of the same scores for any ``chunk`` and ``query_chunk``.
    Returns ``min(k, G)`` columns; numpy arrays whichever the backend.
    """
    k = _positive_int(k, "k")
    chunk = _positive_int(chunk, "chunk")
    query_chunk = _positive_int(query_chunk, "query_chunk")
    queries = _as_embeddings(query_emb, "query_emb")
    gallery = _as_embeddings(gallery_emb, "gallery_emb")
    if queries.shape[1] != gallery.shape[1]:
        raise ValueError(
            f"query_emb has dimension {queries.shape[1]} but gallery_emb {gallery.shape[1]}"
        )
    dtype = np.result_type(queries.dtype, gallery.dtype, np.float32)
    n_query, n_gallery = queries.shape[0], gallery.shape[0]
    width = min(k, n_gallery)
    if width == 0 or n_query == 0:
        return TopK(np.zeros((n_query, width), dtype), np.zeros((n_query, width), np.int64))

    if device is None:
        xp_queries = queries.astype(dtype, copy=False)

        def load(rows: np.ndarray) -> Any:
            return rows.astype(dtype, copy=False)

        def arange(start: int, stop: int) -> Any:
            return np.arange(start, stop, dtype=np.int64)

        def concat(parts: list[Any]) -> Any:
            return np.concatenate(parts, axis=1)

        def broadcast(row: Any, n: int) -> Any:
            return np.broadcast_to(row, (n, row.shape[0]))

        def to_numpy(array: Any) -> np.ndarray:
            return np.asarray(array)
    else:
        torch = require("torch", "models")
        torch_dtype = getattr(torch, np.dtype(dtype).name)
        xp_queries = torch.from_numpy(np.ascontiguousarray(queries)).to(device, torch_dtype)

        def load(rows: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(rows)).to(device, torch_dtype)

        def arange(start: int, stop: int) -> Any:
            return torch.arange(start, stop, dtype=torch.int64, device=device)

        def concat(parts: list[Any]) -> Any:
            return torch.cat(parts, dim=1)

        def broadcast(row: Any, n: int) -> Any:
            return row.expand(n, row.shape[0])

        def to_numpy(array: Any) -> np.ndarray:
            return array.cpu().numpy()

    if normalize:
        xp_queries = _normalized(xp_queries, "query_emb", 0)
    best: list[tuple[Any, Any] | None] = [None] * -(-n_query // query_chunk)
    for start in range(0, n_gallery, chunk):
        rows = load(gallery[start : start + chunk])
        if normalize:
            rows = _normalized(rows, "gallery_emb", start)
        index = arange(start, start + rows.shape[0])
        for block, q0 in enumerate(range(0, n_query, query_chunk)):
            scores = xp_queries[q0 : q0 + query_chunk] @ rows.T
            _no_nan(scores, "similarity")
            indices = broadcast(index, scores.shape[0])
            held = best[block]
            if held is not None:  # held indices are all lower than this chunk's: order holds
                scores = concat([held[0], scores])
                indices = concat([held[1], indices])
            best[block] = _select_topk(scores, indices, min(width, scores.shape[1]))
    done = [pair for pair in best if pair is not None]
    return TopK(
        np.concatenate([to_numpy(s) for s, _ in done]),
        np.concatenate([to_numpy(i) for _, i in done]).astype(np.int64),
    )


def ranked_relevance(scores: ArrayLike, correct: ArrayLike, k: int) -> np.ndarray:
    """``correct`` reordered by rank: ``(Q, min(k, G))`` bool from ``(Q, G)`` scores and flags.

    Ranking as :func:`topk` (descending score, ties to the lower gallery index).
    """
    flags = np.asarray(correct, dtype=bool)
    if flags.shape != np.shape(scores):
        raise ValueError(f"correct has shape {flags.shape} but scores {np.shape(scores)}")
    return np.take_along_axis(flags, topk(scores, k).indices, axis=1)


def od_relevance(
    topk_indices: ArrayLike,
    caption_classes: Sequence[frozenset[str]],
    removed: Sequence[Collection[str]],
    kept: Sequence[Collection[str]],
) -> np.ndarray:
    """ODmAP correctness (SPEC 1.5) of retrieved captions: ``(Q, k)`` bool.

    ``topk_indices`` is ``(Q, k)`` gallery rows, best first (e.g. :func:`topk_chunked`).
    ``caption_classes[g]`` is the set of class names gallery caption ``g`` mentions;
    ``removed[q]`` and ``kept[q]`` are the classes removed from and kept in query image ``q``.
    A caption is correct for query ``q`` when it mentions no removed class and at least one
    kept class. A class both removed and kept for one query raises ``ValueError``.
    """
    indices = np.asarray(topk_indices)
    if indices.ndim != 2 or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(
            f"topk_indices must be a (queries, k) integer array, got {indices.dtype} {indices.shape}"
        )
    if not len(removed) == len(kept) == indices.shape[0]:
        raise ValueError(
            f"{indices.shape[0]} queries but {len(removed)} removed and {len(kept)} kept sets"
        )
    if indices.size and (indices.min() < 0 or indices.max() >= len(caption_classes)):
        raise ValueError(
            f"topk_indices must lie in [0, {len(caption_classes)}), "
            f"got [{indices.min()}, {indices.max()}]"
        )
    out = np.zeros(indices.shape, dtype=bool)
    for q, (row, gone, present) in enumerate(zip(indices.tolist(), removed, kept, strict=True)):
        gone, present = frozenset(gone), frozenset(present)
        if not gone.isdisjoint(present):
            raise ValueError(f"query {q}: classes {sorted(gone & present)} are removed and kept")
        for i, g in enumerate(row):
            mentioned = caption_classes[g]
            out[q, i] = mentioned.isdisjoint(gone) and not mentioned.isdisjoint(present)
    return out


def _as_relevance(relevance: ArrayLike) -> np.ndarray:
    rel = np.asarray(relevance)
    if rel.ndim != 2:
        raise ValueError(f"relevance must have shape (queries, ranks), got {rel.shape}")
    if rel.dtype != bool:
        if not np.isin(rel, (0, 1)).all():
            raise ValueError("relevance must be boolean or 0/1")
        rel = rel.astype(bool)
    return rel


def average_precision_at_k(relevance: ArrayLike, k: int) -> np.ndarray:
    """AP@k per query, ``(Q,)`` float64: ``(1/k) * sum_{i<=k} P(i) * rel(i)`` (SPEC 1.5).

    ``relevance`` is ``(Q, n)`` bool (or 0/1) in rank order. The normaliser is always ``k``, as
    the SPEC writes it (Musgrave et al.'s MAP@R sets ``k = R``, the number of relevant items;
    with a fixed ``k`` a query with fewer than ``k`` correct captions cannot reach 1). Columns
    past ``k`` are ignored; when ``n < k`` (a gallery smaller than ``k``) the missing ranks count
    as not relevant. A query with no correct result scores 0.
    """
    k = _positive_int(k, "k")
    rel = _as_relevance(relevance)[:, :k]
    ranks = np.arange(1, rel.shape[1] + 1)
    precision = np.cumsum(rel, axis=1) / ranks
    return (precision * rel).sum(axis=1) / k


@overload
def odmap_at_k(relevance: ArrayLike, k: int) -> float: ...
@overload
def odmap_at_k(relevance: ArrayLike, k: Sequence[int]) -> dict[int, float]: ...
def odmap_at_k(relevance: ArrayLike, k: int | Sequence[int]) -> float | dict[int, float]:
    """ODmAP@k: the mean of :func:`average_precision_at_k` over all queries (fraction, 0-1).

    Every query counts, those without any correct caption included (AP 0). A sequence of ``k``
    gives ``{k: ODmAP@k}``. No queries, or ``k <= 0``, raise ``ValueError``.
    """
    rel = _as_relevance(relevance)
    if rel.shape[0] == 0:
        raise ValueError("relevance has no queries; ODmAP is undefined")
    if isinstance(k, Sequence):
        return {_positive_int(v, "k"): float(average_precision_at_k(rel, v).mean()) for v in k}
    return float(average_precision_at_k(rel, k).mean())


@dataclass(frozen=True)
class Hubness:
    """How unevenly a gallery is retrieved (Radovanović et al., JMLR 2010): ``skewness[k]`` is
    the skewness of the k-occurrence ``N_k(x)`` (how many queries have gallery item ``x`` in
    their top ``k``) over every gallery item, ``E[(N_k - mu)^3] / sigma^3`` (population
    moments; 0 when every item occurs equally often); ``top1_share``: the largest fraction of
    queries whose top-1 is one item, ``top1_item`` (the lowest such row)."""

    skewness: dict[int, float]
    top1_share: float
    top1_item: int


def k_occurrence(topk_indices: ArrayLike, gallery: int, k: int) -> np.ndarray:
    """``N_k``: ``(gallery,)`` int64, how many queries have each gallery row in their first
    ``k`` columns of ``topk_indices`` (``(Q, k')`` rows, best first, e.g. :attr:`TopK.indices`;
    ``k' >= min(k, gallery)``)."""
    k = _positive_int(k, "k")
    indices = np.asarray(topk_indices)
    if indices.ndim != 2 or not np.issubdtype(indices.dtype, np.integer):
        raise ValueError(
            f"topk_indices must be a (queries, k) integer array, got {indices.dtype} {indices.shape}"
        )
    if indices.shape[1] < min(k, gallery):
        raise ValueError(f"topk_indices has {indices.shape[1]} columns, k-occurrence needs {k}")
    if indices.size and (indices.min() < 0 or indices.max() >= gallery):
        raise ValueError(f"topk_indices must lie in [0, {gallery})")
    return np.bincount(indices[:, :k].ravel(), minlength=gallery).astype(np.int64)


def skewness(values: ArrayLike) -> float:
    """``E[(x - mu)^3] / sigma^3`` with population moments; 0 for constant ``values``."""
    x = np.asarray(values, np.float64)
    if x.size == 0:
        raise ValueError("skewness of no values is undefined")
    dev = x - x.mean()
    var = float(np.mean(dev * dev))
    if var <= 0.0:
        return 0.0
    return float(np.mean(dev**3) / var**1.5)


def hubness(topk_indices: ArrayLike, gallery: int, ks: Sequence[int]) -> Hubness:
    """:class:`Hubness` of a retrieval from its top-k gallery rows (``(Q, k')``, best first):
    memory linear in the gallery and the queries, no score matrix needed."""
    if gallery < 1:
        raise ValueError(f"hubness needs a gallery, got {gallery} items")
    ks = sorted({_positive_int(v, "k") for v in ks})
    if not ks:
        raise ValueError("hubness needs at least one k")
    top1 = k_occurrence(topk_indices, gallery, 1)
    queries = int(np.asarray(topk_indices).shape[0])
    if queries == 0:
        raise ValueError("hubness needs at least one query")
    return Hubness(
        {k: skewness(k_occurrence(topk_indices, gallery, k)) for k in ks},
        float(top1.max()) / queries,
        int(np.argmax(top1)),
    )


def recall_at_k(
    similarity: ArrayLike, caption_to_image: ArrayLike, ks: Sequence[int] = RECALL_KS
) -> RecallAtK:
    """Image->text and text->image R@K in percent (COCO/Flickr 5-captions-per-image protocol).

    ``similarity`` is ``(I, C)``, images by captions; ``caption_to_image`` is ``(C,)`` integers,
    the image of each caption. A query image is a hit at K when any of its captions ranks in its
    top K captions; a query caption is a hit when its image ranks in its top K images. Ranking
    as :func:`topk` (ties to the lower index). Computed from the rank of the best matching item
    in blocks of about 16M scores. Every image needs at least one caption (else ``ValueError``).
    """
    ks = tuple(_positive_int(v, "K") for v in ks)
    sim = np.asarray(similarity)
    owner = np.asarray(caption_to_image)
    if sim.ndim != 2:
        raise ValueError(f"similarity must have shape (images, captions), got {sim.shape}")
    n_image, n_caption = sim.shape
    if owner.shape != (n_caption,) or not np.issubdtype(owner.dtype, np.integer):
        raise ValueError(
            f"caption_to_image must be ({n_caption},) integers, got {owner.dtype} {owner.shape}"
        )
    if n_caption and (owner.min() < 0 or owner.max() >= n_image):
        raise ValueError(f"caption_to_image must lie in [0, {n_image})")
    counts = np.bincount(owner, minlength=n_image)
    if n_image == 0 or (counts == 0).any():
        missing = np.flatnonzero(counts == 0)
        raise ValueError(f"every image needs a caption; images without one: {missing[:10]}")
    _no_nan(sim, "similarity")

    # Image -> text: rank of the best-ranked own caption (highest score, then lowest index).
    image_rank = np.empty(n_image, dtype=np.int64)
    columns = np.arange(n_caption)
    step = max(1, _BLOCK_ELEMENTS // max(n_caption, 1))
    for i0 in range(0, n_image, step):
        block = sim[i0 : i0 + step]
        own = owner[None, :] == np.arange(i0, i0 + block.shape[0])[:, None]
        best = np.where(own, block, -np.inf).max(axis=1, keepdims=True)
        first = np.argmax(own & (block == best), axis=1)[:, None]
        image_rank[i0 : i0 + block.shape[0]] = (block > best).sum(axis=1) + (
            (block == best) & (columns[None, :] < first)
        ).sum(axis=1)

    # Text -> image: rank of the caption's own image in its column.
    caption_rank = np.empty(n_caption, dtype=np.int64)
    rows = np.arange(n_image)[:, None]
    step = max(1, _BLOCK_ELEMENTS // n_image)
    for c0 in range(0, n_caption, step):
        block = sim[:, c0 : c0 + step]
        mine = owner[c0 : c0 + block.shape[1]]
        score = block[mine, np.arange(block.shape[1])][None, :]
        caption_rank[c0 : c0 + block.shape[1]] = (block > score).sum(axis=0) + (
            (block == score) & (rows < mine[None, :])
        ).sum(axis=0)

    return RecallAtK(
        image_to_text={v: 100.0 * float((image_rank < v).mean()) for v in ks},
        text_to_image={v: 100.0 * float((caption_rank < v).mean()) for v in ks},
    )
