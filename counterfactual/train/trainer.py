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
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from counterfactual._lazy import require
from counterfactual.models.runtime import resolve_device
from counterfactual.train.batches import epoch_batches, epoch_samples, epoch_seed
from counterfactual.train.config import (
    MIXES,
    OPTIMIZERS,
    PRECISIONS,
    RECIPES,
    Recipe,
    TrainConfig,
    TrainPlan,
    plan_training,
)
from counterfactual.train.families import BLIP_TEMPERATURE, FAMILIES, Step, contrastive_loss
from counterfactual.train.folders import (
    check_same_config,
    epoch_name,
    keep_log_rows,
    last_epoch,
    library_versions,
    read_json,
    save_epoch,
    save_folder,
    write_json,
)

if TYPE_CHECKING:
    import torch


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
    require("torch", "models")
    start = time.perf_counter()
    out = Path(out_dir)
    device, precision = _resolve_device(config)
    plan = plan_training(config)
    resumed_from = _open_folder(out, config)  # 1
    model, processor, step, state = _load_start(out, config, resumed_from, device, precision)  # 2
    _record_start(out, config, plan, device, precision, resumed_from)  # 3
    log_path = out / "train_log.jsonl"
    keep_log_rows(log_path, resumed_from)
    skipped: Counter[str] = Counter(state["skipped"])
    with log_path.open("a", encoding="utf-8") as log:
        emit = _Emit(log, state, progress)
        for epoch in range(resumed_from, config.epochs):  # 4
            _train_epoch(epoch, config, plan, processor, device, step, state, skipped, emit)
            state["skipped"] = dict(skipped)
            save_epoch(out, epoch + 1, model, processor, step, state)
    return _finish(out, config, model, processor, state, resumed_from, start)  # 5


def _open_folder(out: Path, config: TrainConfig) -> int:
    """Step 1, the folder: made, half-written epochs (``*.tmp``) removed, and the last complete
    epoch found (0: a fresh run), a resume checked against the config its ``train.json`` holds."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale)
    resumed_from = last_epoch(out)
    if resumed_from > config.epochs:
        raise ValueError(
            f"{out} already holds epoch-{resumed_from:02d}, more than epochs={config.epochs}"
        )
    if resumed_from:
        check_same_config(out / "train.json", config)
    return resumed_from


def _load_start(
    out: Path, config: TrainConfig, resumed_from: int, device: torch.device, precision: str
) -> tuple[Any, Any, Step, dict[str, Any]]:
    """Step 2, the model: ``config.model``, or the last epoch's when resuming with the
    optimizer's state and the counters (``step``, ``samples``, ``synthetic``, ``skipped``,
    ``first_loss``, ``last_loss``); ``(model, processor, step, state)``."""
    torch = require("torch", "models")
    source = out / epoch_name(resumed_from) if resumed_from else config.model
    family = FAMILIES[config.recipe]
    model, processor = family.load(str(source))
    step = Step(model.to(device).train(), family, config, device, precision)
    state: dict[str, Any] = {"step": 0, "samples": 0, "synthetic": 0, "skipped": {}}
    state.update(first_loss=None, last_loss=None)
    if resumed_from:
        folder = out / epoch_name(resumed_from)
        step.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        state.update(read_json(folder / "trainer_state.json"))
    return model, processor, step, state


def _record_start(
    out: Path,
    config: TrainConfig,
    plan: TrainPlan,
    device: torch.device,
    precision: str,
    resumed_from: int,
) -> None:
    """Step 3, the run's record: ``train.json`` with the config, recipe, plan and versions,
    ``"status": "running"`` (the log is cut back to the resumed epoch beside it)."""
    write_json(
        out / "train.json",
        {
            "config": config.to_dict(),
            "recipe": RECIPES[config.recipe].to_dict(),
            "device": str(device),
            "precision": precision,
            "plan": plan.to_dict(),
            "versions": library_versions(),
            "status": "running",
            "resumed_from": resumed_from,
        },
    )


class _Emit:
    """Writes a log row to ``train_log.jsonl`` (flushed), keeps the first and last loss in the
    run's state and hands the row to ``progress``."""

    def __init__(
        self, log: IO[str], state: dict[str, Any], progress: Callable[[TrainLog], None] | None
    ) -> None:
        self.log, self.state, self.progress = log, state, progress

    def __call__(self, row: TrainLog) -> None:
        self.log.write(json.dumps(row.to_dict()) + "\n")
        self.log.flush()
        if self.state["first_loss"] is None:
            self.state["first_loss"] = row.loss
        self.state["last_loss"] = row.loss
        if self.progress is not None:
            self.progress(row)


def _train_epoch(
    epoch: int,
    config: TrainConfig,
    plan: TrainPlan,
    processor: Any,
    device: torch.device,
    step: Step,
    state: dict[str, Any],
    skipped: Counter[str],
    emit: Callable[[TrainLog], None],
) -> None:
    """Step 4, one 0-based epoch: its seeded batches, steps at the schedule's lr, a log row every
    ``log_every`` steps and at the epoch's end; ``state`` and ``skipped`` counted on. An epoch
    without a batch is a ``ValueError``, a loss that is not finite (no fp16 scaler) a
    ``FloatingPointError``."""
    torch = require("torch", "models")
    per_epoch = plan.steps_per_epoch
    torch.manual_seed(epoch_seed(config.seed, epoch))
    batches = epoch_batches(config, plan, processor, epoch, device)
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


def _finish(
    out: Path,
    config: TrainConfig,
    model: Any,
    processor: Any,
    state: dict[str, Any],
    resumed_from: int,
    start: float,
) -> TrainResult:
    """Step 5, the end: ``final/`` (model and processor) and the record's result,
    ``"status": "done"``."""
    final = out / "final"
    save_folder(final, model, processor)
    result = TrainResult(
        out_dir=out,
        final_dir=final,
        epochs=config.epochs,
        steps=state["step"],
        samples=state["samples"],
        synthetic=state["synthetic"],
        skipped=dict(state["skipped"]),
        first_loss=state["first_loss"],
        last_loss=state["last_loss"],
        resumed_from=resumed_from,
        seconds=time.perf_counter() - start,
    )
    info = read_json(out / "train.json")
    write_json(out / "train.json", {**info, "status": "done", "result": result.to_dict()})
    return result


train_clip = fine_tune
"""Another name of :func:`fine_tune` (which trains whatever the recipe names)."""


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
