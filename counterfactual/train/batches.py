"""The samples of an epoch and the batches built from them: :func:`epoch_samples` (a WebDataset
pipeline seeded by the seed and the epoch, ``ratio`` or ``union``), then shuffled, decoded and
put through the processor in DataLoader workers (``_Batcher``), bad samples counted by reason
(the ``MISSING_IMAGE`` ... constants, besides the decoding ones)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Generator, Iterator, Mapping
from typing import Any

from PIL import Image

from counterfactual.imageio import SampleError, decode_rgb
from counterfactual.train.config import TrainConfig, TrainPlan
from counterfactual.train.mix import SeededShards, mixed_dataset

MISSING_IMAGE = "missing-image"
MISSING_TEXT = "missing-text"
BAD_CAPTION = "bad-caption"
EMPTY_CAPTION = "empty-caption"
"""Reasons a sample is skipped (counted in ``TrainResult.skipped`` and the log), besides the
decoding ones of :func:`counterfactual.imageio.decode_rgb` (``decode-error``,
``image-too-large``)."""


def epoch_seed(seed: int, epoch: int) -> int:
    # Independent of how earlier epochs ran, so a resumed run draws the same data.
    return (seed * 1_000_003 + epoch * 7_919 + 1) & 0x7FFFFFFF


def epoch_samples(config: TrainConfig, plan: TrainPlan, epoch: int) -> Any:
    """The raw samples (bytes under their extensions, ``__key__``, ``__url__``) that 0-based
    ``epoch`` reads, before the shuffle buffer, as a WebDataset pipeline seeded by
    ``config.seed`` and ``epoch``. ``ratio``: endless, drawn as ``counterfactual.train.mix`` draws.
    ``union``: every shard of ``plan`` once, each side's in a shuffled order and split between
    the DataLoader workers iterating it, the sides interleaved at random in proportion to their
    samples; then it ends."""
    import webdataset as wds

    seed = epoch_seed(config.seed, epoch)
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


def epoch_batches(
    config: TrainConfig, plan: TrainPlan, processor: Any, epoch: int, device: Any
) -> Generator[dict[str, Any], None, None]:
    """The batches of 0-based ``epoch`` (endless with ``ratio``), built in DataLoader workers
    when ``num_workers > 0``. Each is ``{"inputs", "size", "synthetic", "skipped"}``."""
    import torch

    batcher = _Batcher(config, processor, frozenset(plan.synthetic), epoch_seed(config.seed, epoch))
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


__all__ = ["BAD_CAPTION", "EMPTY_CAPTION", "MISSING_IMAGE", "MISSING_TEXT", "epoch_samples"]
