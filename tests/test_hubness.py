"""Hubness (Radovanović et al., JMLR 2010): the k-occurrence N_k of each gallery caption, its
skewness and the largest top-1 share, computed by hand on tiny galleries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from counterfactual.eval.evalset import Query
from counterfactual.eval.evaluate import EvalConfig, odmap_scores
from counterfactual.eval.metrics import hubness, k_occurrence, skewness

# 3 queries, 4 gallery captions, top-2 rows each (best first)
TOP = np.array([[0, 1], [0, 2], [0, 1]])


def test_k_occurrence_by_hand() -> None:
    assert k_occurrence(TOP, 4, 1).tolist() == [3, 0, 0, 0]
    assert k_occurrence(TOP, 4, 2).tolist() == [3, 2, 1, 0]


def test_hubness_by_hand() -> None:
    hub = hubness(TOP, 4, [2, 1])
    # N_1 = [3, 0, 0, 0]: mu 3/4, deviations 9/4 and three -3/4; m2 = 27/16, m3 = 81/32;
    # skewness = (81/32) / (27/16)^1.5 = 2 / sqrt(3)
    assert hub.skewness[1] == pytest.approx(2 / math.sqrt(3))
    # N_2 = [3, 2, 1, 0] is symmetric about its mean: no skew
    assert hub.skewness[2] == pytest.approx(0.0)
    assert list(hub.skewness) == [1, 2]
    assert (hub.top1_share, hub.top1_item) == (1.0, 0)


def test_hubness_share_and_skew_of_an_uneven_gallery() -> None:
    top = np.array([[0, 1], [0, 2], [3, 1]])
    hub = hubness(top, 4, [1])
    # N_1 = [2, 0, 0, 1]: mu 3/4, m2 = 11/16, m3 = 9/32
    assert hub.skewness[1] == pytest.approx((9 / 32) / (11 / 16) ** 1.5)
    assert hub.top1_share == pytest.approx(2 / 3) and hub.top1_item == 0
    # every caption retrieved once: no hub, skewness 0 (sigma 0 is no skew, not NaN)
    even = hubness(np.array([[0], [1], [2]]), 3, [1])
    assert even.skewness == {1: 0.0} and even.top1_share == pytest.approx(1 / 3)


def test_skewness_matches_the_textbook_formula() -> None:
    x = np.random.default_rng(0).gamma(2.0, size=500)
    m = x.mean()
    expected = np.mean((x - m) ** 3) / np.mean((x - m) ** 2) ** 1.5
    assert skewness(x) == pytest.approx(expected)
    assert skewness([5, 5, 5]) == 0.0


@pytest.mark.parametrize(
    ("top", "gallery", "ks", "match"),
    [
        (np.array([[0, 4]]), 4, [1], r"in \[0, 4\)"),
        (np.array([[0]]), 4, [2], "1 columns"),
        (np.array([[0.0]]), 4, [1], "integer"),
        (np.zeros((0, 1), np.int64), 4, [1], "query"),
        (np.array([[0]]), 0, [1], "gallery"),
        (np.array([[0]]), 4, [0], "positive"),
    ],
)
def test_hubness_rejects_bad_input(top: np.ndarray, gallery: int, ks: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        hubness(top, gallery, ks)


def test_odmap_scores_report_the_hubness_of_their_top_k() -> None:
    """The eval's hubness is the top-k it already has: caption 0 is every query's nearest."""
    gallery = np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [-1.0, 0.0]], np.float32)
    queries = np.array([[1.0, 0.1], [0.9, 0.2], [1.0, -0.3]], np.float32)
    mentions = [frozenset({"dog"}), frozenset({"cat"}), frozenset({"dog"}), frozenset()]
    rows = [Query(f"q{i}", None, str(i), None, ("cat",), ("dog",), "", "") for i in range(3)]  # type: ignore[arg-type]
    scores = odmap_scores(queries, rows, gallery, mentions, EvalConfig(odmap_ks=(1, 2), curve_k=2))
    # by hand: every query ranks caption 0 (scores 1.0, 0.9, 1.0) then caption 2 (0.68, 0.70,
    # 0.36): N_1 = [3, 0, 0, 0], N_2 = [3, 0, 3, 0] (symmetric: skewness 0)
    assert scores.top.tolist() == [[0, 2], [0, 2], [0, 2]]
    assert scores.hubness.top1_share == 1.0 and scores.hubness.top1_item == 0
    assert scores.hubness.skewness[1] == pytest.approx(2 / math.sqrt(3))
    assert scores.hubness.skewness[2] == pytest.approx(0.0)
