"""The ``gpu`` section of ``make bench``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import Arg, Section, generated, ray_run
from gpu_models import (
    BIG_LAMA,
    CLIP_224_TINY,
    CLIP_VIT_L14,
    REDUCED_LAMA,
    SD2_INPAINT,
    SD2_REDUCED,
    SDXL_INPAINT,
    SDXL_REDUCED,
    Busy,
    NoBusy,
    bare_loop,
    diffusion_unet,
    param_count,
    save_clip,
    save_diffusion_inpaint,
    save_lama_like,
)

if TYPE_CHECKING:
    from counterfactual.synth.plan import Runtime


def models_runtime(cuda: bool, dtype: str) -> Runtime:
    """Where the section's models run: every model step on ``cuda`` in ``dtype`` with CUDA,
    else the CPU in float32. Without it a run's models stay on ``Runtime``'s default, the CPU,
    in every shard worker, GPU or not."""
    from counterfactual.synth.plan import Runtime

    return Runtime(device="cuda", dtype=dtype) if cuda else Runtime()


def bench_gpu(
    work: Path, n: int, ray_run: Callable[..., Any], generated: Callable[..., list[Any]]
) -> dict[str, float]:
    """The real ``synth`` path on Ray with LaMa (verify on) at model size on CUDA, reduced on
    CPU; see the module doc. ``ray_run`` and ``generated`` are bench.py's helpers."""
    import torch

    from counterfactual.image import ImageConfig
    from counterfactual.image.lama import LamaConfig
    from counterfactual.method.verify import VerifyConfig
    from counterfactual.synth.plan import SynthConfig

    cuda = torch.cuda.is_available()
    sizes, clip_sizes = (BIG_LAMA, CLIP_VIT_L14) if cuda else (REDUCED_LAMA, CLIP_224_TINY)
    model, params = save_lama_like(work / "lama-like.pt", sizes)
    clip = save_clip(work / "clip-bench", clip_sizes)
    records = generated(work, n, (640, 480))
    config = SynthConfig(
        image=ImageConfig(method="inpaint", backend="lama", lama=LamaConfig(str(model))),
        verify=VerifyConfig(mode="record", model=clip, k=5, retention_k=5),
        images_per_shard=max(8, n // 8),
    )
    with Busy() if cuda else NoBusy() as busy:
        seconds, _, written, _, clock = ray_run(
            records, work / "gpu-run", config, runtime=models_runtime(cuda, "float32")
        )
    gpus = max(1, torch.cuda.device_count()) if cuda else 1
    figures = {
        "gpu_lama_params_millions": params / 1e6,
        "gpu_pictures": float(n),
        "gpu_samples": float(written),
        "gpu_pipeline_items_per_s": written / seconds,
        "gpu_pipeline_steady_items_per_s": clock.steady_rate(),
    }
    device = "cuda" if cuda else "cpu"
    bare = bare_loop(model, device, min(written, 512) or 8, 8)
    rate = written / seconds  # Ray up, workers and model actors starting inside the timing
    if not cuda:
        figures["gpu_cpu_reduced_vs_bare_loop"] = rate / bare
        print("GPU rows: not measured (no CUDA device)")
        return figures
    figures["gpu_lama_items_per_s_per_gpu"] = rate / gpus
    figures["gpu_lama_vs_bare_loop"] = rate / (bare * gpus)
    figures["gpu_lama_steady_vs_bare_loop"] = clock.steady_rate() / (bare * gpus)
    if (fraction := busy.fraction()) is not None:
        figures["gpu_busy_fraction"] = fraction
    print(
        f"GPU: {torch.cuda.get_device_name(0)} x{gpus}, torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}"
    )
    return figures


DIFFUSION = {"sd2": (SD2_INPAINT, SD2_REDUCED), "rorem": (SDXL_INPAINT, SDXL_REDUCED)}
"""The diffusion inpainters the section runs: full size on CUDA, reduced on CPU."""


def bench_diffusion(
    work: Path, n: int, ray_run: Callable[..., Any], generated: Callable[..., list[Any]]
) -> dict[str, float]:
    """SD 2 inpainting and SDXL inpainting (RORem's architecture, with its recipe) built from
    their published configs with random weights, saved and run through the real ``synth``
    path (the diffusers eraser, ``--inpaint-model DIR``) on Ray: float16 on CUDA at full size;
    on CPU reduced (same shape, tiny widths, 2 steps at 128 px) and the GPU rows not
    measured."""
    import torch

    from counterfactual.image import ImageConfig
    from counterfactual.image.diffusion import RECIPES, DiffusersConfig
    from counterfactual.synth.plan import SynthConfig

    cuda = torch.cuda.is_available()
    records = generated(work, n, (640, 480))
    figures: dict[str, float] = {}
    for name, (full, reduced) in DIFFUSION.items():
        figures[f"gpu_{name}_unet_params_millions"] = (
            param_count(lambda full=full: diffusion_unet(full)) / 1e6
        )
        folder = save_diffusion_inpaint(work / f"{name}-pipeline", full if cuda else reduced)
        settings = {k: v for k, v in RECIPES["rorem"].items() if k != "model"}
        options = dict(settings, recipe="rorem") if name == "rorem" else {}
        if not cuda:
            options |= {"steps": 2, "resolution": 128}
        image = ImageConfig(
            method="inpaint",
            backend="diffusers",
            diffusers=DiffusersConfig(**{**options, "model": str(folder)}),
        )
        config = SynthConfig(image=image, images_per_shard=max(4, n // 4))
        runtime = models_runtime(cuda, "float16")
        seconds, _, written, _, _ = ray_run(records, work / f"{name}-run", config, runtime=runtime)
        key = "items_per_s_per_gpu" if cuda else "cpu_reduced_items_per_s"
        gpus = max(1, torch.cuda.device_count()) if cuda else 1
        figures[f"gpu_{name}_samples"] = float(written)
        figures[f"gpu_{name}_{key}"] = written / seconds / gpus
    if not cuda:
        print("GPU rows of SD 2 and RORem (SDXL) at full size: not measured (no CUDA device)")
    return figures


def gpu_images(n: int | None) -> int:
    """The pictures: ``n``, else 2,000 on CUDA and 16 on CPU."""
    import torch

    return n if n is not None else (2_000 if torch.cuda.is_available() else 16)


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    n = gpu_images(args.gpu_images)
    figures = bench_gpu(work, n, ray_run, generated)
    return figures | bench_diffusion(work, min(n, 200), ray_run, generated)


SECTION = Section(
    "gpu",
    run,
    args=(
        Arg(
            "--gpu-images",
            {"type": int, "default": None, "help": "gpu: pictures (2,000 on CUDA, 16 on CPU)"},
        ),
    ),
    note="synth on a local Ray (LaMa inpainting, verify record) with a LaMa-like FFC generator "
    "(gpu_models.lama_like, TorchScript, big-lama's inputs and outputs; 51M parameters on "
    "CUDA) and CLIP of ViT-L/14's sizes, random weights, float32. Without CUDA it runs "
    "reduced (a narrow generator, a tiny 224 px CLIP) and the GPU rows (items/s per GPU, "
    "NVML busy fraction, ratio to the bare loop) are not measured. bare loop: the model "
    "alone, batch 8 on 512 px canvases, inputs on the device. items/s: samples over the run's "
    "seconds with Ray up (the actors' start and model load inside); steady: between the "
    "first and last shard. sd2, rorem: SD 2 inpainting and SDXL inpainting (RORem's recipe: "
    "50 steps, no guidance, 512 px) from their published configs, random weights, float16, "
    "through the diffusers eraser on at most 200 pictures; on CPU reduced widths, 2 steps at "
    "128 px, the full-size rows not measured; unet_params_millions: the full configs' UNets "
    "(866M, 2,567M), counted on the meta device.",
)
