"""A run folder's shards as a Ray Dataset.

``ray.data.read_webdataset(OUT)`` opens every file of the folder as a tar (``README.md``, the
json and png files too) and fails; :func:`ray_dataset` reads only the shards that hold
samples (:func:`counterfactual.load.shard_urls`), the same as
``ray.data.read_webdataset(OUT, file_extensions=["tar"])`` without the empty shards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from counterfactual import fs
from counterfactual.load import shard_urls


def ray_dataset(out: fs.PathLike, **options: Any) -> Any:
    """A ``ray.data.Dataset`` with a row per sample: ``jpg`` (decoded, ``uint8`` HxWx3
    array), ``txt`` (str), ``json`` (dict), ``__key__``, ``__url__``. ``options`` go to
    ``ray.data.read_webdataset`` (``decoder``, ``override_num_blocks``...). Ray starts locally
    on first use unless ``ray.init`` (or ``RAY_ADDRESS``) says otherwise."""
    import ray

    return ray.data.read_webdataset(shard_urls(out), **options)


__all__: Sequence[str] = ("ray_dataset",)
