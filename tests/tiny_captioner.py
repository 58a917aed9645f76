"""A tiny, seeded, randomly initialised BLIP captioner for offline tests.

The weights are random, so the captions are random words; what the tests exercise is the real
loading code (``AutoProcessor`` / ``AutoModelForImageTextToText.from_pretrained`` on a saved
folder), the batching, the decoding and the determinism.

BLIP conventions the tiny model keeps (as in ``Salesforce/blip-image-captioning-base``): the
tokenizer is a BERT WordPiece tokenizer with ``[DEC]`` added as its ``bos_token``; generation
starts from ``text_config.bos_token_id`` (``[DEC]``), stops at ``text_config.sep_token_id``
(``[SEP]``) and pads with ``text_config.pad_token_id`` (``[PAD]``). All three are special tokens,
so ``skip_special_tokens=True`` leaves only the words.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]"]
WORDS = [
    "a", "an", "the", "dog", "cat", "man", "woman", "person", "bus", "car", "tree", "grass",
    "ball", "on", "in", "with", "of", "near", "red", "blue", "green", "small", "large", "sits",
    "stands", "runs", "street", "field", "table", "two",
]  # fmt: skip
IMAGE_SIZE = 32


def _write_vocab(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + WORDS) + "\n", encoding="utf-8")


def build_tiny_blip(path: Path, *, empty_captions: bool = False) -> Path:
    """Build a tiny ``BlipForConditionalGeneration`` + ``BlipProcessor``, ``save_pretrained`` both.

    Deterministic: the same call gives the same weights. Images of any size are resized to
    32x32. With ``empty_captions=True`` the decoder always emits ``[SEP]`` first, so every caption
    decodes to ``""`` (to test the empty-caption path). Returns ``path``.
    """
    import torch
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForConditionalGeneration,
        BlipImageProcessor,
        BlipProcessor,
    )

    path = Path(path)
    vocab_dir = path.parent / f"{path.name}-vocab-src"
    _write_vocab(vocab_dir)
    # Load by folder, as a user would; [DEC] becomes the bos token like in the BLIP checkpoints.
    tokenizer = BertTokenizer.from_pretrained(str(vocab_dir), bos_token="[DEC]")
    # Without torchvision, transformers 5 builds the PIL backend (BlipImageProcessorPil) here.
    image_processor = BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = BlipProcessor(image_processor=image_processor, tokenizer=tokenizer)

    config = BlipConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "image_size": IMAGE_SIZE,
            "patch_size": 8,
            "projection_dim": 32,
            # BLIP's default (1e-10) makes every image embed alike; 0.02 lets the image matter.
            "initializer_range": 0.02,
        },
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "encoder_hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "projection_dim": 32,
            # BLIP's default (0.02) gives one caption for every image at this size; 0.5 gives
            # confident logits (no near-ties between batched and single runs) that follow the image.
            "initializer_range": 0.5,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.sep_token_id,
            "sep_token_id": tokenizer.sep_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        projection_dim=32,
        image_text_hidden_size=32,
    )
    torch.manual_seed(0)
    model = BlipForConditionalGeneration(config).eval()
    if empty_captions:
        with torch.no_grad():
            bias = model.text_decoder.cls.predictions.bias
            bias.zero_()
            bias[tokenizer.sep_token_id] = 1e4

    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
