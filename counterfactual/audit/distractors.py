"""Wrong-answer candidates from a pool (GD-VCR, Yin et al., 2021, section 3.3 and appendix
B, after VCR's adversarial matching): candidates must be relevant to the question and
dissimilar to the right answer and to each other.

Greedy, one candidate at a time, as the authors' ``generate_answer_choices``: among the pool
answers whose relevance to the question is at least ``min_relevance`` (other than the right
answer itself), pick the one with the lowest score

    score(c) = f(sim(c, right answer)) + sum over chosen s of f(sim(c, s))
    f(x) = x if x >= min_similarity else too_dissimilar_penalty

where ``sim`` is the cosine similarity of sentence embeddings. The penalty keeps out answers
that are unrelated altogether (trivially wrong), which the paper's code does with a similarity
floor of 0.2 and a penalty of 10. The paper's relevance is a BERT classifier trained on VCR;
here it is any callable, by default the cosine similarity of question and answer embeddings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactual.audit.embed import Embedder, embed_normalized

Relevance = Callable[[str, Sequence[str]], np.ndarray]
"""(question, answers) -> relevance of each answer to the question, higher is more relevant."""


def _normalize(text: str) -> str:
    return " ".join(text.casefold().split())


@dataclass(frozen=True, slots=True)
class DistractorConfig:
    k: int = 3
    min_relevance: float = 0.2
    min_similarity: float = 0.2
    too_dissimilar_penalty: float = 10.0

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.too_dissimilar_penalty > 1.0:
            raise ValueError(
                f"too_dissimilar_penalty must exceed 1 (any similarity), "
                f"got {self.too_dissimilar_penalty}"
            )


@dataclass(frozen=True, slots=True)
class Distractor:
    """A chosen wrong answer: its text and index in the (de-duplicated) pool, its relevance
    to the question, cosine similarity to the right answer, and its greedy score."""

    text: str
    pool_index: int
    relevance: float
    similarity_to_answer: float
    score: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "pool_index": self.pool_index,
            "relevance": self.relevance,
            "similarity_to_answer": self.similarity_to_answer,
            "score": self.score,
        }


@dataclass(frozen=True, slots=True)
class DistractorChoice:
    """``eligible`` counts pool answers relevant enough; ``complete`` is false when fewer than
    ``k`` were, and ``distractors`` holds what there was."""

    question: str
    answer: str
    distractors: tuple[Distractor, ...]
    eligible: int
    complete: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "distractors": [d.as_dict() for d in self.distractors],
            "eligible": self.eligible,
            "complete": self.complete,
        }


class DistractorSelector:
    """Embeds the pool once; call with a question and its right answer.

    The pool is de-duplicated (case and whitespace folded, first spelling kept) and blank
    entries are dropped; ``pool`` then lists what ``pool_index`` refers to.
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

    def __call__(self, question: str, answer: str) -> DistractorChoice:
        cfg = self.config
        qa = embed_normalized(self.embed, [question, answer])
        if self.relevance is None:
            relevance = self._vectors @ qa[0]
        else:
            relevance = np.asarray(self.relevance(question, self.pool), dtype=np.float64)
            if relevance.shape != (len(self.pool),):
                raise ValueError(
                    f"relevance returned shape {relevance.shape} for {len(self.pool)} answers"
                )
        sim_answer = self._vectors @ qa[1]
        answer_key = _normalize(answer)
        eligible = (relevance >= cfg.min_relevance) & np.array(
            [key != answer_key for key in self._keys]
        )
        score = np.where(eligible, self._floor(sim_answer), np.inf)
        chosen: list[Distractor] = []
        for _ in range(min(cfg.k, int(eligible.sum()))):
            best = int(np.argmin(score))  # ties: lowest pool index
            chosen.append(
                Distractor(
                    self.pool[best],
                    best,
                    float(relevance[best]),
                    float(sim_answer[best]),
                    float(score[best]),
                )
            )
            score = score + self._floor(self._pair_sim[best])
            score[best] = np.inf
        return DistractorChoice(
            question=question,
            answer=answer,
            distractors=tuple(chosen),
            eligible=int(eligible.sum()),
            complete=len(chosen) == cfg.k,
        )
