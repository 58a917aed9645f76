"""The ``verify`` section of ``make bench``: the verifier's seconds per sample with a CLIP of ViT-B/32 size (random weights: the
cost does not depend on them) on real photos, against one denoising step of a UNet of Stable
Diffusion 2 inpainting's size (random weights) times 30 steps, both on one core.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import Arg, Section, best_rate, real_photos

from counterfactual.imageio import load_rgb
from counterfactual.testing import (
    write_clip_tokenizer_files,
)
from counterfactual.vocab import coco_vocabulary


def bench_verify(work: Path, n: int) -> dict[str, float]:
    import torch
    from diffusers import UNet2DConditionModel
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    from counterfactual.method.verify import Verifier, VerifyConfig, VerifyRequest

    torch.set_num_threads(1)
    write_clip_tokenizer_files(work / "tok")  # a CLIP BPE vocabulary, offline
    tokenizer = CLIPTokenizer.from_pretrained(str(work / "tok"), model_max_length=77)
    config = CLIPConfig()  # the defaults are ViT-B/32's sizes
    config.text_config.vocab_size = len(tokenizer)
    config.text_config.bos_token_id = tokenizer.bos_token_id
    config.text_config.eos_token_id = config.text_config.pad_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(str(work / "clip"))
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(
        str(work / "clip")
    )
    verifier = Verifier(
        VerifyConfig(mode="record", model=f"hf-clip:{work / 'clip'}"),
        coco_vocabulary(),
        batch_size=16,
    )
    paths, _ = real_photos(work, n)
    requests = []
    for path in paths:
        image = load_rgb(path)
        requests.append(
            VerifyRequest(
                image,
                image,
                {"dog": [(40, 40, 160, 120)], "cat": [(300, 200, 120, 90)]},
                {"person": [(200, 60, 140, 300)], "chair": [(420, 250, 150, 180)]},
                ("dog", "cat"),
                ("person", "chair"),
                "A person on a chair.",
            )
        )
    verifier(requests[:2])  # warm-up
    per_sample = 1.0 / best_rate(len(requests), lambda: verifier(requests), repeat=2)

    unet = UNet2DConditionModel(
        sample_size=64,
        in_channels=9,
        out_channels=4,
        block_out_channels=(320, 640, 1280, 1280),
        attention_head_dim=(5, 10, 20, 20),
        cross_attention_dim=1024,
        use_linear_projection=True,
        layers_per_block=2,
    ).eval()
    latents = torch.randn(2, 9, 64, 64)  # classifier-free guidance: batch of 2
    context = torch.randn(2, 77, 1024)
    with torch.inference_mode():
        unet(latents, 10, encoder_hidden_states=context)  # warm-up
        start = time.perf_counter()
        unet(latents, 10, encoder_hidden_states=context)
        step = time.perf_counter() - start
    return {
        "verify_seconds_per_sample_vit_b32_cpu": per_sample,
        "diffusion_step_seconds_sd2_unet_cpu": step,
        "verify_vs_diffusion_30_steps": per_sample / (30 * step),
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_verify(work, args.verify_images)


SECTION = Section(
    "verify",
    run,
    args=(Arg("--verify-images", {"type": int, "default": 24}),),
    max_targets={
        "verify_vs_diffusion_30_steps": 0.1,
    },
)
