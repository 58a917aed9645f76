"""Question templates (GD-VCR, Yin et al., 2021, section 3.2.1, its footnote 8, and appendix
A.2): content words become POS tags while question words and auxiliaries stay, and the
templates are clustered with K-Means on their sentence embeddings (at most 20 clusters, 200
iterations).

Three tag modes (:data:`TAG_MODES`), all with spaCy's tagger (the paper used NLTK's, which
gives the same Penn Treebank tag set):

* ``fine`` (the paper's text): nouns, proper nouns, verbs, adjectives and adverbs (spaCy POS
  ``NOUN PROPN VERB ADJ ADV``) become their fine-grained Penn tag (``NN NNP VBG JJ RB`` ...);
  question words (tags ``WDT WP WP$ WRB``) and auxiliaries (POS ``AUX``: is, does, can, will)
  stay as words. "Why is Casey acting so strangely?" -> "why is NNP VBG RB RB ?".
* ``all`` (the footnote's example): question words stay, every other word becomes its Penn
  tag, auxiliaries included: "What is Casey doing?" -> "what VBZ NNP VBG ?".
* ``coarse`` (this project's earlier rule): ``NOUN PROPN ADJ VERB NUM`` become their universal
  POS, adverbs stay: "What is Casey doing?" -> "what is PROPN VERB ?".

In every mode punctuation and the other kept tokens are lower-cased, and tokens are joined by
single spaces.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactual._lazy import require
from counterfactual.models.runtime import check_batch_size
from counterfactual.tools.audit.embed import Embedder, embed_normalized

TAG_MODES = ("fine", "coarse", "all")
FINE_POS = frozenset({"NOUN", "PROPN", "VERB", "ADJ", "ADV"})
"""Replaced by their Penn tag in ``fine`` mode."""
CONTENT_POS = frozenset({"NOUN", "PROPN", "ADJ", "VERB", "NUM"})
"""Replaced by their universal POS in ``coarse`` mode."""
QUESTION_TAGS = frozenset({"WDT", "WP", "WP$", "WRB"})
"""Penn tags of question words (which, what, whose, why, how, where, ...), kept as words."""


def _check_mode(tags: str) -> None:
    if tags not in TAG_MODES:
        raise ValueError(f"tags must be one of {', '.join(TAG_MODES)}; got {tags!r}")


def _token_template(token: Any, tags: str) -> str:
    if tags == "coarse":
        return token.pos_ if token.pos_ in CONTENT_POS else token.text.lower()
    if token.tag_ in QUESTION_TAGS or token.pos_ == "PUNCT":
        return token.text.lower()
    if tags == "all" or (token.pos_ in FINE_POS and token.pos_ != "AUX"):
        return token.tag_
    return token.text.lower()


def question_template(doc: Iterable[Any], tags: str = "fine") -> str:
    """The template of one parsed question (a spaCy ``Doc`` or any sequence of tokens with
    ``text``, ``tag_`` and ``pos_``) in tag mode ``tags``."""
    _check_mode(tags)
    return " ".join(_token_template(token, tags) for token in doc if not token.is_space)


class QuestionTemplater:
    """Questions -> templates with one spaCy pipeline (needs a tagger and the attribute
    ruler, which sets ``AUX``), loaded by the caller."""

    def __init__(self, nlp: Any, tags: str = "fine", batch_size: int = 256) -> None:
        _check_mode(tags)
        check_batch_size(batch_size)
        self.nlp = nlp
        self.tags = tags
        self.batch_size = batch_size

    def __call__(self, questions: Sequence[str]) -> list[str]:
        docs = self.nlp.pipe(list(questions), batch_size=self.batch_size)
        return [question_template(doc, self.tags) for doc in docs]


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
    """K-Means (scikit-learn) over the unit-length embeddings of the distinct templates, each
    weighted by how many questions have it (the same as clustering every question), with
    ``min(n_clusters, #distinct embeddings)`` clusters.

    As the paper: at most ``n_clusters`` (20) clusters and ``max_iter`` (200) Lloyd
    iterations, stopping earlier only when no assignment changes (``tol=0``). The paper
    gives no rule for choosing k below 20 (the authors' script used 10); the initialisation
    here is k-means++, best of 10 seeded runs, where the script used one random draw.
    """
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
    kmeans = cluster.KMeans(n_clusters=k, n_init=10, max_iter=max_iter, tol=0.0, random_state=seed)
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
