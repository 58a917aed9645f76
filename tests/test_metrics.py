"""Retrieval metrics: hand-computed ODmAP@k, exact top-k, ODmAP correctness and R@K."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from counterfactual.eval.metrics import (
    RecallAtK,
    TopK,
    average_precision_at_k,
    od_relevance,
    odmap_at_k,
    ranked_relevance,
    recall_at_k,
    topk,
    topk_chunked,
)

# --- ODmAP@k: AP@k = (1/k) * sum_{i<=k} P(i) * rel(i) ---------------------------------------

AP_CASES = [
    # (ranked relevance of one query, k, AP@k, the arithmetic)
    ([1, 1, 1], 3, 1.0, "(1/3)(1 + 2/2 + 3/3)"),
    ([1, 0, 0], 3, 1 / 3, "single hit at rank 1: (1/3)(1/1)"),
    ([0, 0, 1], 3, 1 / 9, "single hit at rank k: (1/3)(1/3)"),
    ([1, 0, 1], 3, 5 / 9, "(1/3)(1/1 + 2/3) = (1/3)(5/3)"),
    ([0, 1, 1], 3, 7 / 18, "(1/3)(1/2 + 2/3) = (1/3)(7/6)"),
    ([0, 0, 0], 3, 0.0, "no correct caption"),
    ([0, 1, 1], 1, 0.0, "only rank 1 counts: (1/1)(0)"),
    ([0, 1, 1], 2, 1 / 4, "(1/2)(1/2)"),
    ([1, 1], 4, 1 / 2, "gallery of 2 < k: (1/4)(1/1 + 2/2), the normaliser stays k"),
    ([1], 10, 1 / 10, "gallery of 1: (1/10)(1/1)"),
]


@pytest.mark.parametrize(("row", "k", "expected", "arithmetic"), AP_CASES)
def test_average_precision_by_hand(
    row: list[int], k: int, expected: float, arithmetic: str
) -> None:
    got = average_precision_at_k(np.array([row], dtype=bool), k)
    assert got.shape == (1,)
    assert got[0] == pytest.approx(expected, abs=1e-12), arithmetic


def test_odmap_averages_over_every_query() -> None:
    # [1,0,1] -> 5/9 and [0,0,0] -> 0 (still counted): (5/9 + 0) / 2 = 5/18
    relevance = np.array([[1, 0, 1], [0, 0, 0]])
    assert odmap_at_k(relevance, 3) == pytest.approx(5 / 18)
    # k = 1: (1 + 0) / 2; k = 2: ((1/2)(1) + 0) / 2 = 1/4; k = 3: 5/18
    assert odmap_at_k(relevance, [1, 2, 3]) == pytest.approx({1: 0.5, 2: 0.25, 3: 5 / 18})
    assert isinstance(odmap_at_k(relevance, 3), float)


def test_ranked_relevance_breaks_ties_by_lower_index() -> None:
    # scores 0.5 0.9 0.5 0.9 -> order 1, 3 (tie: lower index first), 0, 2
    scores = np.array([[0.5, 0.9, 0.5, 0.9]])
    correct = np.array([[True, False, False, True]])
    rel = ranked_relevance(scores, correct, 3)
    assert rel.tolist() == [[False, True, True]]  # captions 1, 3, 0
    # AP@3 = (1/3)(P(2) + P(3)) = (1/3)(1/2 + 2/3) = 7/18
    assert odmap_at_k(rel, 3) == pytest.approx(7 / 18)
    # the opposite tie order would rank caption 3 first: (1/3)(1 + 2/3) = 5/9, not 7/18
    assert ranked_relevance(scores, correct, 10).shape == (1, 4)


@pytest.mark.parametrize(
    ("relevance", "k"),
    [
        ([[1, 0]], 0),
        ([[1, 0]], -1),
        ([[1, 0]], 1.0),
        ([[1, 0]], True),
        ([[1, 0]], [1, 0]),
        ([[1, 2]], 1),  # not binary
        ([1, 0], 1),  # not (queries, ranks)
        (np.zeros((0, 3), dtype=bool), 1),  # no queries
    ],
)
def test_odmap_rejects_bad_input(relevance: object, k: object) -> None:
    with pytest.raises(ValueError):
        odmap_at_k(relevance, k)  # type: ignore[arg-type]


def _brute_ap(row: list[bool], k: int) -> float:
    total, hits = 0.0, 0
    for i in range(1, k + 1):
        rel = i <= len(row) and row[i - 1]
        if rel:
            hits += 1
            total += hits / i
    return total / k


def test_odmap_matches_brute_force_on_random_data() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        n_query, n_rank = rng.integers(1, 12), rng.integers(1, 15)
        relevance = rng.random((n_query, n_rank)) < rng.random()
        for k in (1, 2, 5, 10, 20):
            expected = sum(_brute_ap(list(r), k) for r in relevance.tolist()) / n_query
            assert odmap_at_k(relevance, k) == pytest.approx(expected, abs=1e-12)


def test_ranked_relevance_matches_python_sort() -> None:
    rng = np.random.default_rng(1)
    for _ in range(30):
        n_query, n_gallery = rng.integers(1, 6), rng.integers(1, 30)
        scores = rng.integers(0, 4, (n_query, n_gallery)).astype(np.float32)  # many ties
        correct = rng.random((n_query, n_gallery)) < 0.4
        for k in (1, 3, n_gallery, n_gallery + 2):
            got = ranked_relevance(scores, correct, k)
            for q in range(n_query):
                order = sorted(range(n_gallery), key=lambda g, q=q: (-scores[q, g], g))
                assert got[q].tolist() == [bool(correct[q, g]) for g in order[:k]]


# --- top-k --------------------------------------------------------------------------------


def _full_sort(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def _tied_embeddings(seed: int, n_query: int, n_gallery: int) -> tuple[np.ndarray, np.ndarray]:
    """Small integer vectors: dot products are exact in float32 and full of ties."""
    rng = np.random.default_rng(seed)
    queries = rng.integers(-2, 3, (n_query, 4)).astype(np.float32)
    gallery = rng.integers(-2, 3, (n_gallery, 4)).astype(np.float32)
    gallery[5] = gallery[2]  # exact duplicate rows tie everywhere
    return queries, gallery


def test_topk_by_hand() -> None:
    # row 0: 3, 1, 3, 2 -> indices 0, 2 (tie, lower first), 3; row 1: all tied -> 0, 1, 2
    result = topk([[3.0, 1.0, 3.0, 2.0], [7.0, 7.0, 7.0, 7.0]], 3)
    assert isinstance(result, TopK)
    assert result.indices.tolist() == [[0, 2, 3], [0, 1, 2]]
    assert result.scores.tolist() == [[3.0, 3.0, 2.0], [7.0, 7.0, 7.0]]
    assert result.indices.dtype == np.int64


@pytest.mark.parametrize("chunk", [1, 3, 7, 16, 23, 24, 1000])
@pytest.mark.parametrize("k", [1, 5, 23, 30])
def test_topk_chunked_equals_full_sort(chunk: int, k: int) -> None:
    queries, gallery = _tied_embeddings(2, 9, 23)
    want_scores, want_indices = _full_sort(queries @ gallery.T, k)
    scores, indices = topk_chunked(queries, gallery, k, chunk=chunk, query_chunk=4)
    assert indices.shape == (9, min(k, 23))
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_array_equal(topk(queries @ gallery.T, k).indices, want_indices)


def test_topk_chunked_random_shapes() -> None:
    rng = np.random.default_rng(3)
    for seed in range(20):
        queries, gallery = _tied_embeddings(
            seed, int(rng.integers(1, 20)), int(rng.integers(6, 60))
        )
        k, chunk = int(rng.integers(1, 70)), int(rng.integers(1, 70))
        _, want = _full_sort(queries @ gallery.T, k)
        got = topk_chunked(queries, gallery, k, chunk=chunk, query_chunk=int(rng.integers(1, 8)))
        np.testing.assert_array_equal(got.indices, want)


def test_topk_chunked_cosine() -> None:
    # gallery normalised: (1,0), (1,0), (0,1); query (1,1)/sqrt2 -> every cosine is 1/sqrt2,
    # a three-way tie ranked 0, 1, 2. By dot product, 3, 1, 5 rank 2, 0, 1.
    queries = np.array([[1.0, 1.0]], dtype=np.float32)
    gallery = np.array([[3.0, 0.0], [1.0, 0.0], [0.0, 5.0]], dtype=np.float32)
    assert topk_chunked(queries, gallery, 3, chunk=2).indices.tolist() == [[2, 0, 1]]
    cosine = topk_chunked(queries, gallery, 3, chunk=2, normalize=True)
    assert cosine.indices.tolist() == [[0, 1, 2]]
    np.testing.assert_allclose(cosine.scores, [[2**-0.5] * 3], rtol=1e-6)
    with pytest.raises(ValueError, match="row 1 has zero norm"):
        topk_chunked(queries, np.array([[1.0, 0.0], [0.0, 0.0]]), 1, normalize=True)


def test_topk_chunked_memmap_gallery(tmp_path) -> None:
    queries, gallery = _tied_embeddings(4, 5, 40)
    stored = np.lib.format.open_memmap(tmp_path / "g.npy", "w+", np.float32, gallery.shape)
    stored[:] = gallery
    _, want = _full_sort(queries @ gallery.T, 7)
    np.testing.assert_array_equal(topk_chunked(queries, stored, 7, chunk=6).indices, want)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"k": 0}, "k must be"),
        ({"k": 2, "chunk": 0}, "chunk must be"),
        ({"k": 2, "query_chunk": -1}, "query_chunk must be"),
    ],
)
def test_topk_chunked_rejects_bad_options(kwargs: dict, match: str) -> None:
    queries, gallery = _tied_embeddings(5, 3, 8)
    with pytest.raises(ValueError, match=match):
        topk_chunked(queries, gallery, **kwargs)


def test_topk_rejects_mismatch_and_nan() -> None:
    with pytest.raises(ValueError, match="dimension"):
        topk_chunked(np.ones((2, 3)), np.ones((4, 2)), 1)
    with pytest.raises(ValueError, match="NaN"):
        topk([[0.1, np.nan]], 1)
    with pytest.raises(ValueError, match="NaN"):
        topk_chunked(np.ones((1, 2)), np.array([[1.0, np.nan]]), 1)


def test_topk_chunked_torch_cpu_matches_numpy() -> None:
    pytest.importorskip("torch")
    queries, gallery = _tied_embeddings(6, 11, 50)
    want = topk_chunked(queries, gallery, 8, chunk=7)
    got = topk_chunked(queries, gallery, 8, chunk=7, device="cpu", query_chunk=3)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.scores, want.scores)
    assert got.indices.dtype == np.int64 and got.scores.dtype == np.float32
    # cosine on random floats (no exact ties, so rounding differences cannot reorder)
    rng = np.random.default_rng(6)
    queries, gallery = rng.normal(size=(11, 4)), rng.normal(size=(50, 4))
    want = topk_chunked(queries, gallery, 8, normalize=True)
    got = topk_chunked(queries, gallery, 8, chunk=5, device="cpu", normalize=True)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_allclose(got.scores, want.scores, rtol=1e-12)
    assert got.scores.dtype == np.float64


@pytest.mark.gpu
def test_topk_chunked_cuda_matches_numpy() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    queries, gallery = _tied_embeddings(7, 300, 5000)
    want = topk_chunked(queries, gallery, 10, chunk=777)
    got = topk_chunked(queries, gallery, 10, chunk=777, device="cuda", query_chunk=128)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.scores, want.scores)


# --- ODmAP correctness ----------------------------------------------------------------------


def test_od_relevance_by_hand() -> None:
    captions = [
        frozenset({"dog", "frisbee"}),  # 0: mentions the removed dog
        frozenset({"frisbee"}),  # 1: kept class only -> correct
        frozenset(),  # 2: no class at all -> not correct
        frozenset({"cat"}),  # 3: neither removed nor kept -> not correct
        frozenset({"person", "cat"}),  # 4: a kept class and an unrelated one -> correct
    ]
    retrieved = np.array([[0, 1, 2, 3, 4], [4, 3, 1, 0, 2]])
    removed = [{"dog"}, {"frisbee"}]
    kept = [{"frisbee", "person"}, {"cat"}]
    got = od_relevance(retrieved, captions, removed, kept)
    assert got.tolist() == [
        [False, True, False, False, True],
        [True, True, False, False, False],  # 4 has cat; 3 is cat; 1 and 0 say frisbee
    ]
    # query 0: (1/5)(P(2) + P(5)) = (1/5)(1/2 + 2/5) = 9/50; query 1: (1/5)(1 + 1) = 2/5
    assert odmap_at_k(got, 5) == pytest.approx((9 / 50 + 2 / 5) / 2)


def test_od_relevance_rejects_inconsistent_input() -> None:
    captions = [frozenset({"dog"})]
    with pytest.raises(ValueError, match="removed and kept"):
        od_relevance(np.array([[0]]), captions, [{"dog"}], [{"dog"}])
    with pytest.raises(ValueError, match="queries"):
        od_relevance(np.array([[0]]), captions, [{"dog"}], [])
    with pytest.raises(ValueError, match=r"lie in \[0, 1\)"):
        od_relevance(np.array([[1]]), captions, [set()], [{"dog"}])
    with pytest.raises(ValueError, match="integer"):
        od_relevance(np.array([[0.0]]), captions, [set()], [{"dog"}])


# --- R@K ------------------------------------------------------------------------------------


def test_recall_by_hand() -> None:
    # 3 images x 6 captions, captions 2i and 2i+1 belong to image i.
    owner = np.array([0, 0, 1, 1, 2, 2])
    sim = np.array(
        [
            [0.9, 0.1, 0.8, 0.0, 0.0, 0.0],  # image 0: own caption 0 first -> hit at 1
            [0.7, 0.0, 0.2, 0.6, 0.0, 0.0],  # image 1: 0 (0.7), 3 (0.6) -> first hit at rank 2
            [0.5, 0.5, 0.5, 0.5, 0.5, 0.5],  # image 2: all tied; own 4, 5 rank 5th and 6th
        ]
    )
    result = recall_at_k(sim, owner, ks=(1, 2, 5, 6))
    assert isinstance(result, RecallAtK)
    # i->t hits: K=1 {0}, K=2 {0,1}, K=5 {0,1,2}
    assert result.image_to_text == pytest.approx({1: 100 / 3, 2: 200 / 3, 5: 100.0, 6: 100.0})
    # t->i, rank of own image in each column (ties to the lower image index):
    # c0 [.9,.7,.5] own 0 -> 1; c1 [.1,0,.5] own 0 -> 2; c2 [.8,.2,.5] own 1 -> 3;
    # c3 [0,.6,.5] own 1 -> 1; c4 [0,0,.5] own 2 -> 1; c5 same -> 1
    # K=1: c0,c3,c4,c5 = 4/6; K=2: + c1 = 5/6; K>=3: 6/6
    assert result.text_to_image == pytest.approx({1: 400 / 6, 2: 500 / 6, 5: 100.0, 6: 100.0})
    assert recall_at_k(sim, owner).image_to_text.keys() == {1, 5, 10}


def _brute_recall(sim: np.ndarray, owner: np.ndarray, ks: tuple[int, ...]) -> RecallAtK:
    """Top-K membership on full Python sorts: a different route from the ranks in the library."""
    n_image, n_caption = sim.shape
    rows, cols = sim.tolist(), sim.T.tolist()
    i2t = [sorted(range(n_caption), key=lambda c, r=r: (-r[c], c)) for r in rows]
    t2i = [sorted(range(n_image), key=lambda i, c=c: (-c[i], i)) for c in cols]
    return RecallAtK(
        image_to_text={
            k: 100 * sum(any(owner[c] == i for c in i2t[i][:k]) for i in range(n_image)) / n_image
            for k in ks
        },
        text_to_image={
            k: 100 * sum(owner[c] in t2i[c][:k] for c in range(n_caption)) / n_caption for k in ks
        },
    )


def _random_recall_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n_image = int(rng.integers(1, 15))
    owner = np.repeat(np.arange(n_image), 5)  # the 5-captions-per-image convention
    rng.shuffle(owner)
    levels = int(rng.integers(2, 50))  # few levels: many ties
    sim = rng.integers(0, levels, (n_image, owner.size)).astype(np.float32) / levels
    return sim, owner


def test_recall_matches_brute_force() -> None:
    for seed in range(40):
        sim, owner = _random_recall_case(seed)
        ks = (1, 2, 5, 10)
        got, want = recall_at_k(sim, owner, ks), _brute_recall(sim, owner, ks)
        assert got.image_to_text == pytest.approx(want.image_to_text), seed
        assert got.text_to_image == pytest.approx(want.text_to_image), seed


def test_recall_in_small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    from counterfactual.eval.metrics import retrieval

    sim, owner = _random_recall_case(99)
    want = recall_at_k(sim, owner)
    monkeypatch.setattr(retrieval, "_BLOCK_ELEMENTS", 7)
    assert recall_at_k(sim, owner) == want


def test_recall_rejects_bad_input() -> None:
    sim = np.zeros((2, 3))
    with pytest.raises(ValueError, match="without one"):
        recall_at_k(sim, np.array([0, 0, 0]))  # image 1 has no caption
    with pytest.raises(ValueError, match="lie in"):
        recall_at_k(sim, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="integers"):
        recall_at_k(sim, np.array([0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="K must be"):
        recall_at_k(sim, np.array([0, 1, 1]), ks=(0,))
    with pytest.raises(ValueError, match="NaN"):
        recall_at_k(np.array([[np.nan, 0.0]]), np.array([0, 0]))


def _eccv_metrics():  # noqa: ANN202 - the module of an optional package
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns when ujson or tqdm are missing
        return pytest.importorskip("eccv_caption._metrics")


def test_recall_matches_eccv_caption() -> None:
    """R@K from ranked id lists by eccv-caption's own COCO 5K routine (`compute_r_at_k`)."""
    eccv = _eccv_metrics()
    for seed in range(10):
        sim, owner = _random_recall_case(seed)
        n_image, n_caption = sim.shape
        i2t = np.argsort(-sim, axis=1, kind="stable")
        t2i = np.argsort(-sim.T, axis=1, kind="stable")
        i2t_items = {i: i2t[i].tolist() for i in range(n_image)}
        t2i_items = {c: t2i[c].tolist() for c in range(n_caption)}
        i2t_gt = {i: np.flatnonzero(owner == i).tolist() for i in range(n_image)}
        t2i_gt = {c: [int(owner[c])] for c in range(n_caption)}
        got = recall_at_k(sim, owner)
        for k in (1, 5, 10):
            assert got.image_to_text[k] == pytest.approx(
                100 * eccv.compute_r_at_k(i2t_items, i2t_gt, K=k)
            )
            assert got.text_to_image[k] == pytest.approx(
                100 * eccv.compute_r_at_k(t2i_items, t2i_gt, K=k)
            )


def test_odmap_matches_eccv_caption_map_at_r() -> None:
    """With exactly R correct captions per query, ODmAP@R is Musgrave's MAP@R (eccv-caption)."""
    eccv = _eccv_metrics()
    rng = np.random.default_rng(8)
    for r in (1, 3, 5):
        scores = rng.integers(0, 6, (12, 20)).astype(np.float32)
        correct = np.zeros_like(scores, dtype=bool)
        for row in correct:
            row[rng.choice(20, r, replace=False)] = True
        ranked = np.argsort(-scores, axis=1, kind="stable")
        want = eccv.compute_eccv_metrics(
            {q: ranked[q].tolist() for q in range(12)},
            {q: np.flatnonzero(correct[q]).tolist() for q in range(12)},
        )["eccv_map_at_r"]
        assert odmap_at_k(ranked_relevance(scores, correct, r), r) == pytest.approx(want)
