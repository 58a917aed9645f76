"""A tiny, seeded, randomly initialised Grounding DINO detector for offline tests.

The weights are random, so the boxes mean nothing; what the tests exercise is the real loading
code (``AutoConfig``, ``AutoModelForZeroShotObjectDetection`` and ``AutoProcessor`` on a saved
folder), the one-text prompt with its token offsets, batching with padded images and the box
rescaling. The backbone is a tiny Swin (no timm), the text encoder a tiny BERT.
"""

from __future__ import annotations

from pathlib import Path

SHORTEST_EDGE = 32
LONGEST_EDGE = 64
"""The tiny image processor resizes every picture to fit these, keeping its aspect ratio."""
MAX_TEXT_LEN = 64
"""Tokens the tiny model reads per text, ``[CLS]`` and ``[SEP]`` included (the real one: 256)."""

_WORDS = (
    "a photo of person bicycle car dog cat bird horse sheep cow bench umbrella cup bowl "
    "hot coffee teddy bear rocket flag helmet saucer camera tripod chair couch"
).split()


def _write_vocab(path: Path) -> None:
    """A BERT ``vocab.txt`` whose special tokens have BERT's ids: Grounding DINO splits phrases
    at the fixed ids 101 ([CLS]), 102 ([SEP]), 1012 (".") and 1029 ("?")."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)]
    tokens += ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += [w for w in dict.fromkeys(_WORDS) if w not in letters]
    tokens += list(letters) + [f"##{c}" for c in letters] + ["-", ",", "'"]
    for token, index in ((".", 1012), ("?", 1029)):
        assert len(tokens) <= index
        tokens += [f"[unused{i}]" for i in range(len(tokens), index)] + [token]
    assert len(tokens) == len(set(tokens))
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")


def build_tiny_grounding_dino(path: Path, seed: int = 0, grid_boxes: bool = False) -> Path:
    """Build a tiny ``GroundingDinoForObjectDetection`` with its ``GroundingDinoProcessor`` and
    ``save_pretrained`` both to ``path``; returns ``path``. Same ``seed``, same weights.

    ``grid_boxes``: zero the last layer of every box head, so each object query keeps its
    encoder proposal (a box on the feature grid, 5 % to 40 % of the picture) instead of the
    degenerate boxes random weights give; class scores stay random.
    """
    import torch
    from transformers import (
        BertConfig,
        BertTokenizer,
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessorPil,
        GroundingDinoProcessor,
        SwinConfig,
    )

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = path.parent / f"{path.name}-vocab.txt"
    _write_vocab(vocab)
    tokenizer = BertTokenizer(str(vocab))
    image_processor = GroundingDinoImageProcessorPil(
        size={"shortest_edge": SHORTEST_EDGE, "longest_edge": LONGEST_EDGE}
    )
    processor = GroundingDinoProcessor(image_processor=image_processor, tokenizer=tokenizer)
    config = GroundingDinoConfig(
        backbone_config=SwinConfig(
            embed_dim=8,
            depths=[1, 1, 1, 1],
            num_heads=[1, 1, 1, 1],
            window_size=2,
            image_size=SHORTEST_EDGE,
            out_indices=[2, 3, 4],
        ),
        text_config=BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=MAX_TEXT_LEN,
        ),
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,  # a single layer breaks the tied box heads
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_n_points=2,
        decoder_n_points=2,
        num_queries=12,
        max_text_len=MAX_TEXT_LEN,
    )
    torch.manual_seed(seed)
    model = GroundingDinoForObjectDetection(config).eval()
    if grid_boxes:
        with torch.no_grad():
            for name, module in model.named_modules():
                if "bbox_embed" in name and type(module).__name__.endswith("PredictionHead"):
                    module.layers[-1].weight.zero_()
                    module.layers[-1].bias.zero_()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
