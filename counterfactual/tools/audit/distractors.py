"""Wrong-answer candidates from a pool (GD-VCR, Yin et al., 2021, section 3.3 and appendix
B, after VCR's adversarial matching): candidates must be relevant to the question and
dissimilar to the right answer and to each other.

Both methods score a candidate ``c`` against the right answer and the candidates already
picked, with the sentence-embedding cosine ``sim``:

    score(c) = f(sim(c, right answer)) + sum over picked s of f(sim(c, s))
    f(x) = x if x >= min_similarity else too_dissimilar_penalty

The penalty keeps out answers unrelated altogether (trivially wrong); the authors used a
floor of 0.2 and a penalty of 10. Pool answers equal to the right answer (case and spaces
folded) are never candidates.

* ``authors`` (:data:`METHODS`, the default): ``generate_answer_choices`` of the authors'
  ``build_dataset/similarity.py`` (github.com/WadeYin9712/GD-VCR). The pool, in its given
  order (not ranked), is cut into ``k`` consecutive buckets of ``len(pool) // k`` answers; the
  last ``len(pool) % k`` answers are never candidates. Pick ``i`` is the lowest-scoring
  answer of bucket ``i`` whose relevance is above ``min_relevance`` (strictly, as the code).
  A bucket with no such answer leaves its pick out (the script then reused index -1).
* ``greedy``: among all pool answers with relevance ``>= min_relevance``, pick the lowest
  score, ``k`` times. Not the authors' algorithm: it ignores the buckets, so it can take
  several picks from one part of the pool.

The paper's relevance is the probability of a BERT-base classifier trained on VCR pairs (its
threshold 0.9); that model was not released, so relevance here is any callable, by default
the cosine similarity of question and answer embeddings (threshold 0.2 by default). The
pool is de-duplicated before the buckets are cut, which the script did not do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactual.options import declare
from counterfactual.tools.audit.embed import Embedder, embed_normalized

Relevance = Callable[[str, Sequence[str]], np.ndarray]
"""(question, answers) -> relevance of each answer to the question, higher is more relevant."""

METHODS = ("authors", "greedy")
TOO_FEW_RELEVANT = "too-few-relevant"
"""``DistractorChoice.reason`` when fewer than ``k`` picks were possible."""


def _normalize(text: str) -> str:
    return " ".join(text.casefold().split())


@dataclass(frozen=True, slots=True)
class DistractorConfig:
    """``min_relevance``: relevance threshold (``authors``: strictly above; ``greedy``: at
    least). ``min_similarity``: cosine below which ``too_dissimilar_penalty`` replaces it."""

    k: int = declare(
        3,
        help="wrong answers picked per question, >= 1 (default: %(default)s)",
        kind="positive_int",
    )
    method: str = declare(
        "authors",
        help="how wrong answers are picked, see below (default: %(default)s, the paper's)",
        choices=METHODS,
    )
    min_relevance: float = declare(
        0.2,
        help="a candidate's relevance (question-answer cosine similarity) must exceed R "
        "(greedy: reach R) (default: %(default)s)",
        kind="finite_float",
        metavar="R",
    )
    min_similarity: float = declare(
        0.2,
        help="a cosine similarity below S counts as 10 in a candidate's score, in [-1, 1] "
        "(default: %(default)s)",
        kind="cosine",
        metavar="S",
    )
    too_dissimilar_penalty: float = 10.0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if not math.isfinite(self.min_relevance):
            raise ValueError(f"min_relevance must be a finite number, got {self.min_relevance}")
        if not -1.0 <= self.min_similarity <= 1.0:
            raise ValueError(
                f"min_similarity must be a cosine in [-1, 1], got {self.min_similarity}"
            )
        if not 1.0 < self.too_dissimilar_penalty < math.inf:
            raise ValueError(
                f"too_dissimilar_penalty must exceed 1 (any similarity) and be finite, "
                f"got {self.too_dissimilar_penalty}"
            )


@dataclass(frozen=True, slots=True)
class Distractor:
    """A chosen wrong answer: its text and index in the (de-duplicated) pool, its relevance
    to the question, cosine similarity to the right answer, and its score when picked.
    ``bucket``: the pool bucket it came from (``authors``), else ``None``."""

    text: str
    pool_index: int
    relevance: float
    similarity_to_answer: float
    score: float
    bucket: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "pool_index": self.pool_index,
            "relevance": self.relevance,
            "similarity_to_answer": self.similarity_to_answer,
            "score": self.score,
            "bucket": self.bucket,
        }


@dataclass(frozen=True, slots=True)
class DistractorChoice:
    """``eligible`` counts the pool answers that could be picked (relevant enough, not the
    right answer, and for ``authors`` inside a bucket). ``complete`` is false when fewer than
    ``k`` were picked; ``reason`` is then :data:`TOO_FEW_RELEVANT`, else ``None``."""

    question: str
    answer: str
    distractors: tuple[Distractor, ...]
    eligible: int
    complete: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "distractors": [d.as_dict() for d in self.distractors],
            "eligible": self.eligible,
            "complete": self.complete,
            "reason": self.reason,
        }


class DistractorSelector:
    """Embeds the pool once; call with a question and its right answer.

    The pool is de-duplicated (case and whitespace folded, first spelling kept) and blank
    entries are dropped; ``pool`` then lists what ``pool_index`` refers to, in order.
    """

    def __init__(
        self,
        pool: Sequence[str],
        embed: Embedder,
        config: DistractorConfig | None = None,
        relevance: Relevance | None = None,
    ) -> None:
        self.config = config or DistractorConfig()
        unique: dict[str, str] = {}
        for text in pool:
            key = _normalize(text)
            if key:
                unique.setdefault(key, text.strip())
        if not unique:
            raise ValueError("the answer pool is empty")
        self.pool = tuple(unique.values())
        self._keys = tuple(unique)
        self.embed = embed
        self.relevance = relevance
        self._vectors = embed_normalized(embed, self.pool)
        self._pair_sim = self._vectors @ self._vectors.T

    def _floor(self, sim: np.ndarray) -> np.ndarray:
        cfg = self.config
        return np.where(sim >= cfg.min_similarity, sim, cfg.too_dissimilar_penalty)

    def _relevance(self, question: str, question_vector: np.ndarray) -> np.ndarray:
        if self.relevance is None:
            return self._vectors @ question_vector
        relevance = np.asarray(self.relevance(question, self.pool), dtype=np.float64)
        if relevance.shape != (len(self.pool),):
            raise ValueError(
                f"relevance returned shape {relevance.shape} for {len(self.pool)} answers"
            )
        return relevance

    def buckets(self) -> list[range]:
        """The pool indices of each ``authors`` bucket, in pick order."""
        size = len(self.pool) // self.config.k
        return [range(i * size, (i + 1) * size) for i in range(self.config.k)]

    def _slots(self) -> list[tuple[int | None, np.ndarray]]:
        """One (bucket, mask of the pool answers it may pick) per pick."""
        n = len(self.pool)
        if self.config.method == "greedy":
            return [(None, np.ones(n, dtype=bool))] * self.config.k
        slots = []
        for i, bucket in enumerate(self.buckets()):
            mask = np.zeros(n, dtype=bool)
            mask[bucket.start : bucket.stop] = True
            slots.append((i, mask))
        return slots

    def __call__(self, question: str, answer: str) -> DistractorChoice:
        cfg = self.config
        qa = embed_normalized(self.embed, [question, answer])
        relevance = self._relevance(question, qa[0])
        sim_answer = self._vectors @ qa[1]
        answer_key = _normalize(answer)
        not_answer = np.array([key != answer_key for key in self._keys])
        if cfg.method == "authors":
            relevant = relevance > cfg.min_relevance
        else:
            relevant = relevance >= cfg.min_relevance
        allowed = relevant & not_answer
        slots = self._slots()
        score = self._floor(sim_answer)
        taken = np.zeros(len(self.pool), dtype=bool)
        chosen: list[Distractor] = []
        for bucket, inside in slots:
            open_ = allowed & inside & ~taken
            if not open_.any():
                continue
            best = int(np.argmin(np.where(open_, score, np.inf)))  # ties: lowest pool index
            chosen.append(
                Distractor(
                    self.pool[best],
                    best,
                    float(relevance[best]),
                    float(sim_answer[best]),
                    float(score[best]),
                    bucket,
                )
            )
            taken[best] = True
            score = score + self._floor(self._pair_sim[best])
        in_reach = np.logical_or.reduce([inside for _, inside in slots])
        complete = len(chosen) == cfg.k
        return DistractorChoice(
            question=question,
            answer=answer,
            distractors=tuple(chosen),
            eligible=int((allowed & in_reach).sum()),
            complete=complete,
            reason=None if complete else TOO_FEW_RELEVANT,
        )
