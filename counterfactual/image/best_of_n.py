"""Best-of-n inpainting: several seeded candidates per request, a scorer keeps the best.

Diffusion inpainters often redraw the object they were asked to erase; drawing ``n`` candidates
(seeds derived from the request's seed, the first one *is* the request's seed) and keeping the
one a zero-shot model finds the removed classes least in
(:class:`counterfactual.method.verify.RemovalScorer`) is a cheap way to raise the removal rate.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from counterfactual.image.base import Edited, EditRequest, ImageEditor
from counterfactual.imageio import SampleError

Scorer = Callable[[EditRequest, Sequence[np.ndarray]], list[float]]
"""One score per candidate; lower is better."""


def candidate_seed(seed: int, index: int) -> int:
    """The seed of candidate ``index`` of a request with ``seed``: ``seed`` itself for the first,
    so ``n = 1`` is the plain editor; a stable hash for the others."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class BestOfN:
    """An :class:`ImageEditor` around ``editor``: ``n`` candidates per request, all made in one
    call of ``editor`` (so they batch on the GPU), the lowest ``scorer`` score kept (ties: the
    earlier candidate). A candidate whose output failed its check (a ``SampleError``) is not
    scored (its score is ``None``); when all fail, the request gets the first failure. After
    each call, ``choices[i]`` holds request ``i``'s pick and scores."""

    def __init__(self, editor: ImageEditor, n: int, scorer: Scorer) -> None:
        if n < 1:
            raise ValueError(f"candidates must be >= 1, got {n}")
        self.editor = editor
        self.n = n
        self.scorer = scorer
        self.choices: list[dict[str, Any]] = []

    def describe(self) -> dict[str, Any]:
        picked_by = getattr(self.scorer, "describe", lambda: {})()
        return {**self.editor.describe(), "candidates": self.n, "picked_by": picked_by}

    def __call__(self, batch: Sequence[EditRequest]) -> list[Edited]:
        expanded = [
            replace(r, seed=candidate_seed(r.seed, i)) for r in batch for i in range(self.n)
        ]
        images = list(self.editor(expanded))
        if len(images) != len(expanded):
            raise ValueError(f"editor returned {len(images)} images for {len(expanded)} requests")
        out: list[Edited] = []
        self.choices = []
        for j, request in enumerate(batch):
            candidates = images[j * self.n : (j + 1) * self.n]
            good = [i for i, c in enumerate(candidates) if not isinstance(c, SampleError)]
            if not good:
                out.append(candidates[0])
                self.choices.append({"picked": None, "seed": None, "scores": [None] * self.n})
                continue
            scored = [float(s) for s in self.scorer(request, [candidates[i] for i in good])]
            scores: list[float | None] = [None] * self.n
            for i, score in zip(good, scored, strict=True):
                scores[i] = score
            best = good[int(np.argmin(scored))]
            out.append(candidates[best])
            self.choices.append(
                {"picked": best, "seed": expanded[j * self.n + best].seed, "scores": scores}
            )
        return out
