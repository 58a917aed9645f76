"""A tiny, seeded, randomly initialised BLIP retrieval model (``BlipForImageTextRetrieval`` +
``BlipProcessor``) for offline tests.

The weights are random, so the embeddings mean nothing; what the tests exercise is the real
loading code (``from_pretrained`` on a saved folder, as with ``Salesforce/blip-itm-base-coco``),
the batching and the ITC embedding path. The tokenizer is a BERT WordPiece tokenizer over a
small word list written to ``vocab.txt``; images of any size are resized to 32x32; texts are cut
at ``MAX_POSITIONS`` tokens.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]"]
WORDS = [
    "a", "an", "the", "dog", "cat", "man", "woman", "person", "bus", "car", "tree", "grass",
    "ball", "on", "in", "with", "of", "near", "red", "blue", "green", "small", "large", "sits",
    "stands", "runs", "street", "field", "table", "two", ".", ",",
]  # fmt: skip
IMAGE_SIZE = 32
MAX_POSITIONS = 40


def build_tiny_blip_retrieval(path: Path, seed: int = 0) -> Path:
    """Build a tiny ``BlipForImageTextRetrieval`` + ``BlipProcessor``; ``save_pretrained`` both.

    Deterministic for a given ``seed``. Returns ``path``, which
    ``BlipForImageTextRetrieval.from_pretrained`` and ``AutoProcessor.from_pretrained`` load
    like a hub model.
    """
    import torch
    from transformers import (
        BertTokenizer,
        BlipConfig,
        BlipForImageTextRetrieval,
        BlipImageProcessor,
        BlipProcessor,
    )

    path = Path(path)
    vocab_dir = path.parent / f"{path.name}-vocab-src"
    vocab_dir.mkdir(parents=True, exist_ok=True)
    (vocab_dir / "vocab.txt").write_text("\n".join(SPECIAL_TOKENS + WORDS) + "\n", "utf-8")
    # As in the BLIP checkpoints: [DEC] is the bos token; the text encoder reads [CLS] first.
    tokenizer = BertTokenizer.from_pretrained(
        str(vocab_dir), bos_token="[DEC]", model_max_length=512
    )
    image_processor = BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = BlipProcessor(image_processor=image_processor, tokenizer=tokenizer)

    config = BlipConfig(
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": IMAGE_SIZE,
            "patch_size": 8,
            "projection_dim": 16,
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
            "max_position_embeddings": MAX_POSITIONS,
            "projection_dim": 16,
            # BLIP's default (0.02) embeds every caption alike at this size; 0.2 tells them apart.
            "initializer_range": 0.2,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.sep_token_id,
            "sep_token_id": tokenizer.sep_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        projection_dim=16,
        image_text_hidden_size=16,
    )
    torch.manual_seed(seed)
    model = BlipForImageTextRetrieval(config).eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
