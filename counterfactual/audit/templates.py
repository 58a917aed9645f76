"""Question templates (GD-VCR, Yin et al., 2021, section 3.2.1 and appendix A.2): content
words are replaced by their POS tags, keeping question words and auxiliaries
("What is Casey doing?" -> "what is PROPN VERB ?"), and the templates are clustered with
K-Means on their sentence embeddings (at most 20 clusters, 200 iterations in the paper).

POS tags are spaCy's universal tags; other tokens are lower-cased, and tokens are joined by
single spaces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactual._lazy import require
from counterfactual.audit.embed import Embedder, embed_normalized

CONTENT_POS = frozenset({"NOUN", "PROPN", "ADJ", "VERB", "NUM"})


def question_template(doc: Iterable[Any], content_pos: frozenset[str] = CONTENT_POS) -> str:
    """The template of one parsed question (a spaCy ``Doc`` or any sequence of tokens with
    ``pos_`` and ``text``)."""
    return " ".join(
        token.pos_ if token.pos_ in content_pos else token.text.lower()
        for token in doc
        if not token.is_space
    )


class QuestionTemplater:
    """Questions -> templates with one spaCy pipeline (needs a tagger), loaded by the caller."""

    def __init__(
        self, nlp: Any, content_pos: frozenset[str] = CONTENT_POS, batch_size: int = 256
    ) -> None:
        if not content_pos:
            raise ValueError("content_pos must name at least one POS tag")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.nlp = nlp
        self.content_pos = frozenset(content_pos)
        self.batch_size = batch_size

    def __call__(self, questions: Sequence[str]) -> list[str]:
        docs = self.nlp.pipe(list(questions), batch_size=self.batch_size)
        return [question_template(doc, self.content_pos) for doc in docs]


@dataclass(frozen=True, slots=True)
class TemplateCount:
    template: str
    count: int


@dataclass(frozen=True, slots=True)
class TemplateCluster:
    """``size`` counts questions; ``templates`` are the distinct templates in the cluster, most
    frequent first (ties by text); ``representative`` is the first of them."""

    cluster: int
    size: int
    representative: str
    templates: tuple[TemplateCount, ...]

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "size": self.size,
            "representative": self.representative,
            "templates": [{"template": t.template, "count": t.count} for t in self.templates[:top]],
        }


@dataclass(frozen=True, slots=True)
class TemplateClustering:
    """``templates[i]`` and ``labels[i]`` belong to question ``i``. Clusters are numbered by
    decreasing size (ties: the one whose first question comes first)."""

    templates: tuple[str, ...]
    labels: tuple[int, ...]
    clusters: tuple[TemplateCluster, ...]

    def as_dict(self, top: int | None = 5) -> dict[str, Any]:
        return {
            "questions": len(self.templates),
            "distinct_templates": len(set(self.templates)),
            "clusters": [c.as_dict(top) for c in self.clusters],
        }


def cluster_templates(
    templates: Sequence[str],
    embed: Embedder,
    n_clusters: int = 20,
    seed: int = 0,
    max_iter: int = 200,
) -> TemplateClustering:
    """K-Means (scikit-learn) over the embeddings of the distinct templates, each weighted by
    how many questions have it, with ``min(n_clusters, #distinct embeddings)`` clusters."""
    if n_clusters < 1:
        raise ValueError(f"n_clusters must be >= 1, got {n_clusters}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter}")
    if not templates:
        raise ValueError("no questions to cluster")
    counts = Counter(templates)
    distinct = list(counts)  # first-occurrence order
    vectors = embed_normalized(embed, distinct)
    k = min(n_clusters, len(np.unique(vectors, axis=0)))  # no more clusters than points
    cluster = require("sklearn.cluster", "tools")
    kmeans = cluster.KMeans(n_clusters=k, n_init=10, max_iter=max_iter, random_state=seed)
    raw = kmeans.fit_predict(vectors, sample_weight=np.array([counts[t] for t in distinct]))
    label_of = dict(zip(distinct, (int(x) for x in raw), strict=True))
    sizes = Counter(label_of[t] for t in templates)
    first = {}
    for i, template in enumerate(templates):
        first.setdefault(label_of[template], i)
    order = sorted(sizes, key=lambda c: (-sizes[c], first[c]))
    renumber = {old: new for new, old in enumerate(order)}
    clusters = []
    for old in order:
        members = sorted(
            (TemplateCount(t, counts[t]) for t in distinct if label_of[t] == old),
            key=lambda tc: (-tc.count, tc.template),
        )
        clusters.append(
            TemplateCluster(renumber[old], sizes[old], members[0].template, tuple(members))
        )
    return TemplateClustering(
        templates=tuple(templates),
        labels=tuple(renumber[label_of[t]] for t in templates),
        clusters=tuple(clusters),
    )
