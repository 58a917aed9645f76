"""A tiny, seeded, randomly initialised Stable Diffusion inpainting pipeline for offline tests,
and the CLIP-style tokenizer files the tiny models here read.

The weights are random, so the pictures mean nothing; what the tests exercise is the real loading
code (``from_pretrained`` on a saved folder), the shapes, the batching and the seeding. The
component sizes follow diffusers' own ``get_dummy_components`` for the inpainting pipeline.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

BOS = "<|startoftext|>"
EOS = "<|endoftext|>"


def write_clip_tokenizer_files(folder: Path) -> None:
    """A byte-level BPE vocabulary of single characters plus a few merges, CLIP style.

    Every printable ASCII letter, digit and punctuation mark is a token, both inside a word and
    at its end (``"a</w>"``), so any English prompt tokenizes without unknown tokens.
    """
    folder.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits + string.punctuation
    tokens = [BOS, EOS]
    tokens += list(chars)
    tokens += [c + "</w>" for c in chars]
    merges = ["t h", "th e</w>", "o g</w>", "d og</w>", "a t</w>", "c at</w>"]
    tokens += ["th", "the</w>", "og</w>", "dog</w>", "at</w>", "cat</w>"]
    vocab = {token: i for i, token in enumerate(tokens)}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", "utf-8")


def build_tiny_inpaint_pipeline(path: Path) -> Path:
    """Build a tiny SD inpainting pipeline (9-channel UNet) and ``save_pretrained`` it to ``path``.

    Deterministic: the same call gives the same weights. Works at any image size that is a
    multiple of 4 (the tiny VAE downsamples by 2, the tiny UNet once more). Returns ``path``,
    which ``AutoPipelineForInpainting.from_pretrained`` loads like a hub model.
    """
    import torch
    from diffusers import (
        AutoencoderKL,
        PNDMScheduler,
        StableDiffusionInpaintPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel

    path = Path(path)
    tokenizer = _tiny_tokenizer(path)

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=32,
        in_channels=9,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
    )
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
            eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
            pad_token_id=tokenizer.convert_tokens_to_ids(EOS),
            hidden_size=32,
            intermediate_size=37,
            layer_norm_eps=1e-05,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(tokenizer),
        )
    )
    pipeline = StableDiffusionInpaintPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=PNDMScheduler(skip_prk_steps=True, steps_offset=1),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(path))
    return path


def build_tiny_sdxl_inpaint_pipeline(path: Path) -> Path:
    """Build a tiny SDXL inpainting pipeline and ``save_pretrained`` it to ``path``.

    SDXL's parts at toy sizes: two text encoders (``CLIPTextModel`` and
    ``CLIPTextModelWithProjection``, whose hidden states are concatenated for the UNet's
    cross-attention and whose pooled projection joins the size conditioning), a 9-channel UNet
    with ``addition_embed_type="text_time"`` (SDXL's micro-conditioning: six size numbers of
    8 dims each plus the 32-dim pooled text), an Euler scheduler. Deterministic; works at any
    size that is a multiple of 4. Returns ``path``; ``AutoPipelineForInpainting`` loads it as
    ``StableDiffusionXLInpaintPipeline``, as it would a hub SDXL inpainting model such as
    RORem.
    """
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLInpaintPipeline,
        UNet2DConditionModel,
    )
    from transformers import (
        CLIPTextConfig,
        CLIPTextModel,
        CLIPTextModelWithProjection,
    )

    path = Path(path)
    tokenizer, tokenizer_2 = _tiny_tokenizer(path), _tiny_tokenizer(path)

    time_dim, text_dim = 8, 32
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=2,
        sample_size=32,
        in_channels=9,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=time_dim,
        transformer_layers_per_block=(1, 2),
        projection_class_embeddings_input_dim=6 * time_dim + text_dim,
        cross_attention_dim=2 * text_dim,
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
        sample_size=128,
    )
    text_config = CLIPTextConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(EOS),
        hidden_size=text_dim,
        intermediate_size=37,
        layer_norm_eps=1e-05,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=len(tokenizer),
        hidden_act="gelu",
        projection_dim=text_dim,
    )
    torch.manual_seed(0)
    text_encoder = CLIPTextModel(text_config)
    torch.manual_seed(0)
    text_encoder_2 = CLIPTextModelWithProjection(text_config)
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        steps_offset=1,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
    )
    pipeline = StableDiffusionXLInpaintPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer_2,
        unet=unet,
        scheduler=scheduler,
        requires_aesthetics_score=False,
        force_zeros_for_empty_prompt=True,
    )
    pipeline.save_pretrained(str(path))
    return path


def _tiny_tokenizer(path: Path) -> Any:
    """The tests' CLIP tokenizer, written beside ``path`` and loaded by folder (in transformers
    5 the v4 keywords ``vocab_file=``/``merges_file=`` are not honoured)."""
    from transformers import CLIPTokenizer

    tokenizer_dir = path.parent / f"{path.name}-tokenizer-src"
    write_clip_tokenizer_files(tokenizer_dir)
    return CLIPTokenizer.from_pretrained(str(tokenizer_dir), model_max_length=77)
