"""What one item costs each model stage on one GPU: the figure that sizes the stages' actors
(:func:`counterfactual.synth.layout.plan_layout`: a light stage's capacity must be
``VERIFY_HEADROOM`` times the inpainter's rate).

A cost is seconds per item on one GPU at the stage's batch. None of these has been measured
on a GPU yet (the ``gpu`` and ``verify-cost`` sections of ``make bench`` measure them when a
GPU is lent): each is a FLOP-based estimate, ``flops / (EFFICIENCY x peak)`` on an H100 SXM
(:data:`PEAK_FLOPS`: dense float16, or TF32 for LaMa's float32 convolutions, which cuDNN runs
in TF32 by default). The FLOPs were counted with ``torch.utils.flop_counter.FlopCounterMode``
on the published architectures (``benchmarks/gpu_models.py``: big-lama's generator, CLIP
ViT-L/14, SD 2 and SDXL inpainting), two per multiply-add; LaMa's FFTs are not counted. A
user who measured their own passes ``--stage-cost STAGE=SECONDS``, which wins. Only the
ratios between the stages matter to the layout, not the absolute seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from counterfactual.image import ImageConfig, chosen_eraser

PEAK_FLOPS = {"float16": 989e12, "tf32": 495e12}
"""An H100 SXM's dense tensor-core peak per precision (NVIDIA's datasheet), FLOP/s."""
EFFICIENCY = 0.4
"""The share of the peak a model's forward is assumed to reach (large batched convolutions
and attention; the same for every stage, so it cancels in the ratios)."""

LAMA_512_FLOPS = 439.8e9
"""big-lama's generator (``gpu_models.BIG_LAMA``, 51M parameters) on a 512 px canvas, the
largest ``--lama-work-side`` (convolutions; its FFTs uncounted)."""
CLIP_L14_FLOPS = 162.0e9
"""CLIP ViT-L/14's image tower on one 224 px crop."""
VERIFY_CROPS = 4
"""Crops verify embeds per item: the removed box before and after, two kept classes (what the
``verify-cost`` bench counts on COCO-like pictures)."""
SD2_UNET_FLOPS = 804.4e9
"""SD 2 inpainting's UNet (866M parameters) on one 64x64 latent (512 px), one call."""
SDXL_UNET_FLOPS = 1588.9e9
"""SDXL inpainting's UNet (2.57B parameters, RORem's) on one 64x64 latent (512 px), one call."""
VAE_FLOPS = 3631.2e9
"""The SD 2 / SDXL VAE's encoder (1116.7e9) and decoder (2514.5e9) at 512 px."""
OWLV2_FLOPS = 1090e9
"""OWLv2 base/16 on a 960 px picture (3,600 patches through 12 ViT-B layers, counted by hand:
12 N d^2 + 2 N^2 d multiply-adds a layer); the detector's boxes head is left out."""
BLIP_FLOPS = 110e9
"""BLIP base's ViT-B/16 on a 384 px picture (576 patches, counted as OWLv2's); the text
decoder's tokens are left out (they cost latency more than FLOPs)."""


@dataclass(frozen=True, slots=True)
class StageCost:
    """A model stage's cost: ``seconds`` per item on one GPU, and ``source`` in words."""

    seconds: float
    source: str


def flop_seconds(flops: float, precision: str = "float16") -> float:
    """Seconds of ``flops`` on one GPU at :data:`EFFICIENCY` of its ``precision``'s peak."""
    return flops / (EFFICIENCY * PEAK_FLOPS[precision])


LAMA = StageCost(flop_seconds(LAMA_512_FLOPS, "tf32"), "FLOP estimate: big-lama at 512 px, TF32")
VERIFY = StageCost(
    flop_seconds(VERIFY_CROPS * CLIP_L14_FLOPS),
    f"FLOP estimate: CLIP ViT-L/14, {VERIFY_CROPS} crops of 224 px, float16",
)
DETECT = StageCost(flop_seconds(OWLV2_FLOPS), "FLOP estimate: OWLv2 base/16 at 960 px, float16")
CAPTION = StageCost(flop_seconds(BLIP_FLOPS), "FLOP estimate: BLIP base at 384 px, float16")


def inpaint_cost(image: ImageConfig) -> StageCost | None:
    """The inpainter's cost per item: LaMa's at 512 px; a diffusers pipeline's from its
    settings: UNet calls (``steps x strength``, twice with classifier-free guidance, i.e.
    ``guidance_scale > 1``) at its working size (FLOPs grow with the latent's area) plus the
    VAE, times the best-of-n candidates. An SDXL UNet for the ``rorem`` and ``sdxl`` recipes
    or a model named ``*xl*``, else SD 2's. ``None`` for an eraser of unknown cost (a
    plugin's): the layout then gives the light stages their minimum."""
    name = chosen_eraser(image).name
    if name == "lama":
        return LAMA
    if name != "diffusers":
        return None
    c = image.diffusers
    xl = c.recipe in ("rorem", "sdxl") or "xl" in c.model.lower()
    side = c.resolution or (1024 if xl else 512)
    area = (side / 512) ** 2
    calls = max(1, math.floor(c.steps * c.strength)) * (2 if c.guidance_scale > 1 else 1)
    unet = SDXL_UNET_FLOPS if xl else SD2_UNET_FLOPS
    flops = (calls * unet + VAE_FLOPS) * area * c.candidates
    what = "SDXL" if xl else "SD 2"
    return StageCost(
        flop_seconds(flops),
        f"FLOP estimate: {what} inpainting, {calls} UNet calls at {side} px, float16",
    )
