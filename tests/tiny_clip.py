"""A tiny, seeded, randomly initialised CLIP (``CLIPModel`` + ``CLIPProcessor``) for offline tests.

The weights are random, so the embeddings mean nothing; what the tests exercise is the real
loading code (``from_pretrained`` on a saved folder, as with a hub id), the batching, the
normalisation and training steps. Images of any size are resized and cropped to 32x32.
"""

from __future__ import annotations

from pathlib import Path

from counterfactual.testing import BOS, EOS, write_clip_tokenizer_files

IMAGE_SIZE = 32


def build_tiny_clip(path: Path, seed: int = 0) -> Path:
    """Build a tiny ``CLIPModel`` and its ``CLIPProcessor``; ``save_pretrained`` both to ``path``.

    Deterministic for a given ``seed``. Returns ``path``, which ``CLIPModel.from_pretrained``
    and ``AutoProcessor.from_pretrained`` load like a hub model.
    """
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTextConfig,
        CLIPTokenizer,
        CLIPVisionConfig,
    )

    path = Path(path)
    tokenizer_dir = path.parent / f"{path.name}-tokenizer-src"
    write_clip_tokenizer_files(tokenizer_dir)
    tokenizer = CLIPTokenizer.from_pretrained(str(tokenizer_dir), model_max_length=77)
    text = CLIPTextConfig(
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(EOS),
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        max_position_embeddings=77,
        vocab_size=len(tokenizer),
    )
    vision = CLIPVisionConfig(
        image_size=IMAGE_SIZE,
        patch_size=8,
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
    )
    config = CLIPConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16
    )
    torch.manual_seed(seed)
    model = CLIPModel(config)
    model.save_pretrained(str(path))
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(str(path))
    return path
