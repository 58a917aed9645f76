"""The class mentions of a whole caption gallery (616K COCO captions) on Ray: one
:class:`~counterfactual.eval.mentions.MentionIndexer` per actor (spaCy loaded once), captions in
blocks. The result equals the in-process indexer's, caption for caption.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from counterfactual.eval.mentions import MentionIndexer
from counterfactual.pipelines.options import RayOptions
from counterfactual.pipelines.session import init_ray, owns_ray, ray_temp_dir, stop_ray
from counterfactual.vocab import ClassVocabulary


class MentionActor:
    """A Ray Data actor: a batch of ``{"index", "text"}`` rows -> ``{"index", "classes"}``, the
    classes joined by ``"|"`` (class names never contain one)."""

    def __init__(self, vocabulary: ClassVocabulary, spacy_model: str, batch_size: int) -> None:
        self.indexer = MentionIndexer(vocabulary, spacy_model, batch_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        found = self.indexer([str(t) for t in batch["text"]])
        return {
            "index": batch["index"],
            "classes": np.asarray(["|".join(sorted(s)) for s in found], dtype=object),
        }


def index_mentions_ray(
    texts: Sequence[str],
    indexer: MentionIndexer,
    work_dir: Path,
    options: RayOptions | None = None,
    block: int = 4096,
) -> list[frozenset[str]]:
    """``indexer(texts)``, computed by an actor pool over the cluster's CPUs (or
    ``options.cpu_actors`` actors), ``block`` captions per batch. A local Ray it starts keeps
    its files in a fresh :func:`ray_temp_dir` (outside ``work_dir``), and is stopped and the
    folder removed before it returns."""
    options = options or RayOptions()
    temp = ray_temp_dir() if owns_ray(options) else None
    try:
        return _index(texts, indexer, work_dir, options, block, temp)
    finally:
        if temp is not None:
            stop_ray(temp)


def _index(
    texts: Sequence[str],
    indexer: MentionIndexer,
    work_dir: Path,
    options: RayOptions,
    block: int,
    temp: Path | None,
) -> list[frozenset[str]]:
    import pyarrow as pa
    import ray

    info = init_ray(work_dir, options, temp)
    actors = options.cpu_actors or max(1, int(info["cpus"]))
    table = pa.table({"index": np.arange(len(texts), dtype=np.int64), "text": list(texts)})
    blocks = [table.slice(start, block) for start in range(0, len(texts), block)]
    ds = ray.data.from_arrow(blocks).map_batches(
        MentionActor,
        fn_constructor_kwargs={
            "vocabulary": indexer.vocabulary,
            "spacy_model": indexer.model_name,
            "batch_size": indexer.batch_size,
        },
        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=actors),
        num_cpus=1,
        batch_size=block,
        batch_format="numpy",
    )
    empty: frozenset[str] = frozenset()
    found: list[frozenset[str]] = [empty] * len(texts)
    seen = 0
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        for i, joined in zip(batch["index"].tolist(), batch["classes"].tolist(), strict=True):
            found[i] = frozenset(joined.split("|")) if joined else empty
            seen += 1
    if seen != len(texts):
        raise RuntimeError(f"Ray returned {seen} mention sets for {len(texts)} captions")
    return found
