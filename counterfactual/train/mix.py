"""Mixing original and synthetic WebDataset shards at a ratio (SPEC 1.6: train on D ∪ D').

``ratio`` is always *synthetic samples per original sample* in expectation (the paper used about
0.08-0.2). Weights follow open_clip's ``--train-data-upsampling-factors`` with
``--dataset-resampled``: every shard carries a weight, a shard is drawn with probability
proportional to its weight and then read whole, so a side with ``N`` samples and weight ``w``
contributes ``w * N`` in expectation. The original side keeps weight 1; the synthetic weight is
``ratio * N_original / N_synthetic``. open_clip gives each ``::`` part of ``--train-data`` (a
brace pattern) one factor, so each side is written as one pattern (:func:`shard_pattern`) with
one factor.

Shards are local files; a sample is the group of tar members sharing a key, as WebDataset groups
them (key = member name up to the first dot of its base name, directory kept).
"""

from __future__ import annotations

import glob
import json
import math
import os
import random
import re
import shlex
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from braceexpand import braceexpand

from counterfactual import fs
from counterfactual.messages import cut, short
from counterfactual.readers.corpus import member_key_field
from counterfactual.shards.samples import shard_paths

if TYPE_CHECKING:
    import webdataset as wds

PLAN_VERSION = 2
"""The layout of :meth:`MixPlan.to_dict` (``counterfactual mix --out``)."""

ShardSpec = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""One spec or several; each may be a ``::``-separated list (as open_clip accepts) whose parts
are brace patterns (``data/{000000..000009}.tar``), globs, directories or plain paths."""

_GLOB_MAGIC = re.compile(r"[*?\[]")
_NUMBERED = re.compile(r"^(.*?)(\d+)([^/\d]*)$")  # the last number in the base name
_BRACE_SPECIAL = re.compile(r"([\\{},])")
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")


def expand_shards(spec: ShardSpec) -> list[str]:
    """The shard paths named by ``spec``, in the order given; within a glob or a directory
    (all ``*.tar`` in it; in a synth run folder its committed shards only, see
    :func:`counterfactual.shards.samples.shard_paths`) sorted by name.

    Raises ``ValueError`` naming the spec when a part matches nothing, names a missing file, or
    when one shard is listed twice (it would be counted twice).
    """
    specs = [spec] if isinstance(spec, str | os.PathLike) else list(spec)
    if not specs:
        raise ValueError("no shard spec given")
    shards: list[str] = []
    seen: dict[str, str] = {}
    for one in specs:
        text = os.fspath(one)
        for part in text.split("::"):
            if not part:
                raise ValueError(f"shard spec {short(text)} has an empty part")
            for path in _expand_part(part, text):
                real = path if fs.is_url(path) else os.path.realpath(path)
                if real in seen:
                    raise ValueError(f"shard spec {short(text)}: {path} is listed twice")
                seen[real] = path
                shards.append(path)
    return shards


def _expand_part(part: str, spec: str) -> list[str]:
    found: list[str] = []
    for path in braceexpand(part):
        if fs.is_url(path):  # an object store: a glob, a run's prefix, or one object
            found += _expand_url(path, spec)
        elif _GLOB_MAGIC.search(path):
            matches = sorted(p for p in glob.glob(path) if os.path.isfile(p))
            if not matches:
                raise ValueError(f"shard spec {short(spec)}: nothing matches {path}")
            found += matches
        elif os.path.isdir(path):
            # a synth run folder: its committed shards (an unfinished one is redone by a rerun)
            ours = [os.path.join(path, fs.name(p)) for p in shard_paths(path)]
            matches = ours or sorted(glob.glob(os.path.join(glob.escape(path), "*.tar")))
            if not matches:
                raise ValueError(f"shard spec {short(spec)}: no *.tar in directory {path}")
            found += matches
        elif os.path.isfile(path):
            found.append(path)
        else:
            raise ValueError(f"shard spec {short(spec)}: no such file {path}")
    return found


def _expand_url(path: str, spec: str) -> list[str]:
    if _GLOB_MAGIC.search(path):
        matches = [str(p) for p in fs.glob(path)]
        if not matches:
            raise ValueError(f"shard spec {short(spec)}: nothing matches {path}")
        return matches
    if fs.isfile(path):
        return [path]
    ours = [str(p) for p in shard_paths(path)]
    if not ours:
        raise ValueError(f"shard spec {short(spec)}: no committed shard under {path}")
    return ours


def shard_pattern(shards: Sequence[str | os.PathLike[str]]) -> str:
    """One brace pattern that ``braceexpand`` turns back into exactly ``shards``, in order: the
    form of one ``::`` part of open_clip's ``--train-data``. Consecutive numbers in one folder
    become a range (``orig/{00000..00099}.tar``; gaps give ``orig/{{00000..00041},00043}.tar``),
    other names are listed (``{a/x.tar,b/y.tar}``) with ``\\``, ``{``, ``}`` and ``,`` escaped.

    Raises ``ValueError`` for no shards, or for a shard whose name holds ``::`` (open_clip splits
    ``--train-data`` there).
    """
    paths = [os.fspath(s) for s in shards]
    if not paths:
        raise ValueError("no shards to write as a pattern")
    for path in paths:
        if "::" in path:
            raise ValueError(
                f"shard {path!r} holds '::', which open_clip reads as a separator; rename it"
            )
    pattern = _alternatives([_group(g) for g in _numbered_groups(paths)])
    if list(braceexpand(pattern)) != paths:  # a name the ranges do not round-trip: list them
        pattern = _alternatives([_escape(p) for p in paths])
    return pattern


def _numbered_groups(paths: list[str]) -> list[tuple[str, list[tuple[str, str]], str]]:
    """Neighbouring paths as ``(head, [(first, last), ...], tail)``: one group per run of names
    that differ only in the last number of the base name, each range of consecutive numbers
    one ``(first, last)``; a name without a number is ``(path, [], "")``."""
    groups: list[tuple[str, list[tuple[str, str]], str]] = []
    for path in paths:
        match = _NUMBERED.match(path)
        if match is None:
            groups.append((path, [], ""))
            continue
        head, digits, tail = match.groups()
        if groups and groups[-1][1] and groups[-1][0] == head and groups[-1][2] == tail:
            ranges = groups[-1][1]
            first, last = ranges[-1]
            if _follows(last, digits):
                ranges[-1] = (first, digits)
            else:
                ranges.append((digits, digits))
            continue
        groups.append((head, [(digits, digits)], tail))
    return groups


def _follows(previous: str, digits: str) -> bool:
    """``digits`` is the next number after ``previous`` as braceexpand writes a range: the same
    width, or both without leading zeros (``9`` then ``10``)."""

    def padded(d: str) -> bool:
        return len(d) > 1 and d.startswith("0")

    return int(digits) == int(previous) + 1 and (
        len(digits) == len(previous) or not (padded(digits) or padded(previous))
    )


def _group(group: tuple[str, list[tuple[str, str]], str]) -> str:
    head, ranges, tail = group
    if not ranges:
        return _escape(head)
    parts = [first if first == last else f"{{{first}..{last}}}" for first, last in ranges]
    if len(parts) == 1:
        return f"{_escape(head)}{parts[0]}{_escape(tail)}"
    return f"{_escape(head)}{{{','.join(parts)}}}{_escape(tail)}"


def _alternatives(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "{" + ",".join(parts) + "}"


def _escape(text: str) -> str:
    return _BRACE_SPECIAL.sub(r"\\\1", text)


def stats_path(shard: str) -> str:
    """``<stem>_stats.json`` beside the shard: ``shard-000000.tar`` -> ``shard-000000_stats.json``
    (ours), ``00000.tar`` -> ``00000_stats.json`` (img2dataset)."""
    head, name = os.path.split(shard)
    for suffix in (".tar.gz", ".tgz", ".tar"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    else:
        name = os.path.splitext(name)[0]
    return os.path.join(head, f"{name}_stats.json")


def count_samples(shard: str) -> int:
    """Samples in one shard.

    From the stats file beside it when that holds a count: img2dataset's ``successes`` (its
    ``count`` includes failed downloads, so ``successes`` wins), else our ``count``. Otherwise the
    tar is read (headers only) and the samples WebDataset would yield are counted: a new sample
    starts wherever the key changes. A missing or unreadable shard, a truncated tar or a stats file
    that is not a JSON object raise ``ValueError`` naming the file.
    """
    if not os.path.isfile(shard):
        raise ValueError(f"no such shard: {shard}")
    stats = stats_path(shard)
    if os.path.isfile(stats):
        try:
            with open(stats, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"cannot read stats file {stats}: {err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"stats file {stats} is not a JSON object")
        for field in ("successes", "count"):
            value = data.get(field)
            if isinstance(value, int) and not isinstance(value, bool):
                if value < 0:
                    raise ValueError(f"stats file {stats}: negative {field} {value}")
                return value
    return _count_tar(shard)


def _count_tar(shard: str) -> int:
    try:
        with open(shard, "rb") as f:
            compressed = f.read(6).startswith(_COMPRESSED_MAGIC)
        size = os.path.getsize(shard)
        count = 0
        previous: str | None = None
        with tarfile.open(shard, "r:*") as tar:
            for info in tar:
                if not compressed and info.offset_data + info.size > size:
                    raise ValueError(f"truncated shard {shard}: member {info.name} is cut off")
                key = _sample_key(info)
                if key is not None and key != previous:
                    count += 1
                    previous = key
    except (tarfile.TarError, OSError, EOFError, zlib.error) as err:
        raise ValueError(f"cannot read shard {shard}: {err}") from err
    return count


def _sample_key(info: tarfile.TarInfo) -> str | None:
    key_field = member_key_field(info)
    return key_field[0] if key_field else None


@dataclass(frozen=True, slots=True)
class MixSide:
    """One side of the mix: its shards, the samples in each, and the upsampling weight that every
    one of its shards carries."""

    shards: tuple[str, ...]
    counts: tuple[int, ...]
    weight: float

    @property
    def samples(self) -> int:
        return sum(self.counts)

    @property
    def pattern(self) -> str:
        """``shards`` as one brace pattern (:func:`shard_pattern`)."""
        return shard_pattern(self.shards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shards": list(self.shards),
            "counts": list(self.counts),
            "samples": self.samples,
            "weight": self.weight,
            "pattern": self.pattern,
        }


@dataclass(frozen=True, slots=True)
class MixPlan:
    """Shards and weights for original + synthetic at ``ratio`` synthetic per original.

    Sampling shards with replacement in proportion to their weight gives, in expectation,
    ``synthetic.weight * synthetic.samples / (original.weight * original.samples) == ratio``.
    """

    original: MixSide
    synthetic: MixSide
    ratio: float

    @property
    def expected_ratio(self) -> float:
        """Synthetic per original sample that the weights give (``ratio`` up to rounding)."""
        return (self.synthetic.weight * self.synthetic.samples) / (
            self.original.weight * self.original.samples
        )

    @property
    def synthetic_fraction(self) -> float:
        """Expected share of synthetic samples in the stream: ``ratio / (1 + ratio)``."""
        return self.ratio / (1.0 + self.ratio)

    @property
    def concat_ratio(self) -> float:
        """Synthetic per original if all shards were simply concatenated, without weights."""
        return self.synthetic.samples / self.original.samples

    @property
    def samples_per_epoch(self) -> int:
        """Samples in one epoch that visits each original sample once in expectation:
        ``round(original.samples * (1 + ratio))`` (open_clip's ``--train-num-samples``)."""
        return round(self.original.samples * (1.0 + self.ratio))

    @property
    def synthetic_repeats(self) -> float:
        """Expected draws of each synthetic sample per epoch of ``samples_per_epoch``. Above 1
        there are fewer synthetic samples than ``ratio * original`` and they repeat; below 1 an
        epoch sees only that share of them."""
        return self.synthetic.weight / self.original.weight

    @property
    def shards(self) -> list[str]:
        return [*self.original.shards, *self.synthetic.shards]

    @property
    def shard_weights(self) -> list[float]:
        """One weight per entry of ``shards``."""
        return [self.original.weight] * len(self.original.shards) + [self.synthetic.weight] * len(
            self.synthetic.shards
        )

    @property
    def train_data(self) -> str:
        """open_clip's ``--train-data``: ``ORIGINAL::SYNTHETIC``, each side one brace pattern."""
        return f"{self.original.pattern}::{self.synthetic.pattern}"

    @property
    def upsampling_factors(self) -> str:
        """open_clip's ``--train-data-upsampling-factors``: one weight per ``::`` part of
        ``train_data`` (open_clip brace-expands each part and gives its weight to every shard in
        it, which is ``shard_weights``)."""
        return f"{_number(self.original.weight)}::{_number(self.synthetic.weight)}"

    def open_clip_args(self) -> list[str]:
        """Arguments for ``open_clip_train.main``: shards, upsampling factors, resampling on (the
        factors have no effect without it) and the epoch size."""
        return [
            "--train-data",
            self.train_data,
            "--train-data-upsampling-factors",
            self.upsampling_factors,
            "--dataset-resampled",
            "--train-num-samples",
            str(self.samples_per_epoch),
        ]

    def open_clip_flags(self) -> str:
        """``open_clip_args`` quoted for a shell."""
        return shlex.join(self.open_clip_args())

    def to_dict(self) -> dict[str, Any]:
        """Everything above as JSON-ready values; ``open_clip.args`` is the argument list.
        ``version`` is :data:`PLAN_VERSION`: 2 writes one pattern and one factor per side in
        ``open_clip``; 1 (no ``version`` key) wrote one shard and one factor per ``::`` part.
        ``shards`` and ``weights`` stay one entry per shard."""
        return {
            "version": PLAN_VERSION,
            "ratio": self.ratio,
            "expected_ratio": self.expected_ratio,
            "synthetic_fraction": self.synthetic_fraction,
            "concat_ratio": self.concat_ratio,
            "samples_per_epoch": self.samples_per_epoch,
            "synthetic_repeats": self.synthetic_repeats,
            "original": self.original.to_dict(),
            "synthetic": self.synthetic.to_dict(),
            "shards": self.shards,
            "weights": self.shard_weights,
            "open_clip": {
                "train_data": self.train_data,
                "train_data_upsampling_factors": self.upsampling_factors,
                "train_num_samples": self.samples_per_epoch,
                "args": self.open_clip_args(),
            },
        }


def _some(paths: Sequence[str], shown: int = 3) -> str:
    """``paths`` named in a message: their count and the first few (an error line stays
    short with 10,000 of them)."""
    if len(paths) <= shown:
        return ", ".join(cut(p, 120) for p in paths)
    first = ", ".join(cut(p, 120) for p in paths[:shown])
    return f"{len(paths):,} shards ({first}, ...)"


def _number(value: float) -> str:
    return format(value, ".12g")


def _check_ratio(ratio: float) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, int | float):
        raise ValueError(f"ratio must be a number, got {ratio!r}")
    if not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"ratio must be a finite number > 0, got {ratio!r}")
    return float(ratio)


def plan_mix(original: ShardSpec, synthetic: ShardSpec, ratio: float) -> MixPlan:
    """Expand both shard specs, count their samples and weigh them so that the expected number
    of synthetic samples per original sample is ``ratio``.

    Raises ``ValueError`` for ``ratio <= 0`` (or not finite), for a spec that matches nothing, an
    unreadable shard, a side with no samples, or a shard on both sides.
    """
    ratio = _check_ratio(ratio)
    sides: dict[str, tuple[list[str], list[int]]] = {}
    for name, spec in (("original", original), ("synthetic", synthetic)):
        shards = expand_shards(spec)
        counts = [count_samples(s) for s in shards]
        if sum(counts) == 0:
            raise ValueError(f"the {name} shards hold no samples: {_some(shards)}")
        sides[name] = (shards, counts)
    both = {os.path.realpath(s) for s in sides["original"][0]} & {
        os.path.realpath(s) for s in sides["synthetic"][0]
    }
    if both:
        raise ValueError(f"shards on both sides: {_some(sorted(both))}")
    n_original = sum(sides["original"][1])
    n_synthetic = sum(sides["synthetic"][1])
    return MixPlan(
        original=MixSide(tuple(sides["original"][0]), tuple(sides["original"][1]), 1.0),
        synthetic=MixSide(
            tuple(sides["synthetic"][0]),
            tuple(sides["synthetic"][1]),
            ratio * n_original / n_synthetic,
        ),
        ratio=ratio,
    )


def mixed_dataset(
    original: ShardSpec, synthetic: ShardSpec, ratio: float, seed: int = 0
) -> wds.FluidWrapper:
    """An endless WebDataset pipeline of samples from both sides: each sample is synthetic with
    probability ``ratio / (1 + ratio)``, so there are ``ratio`` synthetic per original in
    expectation. Within a side, shards are drawn uniformly with replacement and read whole (each
    sample of a side equally often in the long run). Samples pass through unchanged: the raw
    bytes under their extensions (``jpg``, ``txt``, ``json``...) plus ``__key__`` and ``__url__``;
    chain ``.decode("pil").to_tuple("jpg", "txt")`` or ``.shuffle(n)`` as usual, and
    ``.with_epoch(n)`` or ``.slice(n)`` to end it.

    The draws depend only on ``seed``, the epoch (each new iteration is the next epoch) and the
    DataLoader worker / node rank, never on the clock. Every side must hold at least one sample
    (``plan_mix`` checks that), or iteration never yields.
    """
    import webdataset as wds

    ratio = _check_ratio(ratio)
    sources = []
    for offset, spec in enumerate((original, synthetic)):
        shards = expand_shards(spec)
        sources.append(
            wds.DataPipeline(
                SeededShards(shards, seed * 2 + offset),
                wds.tarfile_to_samples(),
            )
        )
    return wds.FluidWrapper(_SeededMix(sources, ratio / (1.0 + ratio), seed))


class SeededShards:
    """A WebDataset pipeline's first stage: shards drawn uniformly with replacement, endlessly,
    as ``{"url": shard}``. Each call starts the next epoch; the draws depend only on ``seed``,
    the epoch and the DataLoader worker / node rank (``pytorch_worker_seed``), and equal those of
    ``wds.ResampledShards(shards, seed=seed, deterministic=True)`` in webdataset 0.2.90 and
    later, which 0.2.86 (the newest open_clip's trainer allows) lacks.

    Raises ``ValueError`` for an empty shard list.
    """

    def __init__(self, shards: Sequence[str], seed: int = 0) -> None:
        self.shards = [os.fspath(s) for s in shards]
        if not self.shards:
            raise ValueError("no shards to draw from")
        self.seed = seed
        self.epoch = -1

    def __call__(self) -> Iterator[dict[str, str]]:
        from webdataset.utils import make_seed, pytorch_worker_seed

        self.epoch += 1
        rng = random.Random(make_seed(pytorch_worker_seed(), self.epoch, self.seed))
        last = len(self.shards) - 1
        while True:
            yield {"url": self.shards[rng.randint(0, last)]}


class _SeededMix:
    """Like ``wds.RandomMix`` for two endless sources, but drawing from its own seeded generator
    (``RandomMix`` uses the global ``random`` module). A pipeline's first stage: each call starts
    the next epoch."""

    def __init__(self, sources: Sequence[Any], p_second: float, seed: int) -> None:
        self.sources = list(sources)
        self.p_second = p_second
        self.seed = seed
        self.epoch = -1

    def __call__(self) -> Iterator[Any]:
        from webdataset.utils import make_seed, pytorch_worker_seed

        self.epoch += 1
        rng = random.Random(make_seed(pytorch_worker_seed(), self.epoch, self.seed))
        first, second = (iter(s) for s in self.sources)
        while True:
            source = second if rng.random() < self.p_second else first
            try:
                yield next(source)
            except StopIteration:
                return
