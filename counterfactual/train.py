"""Fine-tune a Hugging Face CLIP on original + synthetic WebDataset shards (seed 002: "fine-tune
CLIP on D ∪ D'").

The defaults are the paper's recipe: 10 epochs, batch size 256, Adam at lr 2e-6, the lr halved
every 2 epochs (step decay), CLIP's symmetric contrastive loss. Samples are drawn as
``counterfactual.mix`` draws them (open_clip's ``--dataset-resampled`` with upsampling factors):
each sample is synthetic with probability ``ratio / (1 + ratio)``, shards are drawn with
replacement and read whole, and a shuffle buffer mixes their samples. An epoch is
``samples_per_epoch`` samples (by default the original count times ``1 + ratio``, so each
original sample is seen once in expectation), in full batches.

Output folder: ``train.json`` (config, versions, plan, then the result), ``train_log.jsonl`` (one
row per ``log_every`` steps and at each epoch's end), ``epoch-XX/`` after each epoch and
``final/``; each holds ``save_pretrained`` output of both model and processor, so it loads by path
like a hub id. An epoch folder appears by an atomic rename once complete, so a rerun with the same
config continues after the last one (the data each epoch draws depends only on the seed and the
epoch number, so a resumed run gives the same weights as an uninterrupted one on CPU).
"""

from __future__ import annotations

import dataclasses
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
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from counterfactual._lazy import require
from counterfactual.imageio import SampleError, decode_rgb
from counterfactual.mix import ShardSpec, count_samples, expand_shards, mixed_dataset, plan_mix

if TYPE_CHECKING:
    import torch

OPTIMIZERS = ("adam", "adamw")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""``auto``: bf16 autocast on CUDA, fp32 elsewhere. bf16/fp16 are mixed precision (autocast,
fp32 master weights; fp16 with a gradient scaler) and need CUDA."""

MISSING_IMAGE = "missing-image"
MISSING_TEXT = "missing-text"
BAD_CAPTION = "bad-caption"
EMPTY_CAPTION = "empty-caption"
"""Reasons a sample is skipped (counted in ``TrainResult.skipped`` and the log), besides the
decoding ones of :func:`counterfactual.imageio.decode_rgb` (``decode-error``,
``image-too-large``)."""

MAX_LOGIT_SCALE = math.log(100.0)  # open_clip clamps exp(logit_scale) at 100 after each step
# Config fields a resumed run may change: they do not change which samples are drawn.
_MAY_CHANGE_ON_RESUME = ("epochs", "device", "num_workers", "log_every", "precision")
_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")


@dataclass(frozen=True)
class TrainConfig:
    """Options of one fine-tuning run; checked on construction (``ValueError`` names the value).

    ``model`` is a hub id or a local folder holding a ``CLIPModel`` and its processor.
    ``original`` / ``synthetic`` are shard specs as ``counterfactual.mix`` reads them (brace
    patterns, globs, directories, ``::`` lists); they are stored as a tuple of specs. No
    synthetic shards means training on the original ones only. ``ratio`` is synthetic samples
    per original sample in expectation. ``lr`` is multiplied by ``lr_decay`` every
    ``lr_decay_every`` epochs. ``samples_per_epoch=None`` takes the original count times
    ``1 + ratio`` (``MixPlan.samples_per_epoch``). ``device=None`` picks CUDA when available.
    """

    model: str
    original: ShardSpec
    synthetic: ShardSpec = ()
    ratio: float = 0.1
    epochs: int = 10
    batch_size: int = 256
    lr: float = 2e-6
    lr_decay: float = 0.5
    lr_decay_every: int = 2
    optimizer: str = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = None
    samples_per_epoch: int | None = None
    shuffle_buffer: int = 1000
    max_text_length: int = 77
    image_key: str = "jpg"
    text_key: str = "txt"
    seed: int = 0
    device: str | None = None
    precision: str = "auto"
    num_workers: int = 0
    log_every: int = 10

    def __post_init__(self) -> None:
        if not isinstance(self.model, str | os.PathLike) or not os.fspath(self.model):
            raise ValueError(f"model must be a hub id or a folder, got {self.model!r}")
        object.__setattr__(self, "model", os.fspath(self.model))
        object.__setattr__(self, "original", _specs(self.original, "original"))
        object.__setattr__(self, "synthetic", _specs(self.synthetic, "synthetic"))
        if not self.original:
            raise ValueError("no original shards given")
        _positive("ratio", self.ratio)
        _positive("lr", self.lr)
        _positive("eps", self.eps)
        for name in ("epochs", "batch_size", "lr_decay_every", "max_text_length", "log_every"):
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
        for name in ("shuffle_buffer", "num_workers", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        for name in ("image_key", "text_key"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        if self.device is not None and (not isinstance(self.device, str) or not self.device):
            raise ValueError(f"device must be a torch device name or None, got {self.device!r}")

    def lr_at(self, epoch: int) -> float:
        """The learning rate during 0-based ``epoch``: ``lr * lr_decay ** (epoch //
        lr_decay_every)`` (paper: 2e-6 for epochs 1-2, 1e-6 for 3-4, ...)."""
        return self.lr * self.lr_decay ** (epoch // self.lr_decay_every)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return json.loads(json.dumps(data))  # tuples -> lists, as train.json holds them


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
    ``synthetic_fraction`` is the expected share of synthetic samples (0 with none)."""

    original: tuple[str, ...]
    original_samples: int
    synthetic: tuple[str, ...]
    synthetic_samples: int
    ratio: float
    samples_per_epoch: int
    steps_per_epoch: int

    @property
    def synthetic_fraction(self) -> float:
        return self.ratio / (1.0 + self.ratio) if self.synthetic else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "synthetic_fraction": self.synthetic_fraction}


def plan_training(config: TrainConfig) -> TrainPlan:
    """Expand and count the shards (``ValueError`` for a spec that matches nothing, an
    unreadable shard or a side without samples) and size the epoch: ``steps_per_epoch`` full
    batches of ``batch_size`` cover at least ``samples_per_epoch`` samples."""
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
    samples = config.samples_per_epoch or default
    return TrainPlan(
        original=tuple(original),
        original_samples=n_original,
        synthetic=tuple(synthetic),
        synthetic_samples=n_synthetic,
        ratio=config.ratio if synthetic else 0.0,
        samples_per_epoch=samples,
        steps_per_epoch=math.ceil(samples / config.batch_size),
    )


@dataclass(frozen=True)
class TrainLog:
    """One row of ``train_log.jsonl``: ``loss`` is the mean over the steps since the previous
    row; ``samples``, ``synthetic`` and ``skipped`` are totals since the run began."""

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


def train_clip(
    config: TrainConfig,
    out_dir: str | os.PathLike[str],
    progress: Callable[[TrainLog], None] | None = None,
) -> TrainResult:
    """Fine-tune ``config.model`` with CLIP's contrastive loss; see the module docstring for the
    folder it writes. ``progress`` receives each log row. Continues after the last
    ``epoch-XX`` folder of ``out_dir`` when there is one (its ``train.json`` must hold the same
    config, except epochs, device, precision, workers and logging).

    Raises ``ValueError`` for a bad device or precision, a model that does not load, shards that
    cannot be read, a resume with another config, or when a long run of samples is all bad;
    ``FloatingPointError`` when the loss is not finite (fp32/bf16; fp16 lets the scaler skip).
    """
    torch = require("torch", "models")
    transformers = require("transformers", "models")
    start = time.perf_counter()
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
    source = out / _epoch_name(resumed_from) if resumed_from else config.model
    try:
        model = transformers.CLIPModel.from_pretrained(str(source), dtype=torch.float32)
        processor = transformers.AutoProcessor.from_pretrained(str(source))
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(
            f"could not load CLIP {source!s} (a hub id or folder with a CLIPModel): {err}"
        ) from err
    step = _Step(model.to(device).train(), config, device, precision)
    state: dict[str, Any] = {"step": 0, "samples": 0, "synthetic": 0, "skipped": {}}
    state.update(first_loss=None, last_loss=None)
    if resumed_from:
        folder = out / _epoch_name(resumed_from)
        step.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        state.update(_read_json(folder / "trainer_state.json"))
    _write_json(
        out / "train.json",
        {
            "config": config.to_dict(),
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

    with log_path.open("a", encoding="utf-8") as log:
        for epoch in range(resumed_from, config.epochs):
            lr = config.lr_at(epoch)
            step.set_lr(lr)
            epoch_seed = _epoch_seed(config.seed, epoch)
            torch.manual_seed(epoch_seed)
            batches = _epoch_batches(config, plan, processor, epoch_seed, device)
            losses: list[float] = []
            window_steps, window_start = 0, time.perf_counter()
            for index in range(plan.steps_per_epoch):
                batch = next(batches)
                value = step(batch["inputs"])
                if not math.isfinite(value) and step.scaler is None:
                    raise FloatingPointError(f"loss is {value} at step {state['step'] + 1}")
                if math.isfinite(value):  # fp16: else the scaler skipped this step
                    losses.append(value)
                window_steps += 1
                state["step"] += 1
                state["samples"] += config.batch_size
                state["synthetic"] += batch["synthetic"]
                skipped.update(batch["skipped"])
                if state["step"] % config.log_every == 0 or index == plan.steps_per_epoch - 1:
                    row = TrainLog(
                        step=state["step"],
                        epoch=epoch + 1,
                        lr=lr,
                        loss=sum(losses) / len(losses) if losses else math.nan,
                        samples_per_s=window_steps
                        * config.batch_size
                        / max(time.perf_counter() - window_start, 1e-9),
                        samples=state["samples"],
                        synthetic=state["synthetic"],
                        skipped=sum(skipped.values()),
                    )
                    log.write(json.dumps(row.to_dict()) + "\n")
                    log.flush()
                    if state["first_loss"] is None:
                        state["first_loss"] = row.loss
                    state["last_loss"] = row.loss
                    if progress is not None:
                        progress(row)
                    losses = []
                    window_steps, window_start = 0, time.perf_counter()
            batches.close()  # ends the DataLoader workers of this epoch
            state["skipped"] = dict(skipped)
            _save_epoch(out, epoch + 1, model, processor, step, state)

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


class _Step:
    """One optimisation step per call on a batch of processor outputs: forward under autocast
    (bf16/fp16 on CUDA), CLIP's symmetric contrastive loss, backward (scaled for fp16),
    optional gradient-norm clipping, Adam, then the temperature clamped as open_clip does.
    Returns the loss as a float."""

    def __init__(self, model: Any, config: TrainConfig, device: Any, precision: str) -> None:
        import torch

        self.model = model
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
            loss = self.model(**inputs, return_loss=True).loss
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
            self.model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)
        return value


def _resolve_device(config: TrainConfig) -> tuple[torch.device, str]:
    import torch

    from counterfactual.models import resolve_device

    device = resolve_device(config.device)
    name = str(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available")
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
    config: TrainConfig, plan: TrainPlan, processor: Any, seed: int, device: Any
) -> Generator[dict[str, Any], None, None]:
    """Endless batches for one epoch, built in DataLoader workers when ``num_workers > 0``."""
    import torch
    import webdataset as wds

    if plan.synthetic:
        stream = mixed_dataset(list(plan.original), list(plan.synthetic), plan.ratio, seed=seed)
    else:
        stream = wds.DataPipeline(
            wds.ResampledShards(list(plan.original), seed=seed, deterministic=True),
            wds.tarfile_to_samples(),
        )
    dataset = stream.compose(_Batcher(config, processor, frozenset(plan.synthetic), seed))
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=config.num_workers,
        pin_memory=device.type == "cuda",
    )
    return _closing(loader)


def _closing(loader: Any) -> Generator[dict[str, Any], None, None]:
    iterator = iter(loader)
    try:
        yield from iterator
    finally:
        del iterator


class _Batcher:
    """A pipeline stage: raw samples -> shuffled -> decoded -> processor batches of exactly
    ``batch_size`` good samples. Each batch carries how many of its samples are synthetic and
    the bad samples skipped (by reason) since the previous batch of this worker."""

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
        synthetic = 0
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
            synthetic += sample.get("__url__") in self.synthetic
            if len(images) == self.batch_size:
                inputs = self.processor(
                    text=texts,
                    images=images,
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=self.max_text_length,
                )
                yield {"inputs": dict(inputs), "synthetic": synthetic, "skipped": dict(skipped)}
                images, texts, synthetic, skipped = [], [], 0, Counter()

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
    "OPTIMIZERS",
    "PRECISIONS",
    "TrainConfig",
    "TrainLog",
    "TrainPlan",
    "TrainResult",
    "plan_training",
    "train_clip",
]
