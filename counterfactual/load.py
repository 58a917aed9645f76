"""A run folder's shards into training, with any number of DataLoader workers.

A run folder (``synth``'s OUT, or ``mix --unpair``'s) holds more than shards: ``README.md``,
json and png files, and shards that hold no sample (written empty so that brace ranges keep
working). :func:`shard_urls` lists the shards that hold samples from the folder's
``sizes.json`` (rebuilt at the end of every run); :func:`webdataset` is a WebDataset pipeline
over them that webdataset 0.2.x and 1.x both run with more DataLoader workers than shards: a
worker without a shard yields nothing (1.x would raise "No samples found"), and an epoch set
with ``with_epoch`` ends for a worker whose pass yields nothing (0.2.x would loop forever).
Samples are what the shards hold: ``jpg`` (JPEG bytes), ``txt`` (UTF-8 caption), ``json``
(the sample's record), ``__key__`` and ``__url__``. Ray Data reads the same list:
``ray.data.read_webdataset(shard_urls(OUT))``.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

from counterfactual import fs
from counterfactual.messages import one_line, short
from counterfactual.shards.indexes import SIZES_FILE


def shard_sizes(out: fs.PathLike) -> dict[str, int]:
    """Samples by shard file name, every committed shard of the run folder ``out`` (a local
    path or an fsspec URL), from its ``sizes.json``. ``ValueError`` when there is none (not a
    run folder, or a run that never finished) or it is not a JSON object of counts."""
    path = fs.join(out, SIZES_FILE)
    if not fs.exists(path):
        raise ValueError(
            one_line(
                f"{short(str(out))} has no {SIZES_FILE}: not a counterfactual run folder, or a "
                "run that has not finished (rerun the same synth command to finish it)"
            )
        )
    try:
        sizes = json.loads(fs.read_text(path))
    except ValueError as err:
        raise ValueError(one_line(f"{path}: not JSON ({err})")) from err
    if not isinstance(sizes, dict) or not all(
        isinstance(k, str) and isinstance(n, int) and not isinstance(n, bool)
        for k, n in sizes.items()
    ):
        raise ValueError(one_line(f"{path}: not an object of shard names and sample counts"))
    return sizes


def shard_urls(out: fs.PathLike) -> list[str]:
    """The shards of the run folder ``out`` that hold samples, in shard order, as absolute
    paths (or URLs) under ``out``. ``ValueError`` when no shard holds a sample (``counterfactual report
    OUT`` says why)."""
    sizes = shard_sizes(out)
    folder = fs.as_path(out)
    if not fs.is_url(folder):
        folder = os.path.abspath(folder)  # Ray's workers have another working folder
    urls = [str(fs.join(folder, name)) for name, n in sorted(sizes.items()) if n > 0]
    if not urls:
        raise ValueError(
            one_line(
                f"no shard of {short(str(out))} holds a sample ({len(sizes)} empty); "
                f"counterfactual report {out} says why"
            )
        )
    return urls


def webdataset(out: fs.PathLike, **options: Any) -> Any:
    """A ``webdataset.WebDataset`` over :func:`shard_urls` of ``out``, split by node
    (``torch.distributed`` rank) and by DataLoader worker, each worker reading whole shards in
    order; chain ``.shuffle``, ``.decode``, ``.to_tuple``, ``.batched`` and ``.with_epoch`` as
    usual. A worker that gets no shard, or whose pass over its shards yields nothing (fewer
    samples than a batch of ``batched(n, partial=False)``), ends its epoch. ``options`` go to
    ``WebDataset`` (``shardshuffle``, ``handler``, ``cache_dir``...)."""
    wds = _webdataset_module()
    kwargs: dict[str, Any] = {"shardshuffle": False, "nodesplitter": wds.split_by_node}
    accepted = inspect.signature(wds.WebDataset.__init__).parameters
    if "empty_check" in accepted:  # webdataset 1.x: no error for a worker without a shard
        kwargs |= {"empty_check": False, "workersplitter": wds.split_by_worker}
    return _ending_class()(shard_urls(out), **(kwargs | options))


def _webdataset_module() -> Any:
    import webdataset

    return webdataset


@functools.cache
def _ending_class() -> type:
    """``WebDataset`` whose repeated passes (``with_epoch``, ``repeat``) stop at the first pass
    that yields nothing, as webdataset 1.x's do and 0.2.x's do not."""
    wds = _webdataset_module()

    class EndingWebDataset(wds.WebDataset):  # type: ignore[misc, name-defined]
        def iterator(self) -> Iterator[Any]:
            for _ in range(self.repetitions):
                count = 0
                for sample in self.iterator1():
                    count += 1
                    yield sample
                if count == 0:
                    return

    return EndingWebDataset


__all__: Sequence[str] = ("shard_sizes", "shard_urls", "webdataset")
