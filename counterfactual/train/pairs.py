"""D ∪ D' from ``synth --pairs`` shards alone: their originals as shards of their own.

A pair sample holds the edited picture (``jpg``) with its new caption (``txt``), and the
original picture (``orig.jpg``) whose caption is the json's ``original_caption``. The original
side of the paper's D ∪ D' is then those originals: :func:`write_originals` writes them as
ordinary WebDataset shards (``orig-NNNNNN.tar``: ``KEY.jpg`` the original picture, ``KEY.txt``
its caption, ``KEY.json`` where it came from), each with its stats file (``count``, read by
:func:`counterfactual.train.mix.count_samples`) and a ``sizes.json`` for open_clip, so
``counterfactual mix``, ``counterfactual train`` and open_clip read them like any original
shards, the pair shards being the synthetic side. No source dataset is needed.

One original is one (image, caption): several samples made from the same picture and caption
(``--policy all``: one per removable class) share it, and it is written once; its key is
``sample_key(image_id, caption_id)``. Shards are written in the order of the pair shards, one
originals shard per pair shard, so the output depends only on the input; from fewer pair
shards than ``min_shards`` (:data:`MIN_SHARDS`, the DataLoader workers a trainer often runs),
the originals are split evenly over ``min_shards`` shards (fewer when there are fewer
originals), in the same order, so that no loader worker is left without a shard.
"""

from __future__ import annotations

import bisect
import itertools
import json
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from counterfactual import fs
from counterfactual.readers.corpus import member_key_field
from counterfactual.records import Status
from counterfactual.shards.indexes import LOADER_WORKERS, SIZES_FILE, IndexedShard, sizes_json
from counterfactual.shards.shards import (
    ORIGINALS_PREFIX,
    Sample,
    ShardStats,
    ShardWriter,
    sample_key,
)
from counterfactual.train.mix import ShardSpec, expand_shards

MIN_SHARDS = LOADER_WORKERS
"""The fewest originals shards :func:`write_originals` writes when there are originals enough."""
PAIR_FIELDS = ("json", "orig.jpg")
"""The members of a pair sample :func:`iter_originals` reads (the rest are skipped)."""


@dataclass(frozen=True, slots=True)
class Original:
    """One original of a pair shard: the picture's bytes as stored (``orig.jpg``), its caption,
    and the json fields that say where it came from."""

    key: str
    jpg: bytes
    caption: str
    meta: dict[str, object]


@dataclass(frozen=True, slots=True)
class Unpaired:
    """What :func:`write_originals` wrote: the originals shards, their counts, and the pair
    samples they came from."""

    shards: tuple[str, ...]
    counts: tuple[int, ...]
    pairs: int

    @property
    def originals(self) -> int:
        return sum(self.counts)


def iter_originals(shard: fs.PathLike) -> Iterator[Original]:
    """The originals of one pair shard, in order, each (image, caption) once. ``ValueError``
    naming the shard and sample when a sample has no ``orig.jpg`` (a run made without
    ``--pairs``) or no valid json."""
    seen: set[str] = set()
    for key, fields in _pair_samples(shard):
        original = _original(shard, key, fields)
        if original.key not in seen:
            seen.add(original.key)
            yield original


def _original(shard: fs.PathLike, key: str, fields: dict[str, bytes]) -> Original:
    if "orig.jpg" not in fields:
        raise ValueError(
            f"{shard}: sample {key} holds no orig.jpg; make the run with synth --pairs"
        )
    try:
        meta = json.loads(fields["json"])
        image_id, caption_id = str(meta["image_id"]), str(meta["caption_id"])
        caption = str(meta["original_caption"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{shard}: sample {key}: not a pair sample's json ({err!r})") from err
    source = {k: meta.get(k) for k in ("dataset", "split", "image_id", "file", "caption_id")}
    return Original(
        sample_key(image_id, caption_id), fields["orig.jpg"], caption, {**source, "pair": key}
    )


def _pair_samples(shard: fs.PathLike) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {field: bytes})`` of each sample, :data:`PAIR_FIELDS` only."""
    key: str | None = None
    fields: dict[str, bytes] = {}
    try:
        with fs.open_file(shard, "rb") as fh, tarfile.open(fileobj=fh, mode="r|*") as tar:
            for info in tar:
                found = member_key_field(info)
                if found is None:
                    continue
                if found[0] != key:
                    if key is not None:
                        yield key, fields
                    key, fields = found[0], {}
                if found[1] in PAIR_FIELDS:
                    data = tar.extractfile(info)
                    fields[found[1]] = data.read() if data is not None else b""
    except (tarfile.TarError, OSError, EOFError) as err:
        raise ValueError(f"cannot read pair shard {shard}: {err}") from err
    if key is not None:
        yield key, fields


def write_originals(
    pairs: ShardSpec, out_dir: fs.PathLike, min_shards: int = MIN_SHARDS
) -> Unpaired:
    """Write the originals of the pair shards ``pairs`` (a run folder, brace pattern, glob...:
    :func:`~counterfactual.train.mix.expand_shards`) into ``out_dir`` as
    ``orig-NNNNNN.tar`` shards, each committed by its stats file, and ``sizes.json``; the
    originals of one (image, caption) seen in several shards are written in the first. With
    at least ``min_shards`` pair shards, one originals shard per pair shard; with fewer, the
    originals in the same order split over ``max(pair shards, min(min_shards, originals))``
    shards by :func:`even_split` (the pair shards are then read twice: once to count them).
    ``ValueError`` for a shard without pairs, or ``min_shards`` not an integer >= 1."""
    if isinstance(min_shards, bool) or not isinstance(min_shards, int) or min_shards < 1:
        raise ValueError(f"min_shards must be an integer >= 1, got {min_shards!r}")
    shards = expand_shards(pairs)
    fs.makedirs(out_dir)
    ends: list[int] | None = None  # where each originals shard ends, when not one per pair shard
    parts = len(shards)
    if len(shards) < min_shards:
        total = sum(1 for _ in _unique_originals(shards, []))
        ends = list(itertools.accumulate(even_split(total, max(parts, min(min_shards, total)))))
        parts = len(ends)
    pair_counts: list[int] = []
    committed: list[ShardStats] = []
    writer = ShardWriter(out_dir, 0, prefix=ORIGINALS_PREFIX)
    for n, (source, original) in enumerate(_unique_originals(shards, pair_counts)):
        target = source if ends is None else bisect.bisect_right(ends, n)
        while writer.index < target:
            committed.append(writer.commit())
            writer = ShardWriter(out_dir, writer.index + 1, prefix=ORIGINALS_PREFIX)
        image_id = str(original.meta["image_id"])
        writer.add(
            Sample(original.key, original.jpg, original.caption, original.meta),
            Status(image_id, "written", None, "", original.key),
        )
    committed.append(writer.commit())
    while len(committed) < parts:  # the last ones hold no new original
        committed.append(ShardWriter(out_dir, len(committed), prefix=ORIGINALS_PREFIX).commit())
    sizes = [IndexedShard(s.shard, s.count, 0) for s in committed]
    fs.write_text(fs.join(out_dir, SIZES_FILE), json.dumps(sizes_json(sizes), indent=1) + "\n")
    return Unpaired(
        tuple(str(fs.join(out_dir, s.shard)) for s in committed),
        tuple(s.count for s in committed),
        sum(pair_counts),
    )


def even_split(total: int, parts: int) -> list[int]:
    """``total`` items in ``parts`` shards (``parts >= 1``), sizes differing by at most one, the
    larger first: ``even_split(10, 8) == [2, 2, 1, 1, 1, 1, 1, 1]``."""
    base, extra = divmod(total, parts)
    return [base + (i < extra) for i in range(parts)]


def _unique_originals(
    shards: Sequence[str], pair_counts: list[int]
) -> Iterator[tuple[int, Original]]:
    """``(index of its pair shard, original)`` for each (image, caption) once, in order.
    Appends each pair shard's sample count to ``pair_counts``."""
    seen: set[str] = set()
    for index, shard in enumerate(shards):
        n = 0
        for key, fields in _pair_samples(shard):
            n += 1
            original = _original(shard, key, fields)
            if original.key not in seen:
                seen.add(original.key)
                yield index, original
        pair_counts.append(n)


__all__: Sequence[str] = (
    "MIN_SHARDS",
    "ORIGINALS_PREFIX",
    "PAIR_FIELDS",
    "Original",
    "Unpaired",
    "even_split",
    "iter_originals",
    "write_originals",
)
