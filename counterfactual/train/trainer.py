"""Fine-tune a Hugging Face CLIP or BLIP on original + synthetic WebDataset shards (seed 002:
"we finetune the compared methods with both the original and synthetic datasets, D ∪ D'").

A recipe holds each paper's defaults (:data:`RECIPES`): ``clip`` is 10 epochs, batch 256, Adam
at lr 2e-6 halved every 2 epochs, CLIP's symmetric contrastive loss on a ``CLIPModel``; ``blip``
is 2 epochs, batch 16, AdamW at lr 1e-5 halved every half epoch, BLIP's image-text contrastive
(ITC) loss on a ``BlipForImageTextRetrieval``. The lr is a step decay on the fractional epoch
position of each step (:meth:`TrainConfig.lr_at_step`).

Two ways to read D ∪ D' (``mix``):

* ``ratio``: as ``counterfactual.train.mix`` draws (open_clip's ``--dataset-resampled`` with
  upsampling factors): each sample is synthetic with probability ``ratio / (1 + ratio)``, shards
  are drawn with replacement and read whole. An epoch is ``samples_per_epoch`` samples (by
  default the original count times ``1 + ratio``) in full batches.
* ``union``: the paper's setup. Each epoch reads every original and every synthetic shard once,
  each side in a seeded shuffled order (split between DataLoader workers), the two sides
  interleaved at random in proportion to their sizes, so each sample is seen exactly once, at
  the natural ratio of the two sides; the last batch of an epoch may be smaller.

In both a shuffle buffer mixes the samples of the shards being read.

Output folder: ``train.json`` (config, versions, plan, then the result), ``train_log.jsonl`` (one
row per ``log_every`` steps and at each epoch's end), ``epoch-XX/`` after each epoch and
``final/``; each holds ``save_pretrained`` output of both model and processor, so it loads by path
like a hub id (``hf-clip:OUT/final`` or ``blip:OUT/final`` for ``counterfactual eval``). An epoch
folder appears by an atomic rename once complete, so a rerun with the same config continues after
the last one (the data each epoch draws depends only on the seed and the epoch number, so a
resumed run gives the same weights as an uninterrupted one on CPU).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from counterfactual._lazy import require
from counterfactual.imageio import SampleError, decode_rgb
from counterfactual.models.hf import Words, load_config, load_pretrained
from counterfactual.models.runtime import resolve_device
from counterfactual.options import option
from counterfactual.train.mix import (
    SeededShards,
    ShardSpec,
    count_samples,
    expand_shards,
    mixed_dataset,
    plan_mix,
)

if TYPE_CHECKING:
    import torch

OPTIMIZERS = ("adam", "adamw")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""``auto``: bf16 autocast on CUDA, fp32 elsewhere. bf16/fp16 are mixed precision (autocast,
fp32 master weights; fp16 with a gradient scaler) and need CUDA."""
MIXES = ("ratio", "union")
"""``ratio``: resampled at ``ratio`` synthetic per original; ``union``: every sample of D ∪ D'
once per epoch."""

MISSING_IMAGE = "missing-image"
MISSING_TEXT = "missing-text"
BAD_CAPTION = "bad-caption"
EMPTY_CAPTION = "empty-caption"
"""Reasons a sample is skipped (counted in ``TrainResult.skipped`` and the log), besides the
decoding ones of :func:`counterfactual.imageio.decode_rgb` (``decode-error``,
``image-too-large``)."""

MAX_LOGIT_SCALE = math.log(100.0)  # open_clip clamps exp(logit_scale) at 100 after each step
BLIP_TEMPERATURE = 0.07
"""The ITC temperature for BLIP: its initial value in BLIP. BLIP learns it, but
``BlipForImageTextRetrieval`` checkpoints do not hold it, so it stays fixed here."""
# Config fields a resumed run may change: they do not change which samples are drawn.
_MAY_CHANGE_ON_RESUME = ("epochs", "device", "num_workers", "log_every", "precision")
# What a train.json written before a field existed meant by it.
_BEFORE_FIELD = {"recipe": "clip", "mix": "ratio"}
_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")


@dataclass(frozen=True)
class Recipe:
    """One paper's fine-tuning defaults for a model family (seed 002, "Implementation
    details"). ``model_class`` is the transformers class that is loaded, trained and saved;
    ``lr_decay_every`` is in epochs and may be a fraction."""

    name: str
    model_type: str
    model_class: str
    epochs: int
    batch_size: int
    optimizer: str
    lr: float
    lr_decay: float
    lr_decay_every: float
    weight_decay: float
    max_text_length: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RECIPES: Mapping[str, Recipe] = {
    "clip": Recipe(
        name="clip",
        model_type="clip",
        model_class="CLIPModel",
        epochs=10,
        batch_size=256,
        optimizer="adam",
        lr=2e-6,
        lr_decay=0.5,
        lr_decay_every=2.0,
        weight_decay=0.0,
        max_text_length=77,  # CLIP's context
    ),
    "blip": Recipe(
        name="blip",
        model_type="blip",
        model_class="BlipForImageTextRetrieval",
        epochs=2,
        batch_size=16,
        optimizer="adamw",
        lr=1e-5,
        lr_decay=0.5,
        lr_decay_every=0.5,
        weight_decay=0.05,  # the paper gives none; BLIP's retrieval fine-tuning configs use 0.05
        max_text_length=35,  # BLIP's retrieval fine-tuning tokenizes at max_length=35
    ),
    "scratch": Recipe(
        name="scratch",
        model_type="scratch-dual",
        model_class="ScratchDualEncoder",
        epochs=1,
        batch_size=128,
        optimizer="adamw",
        lr=2e-3,
        lr_decay=0.3,
        lr_decay_every=0.4,
        weight_decay=1e-4,
        max_text_length=64,
    ),
}
"""The recipes by name; a :class:`TrainConfig` field left unset takes its recipe's value."""

_FROM_RECIPE: Any = None  # a field default meaning "the recipe's value", filled on construction


def _option(default: Any = dataclasses.MISSING, **declared: Any) -> Any:
    """A :class:`TrainConfig` field with its command-line option (:func:`option`)."""
    return dataclasses.field(default=default, metadata=option(**declared))


def _by_recipe(name: str) -> str:
    """``clip 10, blip 2``: a field's default in each recipe, for the help text."""
    return ", ".join(f"{recipe} {getattr(r, name):g}" for recipe, r in RECIPES.items())


_RECIPE_FIELDS = (
    "epochs",
    "batch_size",
    "optimizer",
    "lr",
    "lr_decay",
    "lr_decay_every",
    "weight_decay",
    "max_text_length",
)


@dataclass(frozen=True)
class TrainConfig:
    """Options of one fine-tuning run; checked on construction (``ValueError`` names the value).

    ``recipe`` names an entry of :data:`RECIPES`; epochs, batch size, optimizer, lr, its decay,
    weight decay and text length left unset take that recipe's values. ``model`` is a hub id or
    a local folder holding the recipe's model class (``CLIPModel``,
    ``BlipForImageTextRetrieval``) and its processor. ``original`` / ``synthetic`` are shard
    specs as ``counterfactual.train.mix`` reads them (brace patterns, globs, directories, ``::``
    lists); they are stored as a tuple of specs. No synthetic shards means training on the
    original ones only. ``mix`` is ``ratio`` or ``union`` (module docstring); ``ratio`` is
    synthetic samples per original sample in expectation (``mix="ratio"`` only). ``lr`` is
    multiplied by ``lr_decay`` every ``lr_decay_every`` epochs (a fraction such as 0.5 decays
    within epochs). ``samples_per_epoch=None`` takes the original count times ``1 + ratio``
    (``mix="ratio"`` only). ``device=None`` picks CUDA when available.
    """

    model: str = _option(
        help="hub id or folder of the recipe's model + processor (CLIPModel, "
        "BlipForImageTextRetrieval such as Salesforce/blip-itm-base-coco)",
    )
    original: ShardSpec = _option(help="original shards", nargs="+", metavar="SPEC")
    synthetic: ShardSpec = _option(
        (),
        help="synthetic shards (default: none, train on the original ones only)",
        nargs="*",
        metavar="SPEC",
    )
    recipe: str = _option(
        "clip",
        help="model family and the paper's defaults for it (default: %(default)s)",
        choices=tuple(RECIPES),
    )
    mix: str = _option(
        "ratio",
        help="union: every original and synthetic sample once per epoch, at their natural "
        "ratio (the paper); ratio: resampled at --ratio (default: %(default)s)",
        choices=MIXES,
    )
    ratio: float = _option(
        0.1,
        help="--mix ratio: synthetic per original (default %(default)s; the paper: 0.08-0.2)",
        kind="positive_float",
    )
    epochs: int = _option(
        _FROM_RECIPE, help=f"default: {_by_recipe('epochs')}", kind="positive_int"
    )
    batch_size: int = _option(
        _FROM_RECIPE, help=f"default: {_by_recipe('batch_size')}", kind="positive_int"
    )
    lr: float = _option(_FROM_RECIPE, help=f"default: {_by_recipe('lr')}", kind="positive_float")
    lr_decay: float = _option(
        _FROM_RECIPE,
        help=f"lr factor at each decay, at most 1 (default: {_by_recipe('lr_decay')})",
        kind="positive_float",
    )
    lr_decay_every: float = _option(
        _FROM_RECIPE,
        help="epochs between lr decays, fractions allowed "
        f"(default: {_by_recipe('lr_decay_every')})",
        kind="positive_float",
        metavar="EPOCHS",
    )
    optimizer: str = _option(
        _FROM_RECIPE,
        help="default: " + ", ".join(f"{n} {r.optimizer}" for n, r in RECIPES.items()),
        choices=OPTIMIZERS,
    )
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = _option(
        _FROM_RECIPE, help=f"default: {_by_recipe('weight_decay')}", kind="nonnegative_float"
    )
    grad_clip_norm: float | None = _option(
        None,
        help="clip the gradient norm to this (default: no clipping)",
        kind="positive_float",
        flags=("--grad-clip",),
    )
    samples_per_epoch: int | None = _option(
        None,
        help="--mix ratio only; default: original samples x (1 + ratio)",
        kind="positive_int",
    )
    shuffle_buffer: int = _option(
        1000, help="samples (default %(default)s)", kind="nonnegative_int"
    )
    max_text_length: int = _option(
        _FROM_RECIPE,
        help=f"tokens per caption (default: {_by_recipe('max_text_length')})",
        kind="positive_int",
    )
    image_key: str = "jpg"
    text_key: str = "txt"
    seed: int = _option(
        0,
        help="seed of the shard order, shuffle and mix draws, >= 0 (default: %(default)s)",
        kind="nonnegative_int",
    )
    device: str | None = _option(None, help="torch device (default: cuda if available)")
    precision: str = _option(
        "auto",
        help="auto: bf16 autocast on CUDA, fp32 on CPU; bf16, fp16: mixed precision, CUDA "
        "only (default: %(default)s)",
        choices=PRECISIONS,
    )
    num_workers: int = _option(
        0, help="DataLoader workers (default %(default)s)", kind="nonnegative_int"
    )
    log_every: int = _option(
        10, help="steps per log row (default %(default)s)", kind="positive_int"
    )

    def __post_init__(self) -> None:
        if not isinstance(self.model, str | os.PathLike) or not os.fspath(self.model):
            raise ValueError(f"model must be a hub id or a folder, got {self.model!r}")
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {tuple(RECIPES)}, got {self.recipe!r}")
        recipe = RECIPES[self.recipe]
        for name in _RECIPE_FIELDS:
            if getattr(self, name) is None:
                object.__setattr__(self, name, getattr(recipe, name))
        object.__setattr__(self, "model", os.fspath(self.model))
        object.__setattr__(self, "original", _specs(self.original, "original"))
        object.__setattr__(self, "synthetic", _specs(self.synthetic, "synthetic"))
        if not self.original:
            raise ValueError("no original shards given")
        if self.mix not in MIXES:
            raise ValueError(f"mix must be one of {MIXES}, got {self.mix!r}")
        _positive("ratio", self.ratio)
        _positive("lr", self.lr)
        _positive("eps", self.eps)
        _positive("lr_decay_every", self.lr_decay_every)
        object.__setattr__(self, "lr_decay_every", float(self.lr_decay_every))
        for name in ("epochs", "batch_size", "max_text_length", "log_every"):
            _positive_int(name, getattr(self, name))
        _positive("lr_decay", self.lr_decay)
        if self.lr_decay > 1:
            raise ValueError(f"lr_decay must be in (0, 1], got {self.lr_decay!r}")
        _number("weight_decay", self.weight_decay)
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(_is_number(b) and 0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if self.grad_clip_norm is not None:
            _positive("grad_clip_norm", self.grad_clip_norm)
        if self.samples_per_epoch is not None:
            _positive_int("samples_per_epoch", self.samples_per_epoch)
            if self.mix == "union":
                raise ValueError(
                    f"samples_per_epoch={self.samples_per_epoch!r} is for mix 'ratio'; with mix "
                    "'union' an epoch is every sample of D ∪ D' once"
                )
        for name in ("shuffle_buffer", "num_workers", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("image_key", "text_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise ValueError(f"device must be a torch device name or None, got {self.device!r}")

    def lr_at(self, epoch: float) -> float:
        """The learning rate at ``epoch`` epochs into training (0-based, fractions allowed):
        ``lr * lr_decay ** floor(epoch / lr_decay_every)``, exact for decimal fractions (CLIP:
        2e-6 in epochs 1-2, 1e-6 in 3-4, ...; BLIP: 1e-5 in the first half epoch, 5e-6 in the
        second, ...)."""
        position = epoch if isinstance(epoch, Fraction) else Fraction(repr(float(epoch)))
        return self.lr * self.lr_decay ** math.floor(position / _fraction(self.lr_decay_every))

    def lr_at_step(self, step: int, steps_per_epoch: int) -> float:
        """The learning rate of 0-based ``step`` when an epoch is ``steps_per_epoch`` steps:
        ``lr_at(step / steps_per_epoch)``."""
        _positive_int("steps_per_epoch", steps_per_epoch)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be an integer >= 0, got {step!r}")
        return self.lr_at(Fraction(step, steps_per_epoch))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return json.loads(json.dumps(data))  # tuples -> lists, as train.json holds them


def _fraction(value: float) -> Fraction:
    """``0.1`` as 1/10, not the binary float's exact value."""
    return Fraction(repr(float(value)))


def _specs(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, str | os.PathLike):
        value = [value]
    try:
        specs = tuple(os.fspath(v) for v in value)
    except TypeError as err:
        raise ValueError(f"{name} must be shard specs (paths or patterns), got {value!r}") from err
    if any(not s for s in specs):
        raise ValueError(f"{name} holds an empty shard spec")
    return specs


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _number(name: str, value: Any) -> None:
    if not _is_number(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def _positive(name: str, value: Any) -> None:
    _number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class TrainPlan:
    """What a run will read: the expanded shards, their sample counts and the epoch size.
    ``ratio`` is synthetic per original: the configured one (``mix="ratio"``), or the natural
    one of the two sides (``mix="union"``, e.g. about 0.08 on COCO). ``synthetic_fraction`` is
    the share of synthetic samples (0 with none). With ``union`` the last step of an epoch may
    hold fewer than a batch, and bad samples make it shorter than ``steps_per_epoch``."""

    original: tuple[str, ...]
    original_samples: int
    synthetic: tuple[str, ...]
    synthetic_samples: int
    ratio: float
    samples_per_epoch: int
    steps_per_epoch: int
    mix: str = "ratio"

    @property
    def synthetic_fraction(self) -> float:
        return self.ratio / (1.0 + self.ratio) if self.synthetic else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "synthetic_fraction": self.synthetic_fraction}


def plan_training(config: TrainConfig) -> TrainPlan:
    """Expand and count the shards (``ValueError`` for a spec that matches nothing, an
    unreadable shard, a side without samples or a shard on both sides) and size the epoch:
    ``ratio``: ``steps_per_epoch`` full batches of ``batch_size`` cover at least
    ``samples_per_epoch`` samples; ``union``: every sample once, ``ceil(samples /
    batch_size)`` steps."""
    if config.synthetic:
        mix = plan_mix(list(config.original), list(config.synthetic), config.ratio)
        original, n_original = mix.original.shards, mix.original.samples
        synthetic, n_synthetic = mix.synthetic.shards, mix.synthetic.samples
        default = mix.samples_per_epoch
    else:
        original = tuple(expand_shards(list(config.original)))
        n_original = sum(count_samples(s) for s in original)
        if n_original == 0:
            raise ValueError(f"the original shards hold no samples: {', '.join(original)}")
        synthetic, n_synthetic, default = (), 0, n_original
    if config.mix == "union":
        samples = n_original + n_synthetic
        ratio = n_synthetic / n_original
    else:
        samples = config.samples_per_epoch or default
        ratio = config.ratio if synthetic else 0.0
    return TrainPlan(
        original=tuple(original),
        original_samples=n_original,
        synthetic=tuple(synthetic),
        synthetic_samples=n_synthetic,
        ratio=ratio,
        samples_per_epoch=samples,
        steps_per_epoch=math.ceil(samples / config.batch_size),
        mix=config.mix,
    )


def epoch_samples(config: TrainConfig, plan: TrainPlan, epoch: int) -> Any:
    """The raw samples (bytes under their extensions, ``__key__``, ``__url__``) that 0-based
    ``epoch`` reads, before the shuffle buffer, as a WebDataset pipeline seeded by
    ``config.seed`` and ``epoch``. ``ratio``: endless, drawn as ``counterfactual.train.mix`` draws.
    ``union``: every shard of ``plan`` once, each side's in a shuffled order and split between
    the DataLoader workers iterating it, the sides interleaved at random in proportion to their
    samples; then it ends."""
    import webdataset as wds

    seed = _epoch_seed(config.seed, epoch)
    if plan.mix == "union":
        sides = [
            wds.DataPipeline(
                wds.SimpleShardList(list(shards), seed=seed * 2 + offset),
                wds.split_by_worker,
                wds.tarfile_to_samples(),
            )
            for offset, shards in enumerate((plan.original, plan.synthetic))
            if shards
        ]
        if len(sides) == 1:
            return sides[0]
        share = plan.synthetic_samples / (plan.original_samples + plan.synthetic_samples)
        return wds.DataPipeline(_Interleave(sides[0], sides[1], share, seed))
    if plan.synthetic:
        return mixed_dataset(list(plan.original), list(plan.synthetic), plan.ratio, seed=seed)
    return wds.DataPipeline(SeededShards(plan.original, seed), wds.tarfile_to_samples())


class _Interleave:
    """The first stage of a ``union`` epoch: each next sample from the second source with
    probability ``p_second`` (its share of the samples), so synthetic samples are spread over
    the epoch rather than read shard after shard; when one source ends, the rest of the other.
    Each source is read once."""

    def __init__(self, first: Any, second: Any, p_second: float, seed: int) -> None:
        self.first = first
        self.second = second
        self.p_second = p_second
        self.seed = seed

    def __call__(self) -> Iterator[dict[str, Any]]:
        from webdataset.utils import make_seed, pytorch_worker_seed

        rng = random.Random(make_seed(pytorch_worker_seed(), self.seed))
        first, second = iter(self.first), iter(self.second)
        while True:
            source, other = (second, first) if rng.random() < self.p_second else (first, second)
            try:
                yield next(source)
            except StopIteration:
                yield from other
                return


@dataclass(frozen=True)
class TrainLog:
    """One row of ``train_log.jsonl``: ``loss`` is the mean over the steps since the previous
    row and ``lr`` the one of its last step; ``samples``, ``synthetic`` and ``skipped`` are
    totals since the run began."""

    step: int
    epoch: int
    lr: float
    loss: float
    samples_per_s: float
    samples: int
    synthetic: int
    skipped: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TrainResult:
    """How a run went. ``samples`` were trained on, ``synthetic`` of them from the synthetic
    shards; ``skipped`` counts bad samples by reason; ``first_loss`` / ``last_loss`` are the
    first and last logged losses. ``resumed_from`` is the epoch the run continued after (0 for
    a fresh run)."""

    out_dir: Path
    final_dir: Path
    epochs: int
    steps: int
    samples: int
    synthetic: int
    skipped: Mapping[str, int]
    first_loss: float
    last_loss: float
    resumed_from: int
    seconds: float

    @property
    def synthetic_per_original(self) -> float:
        """Synthetic samples per original one actually drawn."""
        original = self.samples - self.synthetic
        return self.synthetic / original if original else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "out_dir": str(self.out_dir),
            "final_dir": str(self.final_dir),
            "skipped": dict(self.skipped),
            "synthetic_per_original": self.synthetic_per_original,
        }


def fine_tune(
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    progress: Callable[[TrainLog], None] | None = None,
) -> TrainResult:
    """Fine-tune ``config.model`` with its recipe's contrastive loss; see the module docstring
    for the folder it writes. ``progress`` receives each log row. Continues after the last
    ``epoch-XX`` folder of ``out_dir`` when there is one (its ``train.json`` must hold the same
    config, except epochs, device, precision, workers and logging).

    Raises ``ValueError`` for a bad device or precision, a model that does not load as the
    recipe's class, shards that cannot be read, a resume with another config, or when a long
    run of samples is all bad; ``FloatingPointError`` when the loss is not finite (fp32/bf16;
    fp16 lets the scaler skip).
    """
    torch = require("torch", "models")
    start = time.perf_counter()
    # 1. The folder: half-written epochs removed; a resume checked against its config
    out = Path(out_dir)
    device, precision = _resolve_device(config)
    plan = plan_training(config)
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale)
    resumed_from = _last_epoch(out)
    if resumed_from > config.epochs:
        raise ValueError(
            f"{out} already holds epoch-{resumed_from:02d}, more than epochs={config.epochs}"
        )
    if resumed_from:
        _check_same_config(out / "train.json", config)
    # 2. The model, from the last epoch when resuming, with the optimizer's state
    source = out / _epoch_name(resumed_from) if resumed_from else config.model
    family = _FAMILIES[config.recipe]
    model, processor = family.load(str(source))
    step = _Step(model.to(device).train(), family, config, device, precision)
    state: dict[str, Any] = {"step": 0, "samples": 0, "synthetic": 0, "skipped": {}}
    state.update(first_loss=None, last_loss=None)
    if resumed_from:
        folder = out / _epoch_name(resumed_from)
        step.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        state.update(_read_json(folder / "trainer_state.json"))
    # 3. The run's record (train.json, "running") and its log, cut back to the resumed epoch
    _write_json(
        out / "train.json",
        {
            "config": config.to_dict(),
            "recipe": RECIPES[config.recipe].to_dict(),
            "device": str(device),
            "precision": precision,
            "plan": plan.to_dict(),
            "versions": _versions(),
            "status": "running",
            "resumed_from": resumed_from,
        },
    )
    log_path = out / "train_log.jsonl"
    _keep_log_rows(log_path, resumed_from)
    skipped: Counter[str] = Counter(state["skipped"])
    per_epoch = plan.steps_per_epoch

    with log_path.open("a", encoding="utf-8") as log:

        def emit(row: TrainLog) -> None:
            log.write(json.dumps(row.to_dict()) + "\n")
            log.flush()
            if state["first_loss"] is None:
                state["first_loss"] = row.loss
            state["last_loss"] = row.loss
            if progress is not None:
                progress(row)

        # 4. The epochs: steps at the schedule's rate, a log row every log_every steps, each
        # epoch saved whole (model, processor, optimizer, counters)
        for epoch in range(resumed_from, config.epochs):
            torch.manual_seed(_epoch_seed(config.seed, epoch))
            batches = _epoch_batches(config, plan, processor, epoch, device)
            window = _Window()
            lr, index = config.lr_at(epoch), -1
            for index, batch in enumerate(itertools.islice(batches, per_epoch)):
                lr = config.lr_at(Fraction(epoch * per_epoch + index, per_epoch))
                step.set_lr(lr)
                value = step(batch["inputs"])
                if not math.isfinite(value) and step.scaler is None:
                    raise FloatingPointError(f"loss is {value} at step {state['step'] + 1}")
                window.add(value, batch["size"])  # fp16: a skipped step's inf is left out
                state["step"] += 1
                state["samples"] += batch["size"]
                state["synthetic"] += batch["synthetic"]
                skipped.update(batch["skipped"])
                if state["step"] % config.log_every == 0 or index == per_epoch - 1:
                    emit(window.row(state, epoch + 1, lr, sum(skipped.values())))
            batches.close()  # ends the DataLoader workers of this epoch
            if index < 0:
                raise ValueError(
                    f"epoch {epoch + 1} trained no batch: no good sample in the shards "
                    f"(skipped so far: {dict(skipped)})"
                )
            if window.steps:  # a union epoch shortened by bad samples
                emit(window.row(state, epoch + 1, lr, sum(skipped.values())))
            state["skipped"] = dict(skipped)
            _save_epoch(out, epoch + 1, model, processor, step, state)

    # 5. The final model and the record's result ("done")
    final = out / "final"
    _save_folder(final, model, processor)
    result = TrainResult(
        out_dir=out,
        final_dir=final,
        epochs=config.epochs,
        steps=state["step"],
        samples=state["samples"],
        synthetic=state["synthetic"],
        skipped=dict(skipped),
        first_loss=state["first_loss"],
        last_loss=state["last_loss"],
        resumed_from=resumed_from,
        seconds=time.perf_counter() - start,
    )
    info = _read_json(out / "train.json")
    _write_json(out / "train.json", {**info, "status": "done", "result": result.to_dict()})
    return result


train_clip = fine_tune
"""Another name of :func:`fine_tune` (which trains whatever the recipe names)."""


def contrastive_loss(similarities: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE over a batch: ``similarities[i, j]`` is image ``i`` against text ``j``
    (cosines), pair ``i`` matches text ``i``; the mean of the image->text and text->image cross
    entropies of ``similarities / temperature`` (BLIP's ITC loss without momentum distillation;
    CLIP's with ``temperature = 1 / logit_scale.exp()``)."""
    import torch

    logits = similarities.float() / temperature
    labels = torch.arange(logits.shape[0], device=logits.device)
    cross_entropy = torch.nn.functional.cross_entropy
    return (cross_entropy(logits, labels) + cross_entropy(logits.t(), labels)) / 2


class _Family:
    """How a recipe's model family is loaded, what loss a batch gives, what a step keeps in
    range. ``needed``: the weights a checkpoint must hold for this training."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    def load(self, source: str) -> tuple[Any, Any]:
        """Model (float32) and processor from a hub id or folder, or ``ValueError``."""
        torch = require("torch", "models")
        recipe = self.recipe
        what = f"{recipe.model_class} (recipe {recipe.name!r})"
        words = Words(
            no_config=f"could not load {recipe.name.upper()} {source} (a hub id or folder with "
            f"a {what})",
            no_model=f"could not load {recipe.name.upper()} {source}",
            not_checkpoint=f"{source} is not a {what} checkpoint",
        )
        hf_config = load_config(source, words)
        if hf_config.model_type != recipe.model_type:
            other = [r.name for r in RECIPES.values() if r.model_type == hf_config.model_type]
            hint = f"; use recipe {other[0]!r}" if other else ""
            raise ValueError(
                f"{source} holds a {hf_config.model_type!r} model, not the {what} the recipe "
                f"trains{hint}"
            )
        model, processor = load_pretrained(
            source, recipe.model_class, words, dtype=torch.float32, needed=self.needed
        )
        return model, processor

    def needed(self, key: str) -> bool:
        return True

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def after_step(self, model: Any) -> None:
        """Called after each optimizer step, without gradients."""


class _Clip(_Family):
    """``CLIPModel``: its own contrastive loss (``return_loss=True``) at its learned
    temperature, clamped at 100 after each step as open_clip does."""

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        return model(**inputs, return_loss=True).loss

    def after_step(self, model: Any) -> None:
        model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)


class _Blip(_Family):
    """``BlipForImageTextRetrieval``: ``forward(use_itm_head=False)`` gives the ITC cosines of
    ``normalize(vision_proj(image CLS))`` and ``normalize(text_proj(text CLS))`` (the text
    encoder without the image); :func:`contrastive_loss` at :data:`BLIP_TEMPERATURE`. The ITM
    head is neither trained nor needed."""

    def needed(self, key: str) -> bool:
        return not key.startswith("itm_head.")

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        cosines = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=inputs["pixel_values"],
            use_itm_head=False,
        ).itm_score
        return contrastive_loss(cosines, BLIP_TEMPERATURE)


class _Scratch(_Family):
    """:class:`~counterfactual.models.scratch.ScratchDualEncoder`, the small dual encoder trained
    from scratch (the controlled world's): its own CLIP loss, temperature clamped as CLIP's."""

    def load(self, source: str) -> tuple[Any, Any]:
        from counterfactual.models.scratch import is_scratch, load_scratch

        if not is_scratch(source):
            raise ValueError(
                f"{source} is not a scratch model folder (config.json with model_type "
                "'scratch-dual'; counterfactual.models.scratch.init_model writes one)"
            )
        return load_scratch(source)

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        return model(inputs["pixel_values"], inputs["input_ids"], inputs["attention_mask"])

    def after_step(self, model: Any) -> None:
        model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)


_FAMILIES: Mapping[str, _Family] = {
    "clip": _Clip(RECIPES["clip"]),
    "blip": _Blip(RECIPES["blip"]),
    "scratch": _Scratch(RECIPES["scratch"]),
}


class _Window:
    """The steps since the previous log row."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.losses: list[float] = []
        self.steps = 0
        self.samples = 0
        self.start = time.perf_counter()

    def add(self, loss: float, samples: int) -> None:
        if math.isfinite(loss):
            self.losses.append(loss)
        self.steps += 1
        self.samples += samples

    def row(self, state: Mapping[str, Any], epoch: int, lr: float, skipped: int) -> TrainLog:
        """The log row of this window; the window starts again."""
        row = TrainLog(
            step=state["step"],
            epoch=epoch,
            lr=lr,
            loss=sum(self.losses) / len(self.losses) if self.losses else math.nan,
            samples_per_s=self.samples / max(time.perf_counter() - self.start, 1e-9),
            samples=state["samples"],
            synthetic=state["synthetic"],
            skipped=skipped,
        )
        self.reset()
        return row


class _Step:
    """One optimisation step per call on a batch of processor outputs: forward under autocast
    (bf16/fp16 on CUDA), the family's contrastive loss, backward (scaled for fp16), optional
    gradient-norm clipping, Adam(W), then the family's clamp. Returns the loss as a float."""

    def __init__(
        self, model: Any, family: _Family, config: TrainConfig, device: Any, precision: str
    ) -> None:
        import torch

        self.model = model
        self.family = family
        self.device = device
        self.params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = optimizer(
            self.params,
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        self.autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.clip = config.grad_clip_norm

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return {"optimizer": self.optimizer.state_dict(), "scaler": scaler}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])

    def __call__(self, inputs: Mapping[str, Any]) -> float:
        import torch

        inputs = {k: v.to(self.device, non_blocking=True) for k, v in inputs.items()}
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=bool(self.autocast)):
            loss = self.family.loss(self.model, inputs)
        value = float(loss.detach().float().item())
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        with torch.no_grad():
            self.family.after_step(self.model)
        return value


def _resolve_device(config: TrainConfig) -> tuple[torch.device, str]:
    """The device (a CUDA one torch cannot use: why, :func:`resolve_device`) and the
    precision ``auto`` stands for there."""
    device = resolve_device(config.device)
    name = str(device)
    precision = config.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision != "fp32" and device.type != "cuda":
        raise ValueError(f"precision {precision!r} needs a CUDA device, got {name!r}")
    return device, precision


def _epoch_seed(seed: int, epoch: int) -> int:
    # Independent of how earlier epochs ran, so a resumed run draws the same data.
    return (seed * 1_000_003 + epoch * 7_919 + 1) & 0x7FFFFFFF


def _epoch_batches(
    config: TrainConfig, plan: TrainPlan, processor: Any, epoch: int, device: Any
) -> Generator[dict[str, Any], None, None]:
    """The batches of 0-based ``epoch`` (endless with ``ratio``), built in DataLoader workers
    when ``num_workers > 0``. Each is ``{"inputs", "size", "synthetic", "skipped"}``."""
    import torch

    batcher = _Batcher(
        config, processor, frozenset(plan.synthetic), _epoch_seed(config.seed, epoch)
    )
    dataset = epoch_samples(config, plan, epoch).compose(batcher)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=config.num_workers,
        pin_memory=device.type == "cuda",
    )
    return _batches(loader, batcher)


def _batches(loader: Any, batcher: _Batcher) -> Generator[dict[str, Any], None, None]:
    """The loader's full batches, then the workers' last samples of a finite epoch put together
    into full batches and one smaller last batch. One batch is held back so that bad samples
    counted after the last full batch of a worker are added to the epoch's last batch."""
    iterator = iter(loader)
    images: list[Image.Image] = []
    texts: list[str] = []
    flags: list[bool] = []
    later: Counter[str] = Counter()
    held: dict[str, Any] | None = None
    try:
        for item in iterator:
            if item["inputs"] is None:  # a worker's samples after its last full batch
                images += item["images"]
                texts += item["texts"]
                flags += item["flags"]
                later.update(item["skipped"])
                continue
            if held is not None:
                yield held
            held = item
        size = batcher.batch_size
        for i in range(0, len(images), size):
            if held is not None:
                yield held
            held = batcher.batch(images[i : i + size], texts[i : i + size], flags[i : i + size])
        if held is not None:
            held["skipped"] = dict(Counter(held["skipped"]) + later)
            yield held
    finally:
        del iterator


class _Batcher:
    """A pipeline stage: raw samples -> shuffled -> decoded -> processor batches of exactly
    ``batch_size`` good samples. Each batch carries how many of its samples are synthetic and
    the bad samples skipped (by reason) since the previous batch of this worker. When the
    samples end (``union``), the rest comes as ``{"inputs": None, "images", "texts", "flags"}``
    for :func:`_batches` to put together across workers."""

    def __init__(
        self, config: TrainConfig, processor: Any, synthetic: frozenset[str], seed: int
    ) -> None:
        self.processor = processor
        self.synthetic = synthetic
        self.seed = seed
        self.batch_size = config.batch_size
        self.buffer = config.shuffle_buffer
        self.image_key = config.image_key
        self.text_key = config.text_key
        self.max_text_length = config.max_text_length
        # With this many bad samples in a row something is wrong with the data, not one sample.
        self.max_bad_run = max(1000, 4 * config.batch_size)

    def __call__(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        from webdataset.utils import make_seed, pytorch_worker_seed

        rng = random.Random(make_seed(pytorch_worker_seed(), self.seed))
        images: list[Image.Image] = []
        texts: list[str] = []
        flags: list[bool] = []
        skipped: Counter[str] = Counter()
        bad_run = 0
        for sample in _shuffle(samples, self.buffer, rng):
            try:
                image, text = self.decode(sample)
            except SampleError as err:
                skipped[err.reason] += 1
                bad_run += 1
                if bad_run >= self.max_bad_run:
                    raise ValueError(
                        f"{bad_run} bad samples in a row ({dict(skipped)}); are the keys "
                        f"{self.image_key!r} and {self.text_key!r} right?"
                    ) from err
                continue
            bad_run = 0
            images.append(image)
            texts.append(text)
            flags.append(sample.get("__url__") in self.synthetic)
            if len(images) == self.batch_size:
                yield {**self.batch(images, texts, flags), "skipped": dict(skipped)}
                images, texts, flags, skipped = [], [], [], Counter()
        if images or skipped:
            rest = {"images": images, "texts": texts, "flags": flags}
            yield {"inputs": None, **rest, "skipped": dict(skipped)}

    def batch(
        self, images: list[Image.Image], texts: list[str], flags: list[bool]
    ) -> dict[str, Any]:
        """The processor's tensors for these samples, their count and how many are synthetic."""
        inputs = self.processor(
            text=texts,
            images=images,
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=self.max_text_length,
        )
        return {"inputs": dict(inputs), "size": len(images), "synthetic": sum(flags), "skipped": {}}

    def decode(self, sample: Mapping[str, Any]) -> tuple[Image.Image, str]:
        """RGB picture and stripped caption of one raw sample, or ``SampleError``."""
        data = sample.get(self.image_key)
        if not isinstance(data, bytes | bytearray) or not data:
            raise SampleError(MISSING_IMAGE, str(sample.get("__key__")))
        raw = sample.get(self.text_key)
        if not isinstance(raw, bytes | bytearray):
            raise SampleError(MISSING_TEXT, str(sample.get("__key__")))
        try:
            text = bytes(raw).decode("utf-8").strip()
        except UnicodeDecodeError as err:
            raise SampleError(BAD_CAPTION, str(err)) from err
        if not text:
            raise SampleError(EMPTY_CAPTION, str(sample.get("__key__")))
        return Image.fromarray(decode_rgb(bytes(data))), text


def _shuffle(samples: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """A shuffle buffer of ``size`` samples (0 or 1: the order as read)."""
    if size <= 1:
        yield from samples
        return
    buffer: list[Any] = []
    for sample in samples:
        if len(buffer) < size:
            buffer.append(sample)
            continue
        i = rng.randrange(size)
        buffer[i], sample = sample, buffer[i]
        yield sample
    rng.shuffle(buffer)
    yield from buffer


def _epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:02d}"


def _last_epoch(out: Path) -> int:
    """The highest complete epoch folder (an epoch folder only appears complete)."""
    found = [
        int(m.group(1)) for p in out.iterdir() if p.is_dir() and (m := _EPOCH_DIR.match(p.name))
    ]
    return max(found, default=0)


def _check_same_config(path: Path, config: TrainConfig) -> None:
    if not path.is_file():
        raise ValueError(f"{path.parent} holds epoch folders but no train.json; use a new --out")
    before = _read_json(path).get("config", {})
    now = config.to_dict()
    for key, meant in _BEFORE_FIELD.items():
        before.setdefault(key, meant)
    differ = sorted(k for k in now if k not in _MAY_CHANGE_ON_RESUME and before.get(k) != now[k])
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in differ)
        raise ValueError(
            f"{path.parent} was trained with another config ({shown}); use a new --out"
        )


def _keep_log_rows(path: Path, epochs_done: int) -> None:
    """Drop log rows of epochs that are being redone (all rows of a fresh run)."""
    if not path.exists():
        return
    keep = []
    if epochs_done:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a row cut off when the run stopped
                continue
            if isinstance(row, dict) and row.get("epoch", 0) <= epochs_done:
                keep.append(line + "\n")
    path.write_text("".join(keep), encoding="utf-8")


def _save_folder(
    folder: Path, model: Any, processor: Any, extra: Callable[[Path], None] | None = None
) -> None:
    """Write into ``<folder>.tmp`` and rename it into place, so ``folder`` is always complete."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    processor.save_pretrained(str(tmp))
    if extra is not None:
        extra(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def _save_epoch(
    out: Path, epoch: int, model: Any, processor: Any, step: _Step, state: dict[str, Any]
) -> None:
    """``epoch-XX/`` with the weights, the processor, the optimizer state and the counters. Only
    the newest epoch keeps its optimizer state (the one a resume needs; it doubles the size)."""
    import torch

    def extra(folder: Path) -> None:
        torch.save(step.state_dict(), folder / "optimizer.pt")
        _write_json(folder / "trainer_state.json", {"epoch": epoch, **state})

    _save_folder(out / _epoch_name(epoch), model, processor, extra)
    previous = out / _epoch_name(epoch - 1) / "optimizer.pt"
    if epoch > 1 and previous.exists():
        previous.unlink()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("counterfactual", "torch", "transformers", "webdataset"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


__all__ = [
    "BLIP_TEMPERATURE",
    "MIXES",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECIPES",
    "Recipe",
    "TrainConfig",
    "TrainLog",
    "TrainPlan",
    "TrainResult",
    "contrastive_loss",
    "epoch_samples",
    "fine_tune",
    "plan_training",
    "train_clip",
]
