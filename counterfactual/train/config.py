"""The fine-tuning options and what a run will read: each paper's recipe (:data:`RECIPES`),
:class:`TrainConfig` (checked on construction), and :func:`plan_training` -> :class:`TrainPlan`
(the expanded shards, their sample counts and the epoch size)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from counterfactual.options import declare
from counterfactual.train.mix import (
    ShardSpec,
    count_samples,
    expand_shards,
    plan_mix,
)

OPTIMIZERS = ("adam", "adamw")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""``auto``: bf16 autocast on CUDA, fp32 elsewhere. bf16/fp16 are mixed precision (autocast,
fp32 master weights; fp16 with a gradient scaler) and need CUDA."""
MIXES = ("ratio", "union")
"""``ratio``: resampled at ``ratio`` synthetic per original; ``union``: every sample of D ∪ D'
once per epoch."""


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

    model: str = declare(
        help="hub id or folder of the recipe's model + processor (CLIPModel, "
        "BlipForImageTextRetrieval such as Salesforce/blip-itm-base-coco)",
    )
    original: ShardSpec = declare(help="original shards", nargs="+", metavar="SPEC")
    synthetic: ShardSpec = declare(
        (),
        help="synthetic shards (default: none, train on the original ones only)",
        nargs="*",
        metavar="SPEC",
    )
    recipe: str = declare(
        "clip",
        help="model family and the paper's defaults for it (default: %(default)s)",
        choices=tuple(RECIPES),
    )
    mix: str = declare(
        "ratio",
        help="union: every original and synthetic sample once per epoch, at their natural "
        "ratio (the paper); ratio: resampled at --ratio (default: %(default)s)",
        choices=MIXES,
    )
    ratio: float = declare(
        0.1,
        help="--mix ratio: synthetic per original (default %(default)s; the paper: 0.08-0.2)",
        kind="positive_float",
    )
    epochs: int = declare(
        _FROM_RECIPE, help=f"default: {_by_recipe('epochs')}", kind="positive_int"
    )
    batch_size: int = declare(
        _FROM_RECIPE, help=f"default: {_by_recipe('batch_size')}", kind="positive_int"
    )
    lr: float = declare(_FROM_RECIPE, help=f"default: {_by_recipe('lr')}", kind="positive_float")
    lr_decay: float = declare(
        _FROM_RECIPE,
        help=f"lr factor at each decay, at most 1 (default: {_by_recipe('lr_decay')})",
        kind="positive_float",
    )
    lr_decay_every: float = declare(
        _FROM_RECIPE,
        help="epochs between lr decays, fractions allowed "
        f"(default: {_by_recipe('lr_decay_every')})",
        kind="positive_float",
        metavar="EPOCHS",
    )
    optimizer: str = declare(
        _FROM_RECIPE,
        help="default: " + ", ".join(f"{n} {r.optimizer}" for n, r in RECIPES.items()),
        choices=OPTIMIZERS,
    )
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = declare(
        _FROM_RECIPE, help=f"default: {_by_recipe('weight_decay')}", kind="nonnegative_float"
    )
    grad_clip_norm: float | None = declare(
        None,
        help="clip the gradient norm to this (default: no clipping)",
        kind="positive_float",
        flags=("--grad-clip",),
    )
    samples_per_epoch: int | None = declare(
        None,
        help="--mix ratio only; default: original samples x (1 + ratio)",
        kind="positive_int",
    )
    shuffle_buffer: int = declare(
        1000, help="samples (default %(default)s)", kind="nonnegative_int"
    )
    max_text_length: int = declare(
        _FROM_RECIPE,
        help=f"tokens per caption (default: {_by_recipe('max_text_length')})",
        kind="positive_int",
    )
    image_key: str = "jpg"
    text_key: str = "txt"
    seed: int = declare(
        0,
        help="seed of the shard order, shuffle and mix draws, >= 0 (default: %(default)s)",
        kind="nonnegative_int",
    )
    device: str | None = declare(None, help="torch device (default: cuda if available)")
    precision: str = declare(
        "auto",
        help="auto: bf16 autocast on CUDA, fp32 on CPU; bf16, fp16: mixed precision, CUDA "
        "only (default: %(default)s)",
        choices=PRECISIONS,
    )
    num_workers: int = declare(
        0, help="DataLoader workers (default %(default)s)", kind="nonnegative_int"
    )
    log_every: int = declare(
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


__all__ = [
    "MIXES",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECIPES",
    "Recipe",
    "TrainConfig",
    "TrainPlan",
    "plan_training",
]
