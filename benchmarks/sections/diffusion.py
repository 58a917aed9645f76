"""The ``diffusion`` section of ``make bench``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import Arg, Section, real_photos

from counterfactual.image import (
    DiffusersConfig,
    EditRequest,
    ImageConfig,
    make_editor,
)
from counterfactual.imageio import load_rgb


def bench_diffusion_gpu(work: Path, n: int, model: str | None) -> dict[str, float]:
    """Images/s per GPU of the diffusion inpainting stage (padded crop, 512 px, 30 steps, batch
    8, float16) on real photos, when a CUDA device and a model (hub id in the local cache, or a
    path: ``--inpaint-model``) are there; otherwise nothing is measured."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available() or not model:
        print("diffusion on GPU: not measured (needs a CUDA device and --inpaint-model)")
        return {}
    paths, masks = real_photos(work, n)
    config = ImageConfig(
        method="inpaint", backend="diffusers", diffusers=DiffusersConfig(model=model)
    )
    editor = make_editor(config, device="cuda", dtype="float16", batch_size=8)
    requests = [
        EditRequest(load_rgb(p), m, ("object",), ("background",), i)
        for i, (p, m) in enumerate(zip(paths, masks, strict=True))
    ]
    editor(requests[:8])  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    editor(requests)
    torch.cuda.synchronize()
    return {"diffusion_images_per_s_per_gpu": len(requests) / (time.perf_counter() - start)}


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_diffusion_gpu(work, 64, args.inpaint_model)


SECTION = Section(
    "diffusion",
    run,
    args=(Arg("--inpaint-model", {"default": None, "help": "diffusers model for the GPU figure"}),),
)
