"""The ``lama-batches`` section of ``make bench``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from common import Arg, Section
from gpu_models import (
    coco_requests,
    counted,
    tiny_lama,
)


def bench_lama_batches(work: Path, n: int, batch: int = 8) -> dict[str, float]:
    """LaMa forwards per batch of ``batch`` COCO-like crops, old grouping against canvases."""
    import torch

    from counterfactual.image import ImageConfig, make_editor
    from counterfactual.image.lama import WORK_SIDE, LamaConfig

    torch.set_num_threads(1)
    model = tiny_lama(work)
    requests = coco_requests(work, n)
    figures: dict[str, float] = {"lama_batches_items": float(len(requests))}
    for name, side in (("exact", 0), ("canvas", WORK_SIDE)):
        config = ImageConfig(
            method="inpaint", backend="lama", lama=LamaConfig(str(model), work_side=side)
        )
        editor = make_editor(config, batch_size=batch)
        sizes = counted(editor)
        per_batch = []
        start = time.perf_counter()
        for first in range(0, len(requests) - batch + 1, batch):
            before = len(sizes)
            editor(requests[first : first + batch])
            per_batch.append(len(sizes) - before)
        seconds = time.perf_counter() - start
        figures[f"lama_batches_{name}_forwards_per_batch"] = float(np.mean(per_batch))
        figures[f"lama_batches_{name}_items_per_forward"] = float(np.mean(sizes))
        figures[f"lama_batches_{name}_tiny_cpu_ms_per_item"] = (
            1000 * seconds / (batch * len(per_batch))
        )
    figures["lama_batches_forwards_exact_over_canvas"] = (
        figures["lama_batches_exact_forwards_per_batch"]
        / figures["lama_batches_canvas_forwards_per_batch"]
    )
    return figures


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_lama_batches(work, args.lama_batch_images)


SECTION = Section(
    "lama-batches",
    run,
    args=(Arg("--lama-batch-images", {"type": int, "default": 48}),),
    note="The tests' tiny TorchScript LaMa through the lama backend, batches of 8 generated "
    "640x480 COCO-like pictures with one annotated box as the mask: forwards per batch and "
    "items per forward with the old grouping by exact padded size (lama_work_side 0) and "
    "with the square canvases (default 512); exact_over_canvas: their forwards' ratio.",
)
