"""Evaluation metrics on plain arrays; no model is loaded here.

* :mod:`~counterfactual.eval.metrics.retrieval`: ODmAP@k (SPEC 1.5, mAP@k after Musgrave et al.,
  2020) with its correctness rule, exact streaming top-k by dot product or cosine (numpy, or
  torch on a given device), image<->text R@K and hubness (k-occurrence skewness). Ties always
  rank the lower gallery index first.
"""

from counterfactual.eval.metrics.retrieval import (
    RECALL_KS,
    Hubness,
    RecallAtK,
    TopK,
    average_precision_at_k,
    hubness,
    k_occurrence,
    od_relevance,
    odmap_at_k,
    ranked_relevance,
    recall_at_k,
    skewness,
    topk,
    topk_chunked,
)

__all__ = [
    "RECALL_KS",
    "Hubness",
    "RecallAtK",
    "TopK",
    "average_precision_at_k",
    "hubness",
    "k_occurrence",
    "od_relevance",
    "odmap_at_k",
    "ranked_relevance",
    "recall_at_k",
    "skewness",
    "topk",
    "topk_chunked",
]
