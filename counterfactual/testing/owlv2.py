"""A tiny, seeded, randomly initialised OWLv2 detector for offline tests and benchmarks.

The weights are random, so the boxes mean nothing; what the tests exercise is the real loading
code (``AutoModelForZeroShotObjectDetection`` / ``AutoProcessor`` on a saved folder), the
pad-to-square preprocessing, per-image text queries, batching and the box rescaling.
"""

from __future__ import annotations

import json
from pathlib import Path

from counterfactual.testing.diffusion import BOS, EOS, write_clip_tokenizer_files

IMAGE_SIZE = 32
"""Side of the square the tiny image processor resizes every (padded) image to."""
PATCH_SIZE = 8
MAX_TEXT_LENGTH = 16


def write_owl_tokenizer_files(folder: Path) -> None:
    """The CLIP-style files of :func:`write_clip_tokenizer_files` with BOS and EOS given the two
    highest ids, as in CLIP's own vocabulary (49406, 49407).

    OWLv2 relies on both: a query counts as real when its first token id is above 0
    (``input_ids[..., 0] > 0``), and the text embedding is the state at the highest id
    (``input_ids.argmax(-1)``, meant to find EOS). With BOS at id 0 every query is masked out;
    with BOS above EOS every query embeds to the same vector.
    """
    write_clip_tokenizer_files(folder)
    vocab_path = folder / "vocab.json"
    vocab = json.loads(vocab_path.read_text(encoding="utf-8"))
    tokens = [t for t in sorted(vocab, key=vocab.__getitem__) if t not in (BOS, EOS)]
    tokens += [BOS, EOS]
    vocab_path.write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")


def build_tiny_owlv2(path: Path, seed: int = 0, grid_boxes: bool = False) -> Path:
    """Build a tiny ``Owlv2ForObjectDetection`` with its ``Owlv2Processor`` and
    ``save_pretrained`` both to ``path``; returns ``path``. Same ``seed``, same weights.

    ``grid_boxes``: zero the last layer of the box head, so each patch predicts OWLv2's prior
    box for its place (a patch-sized box on the patch grid) instead of the degenerate boxes
    random weights give; the class scores stay random. Pipelines then get boxes the alpha rules
    can work with (a random class per tile), as they would from a trained detector.
    """
    import torch
    from transformers import (
        CLIPTokenizer,
        Owlv2Config,
        Owlv2ForObjectDetection,
        Owlv2ImageProcessor,
        Owlv2Processor,
    )

    path = Path(path)
    tokenizer_dir = path.parent / f"{path.name}-tokenizer-src"
    write_owl_tokenizer_files(tokenizer_dir)
    tokenizer = CLIPTokenizer.from_pretrained(str(tokenizer_dir), model_max_length=MAX_TEXT_LENGTH)
    image_processor = Owlv2ImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = Owlv2Processor(image_processor=image_processor, tokenizer=tokenizer)

    config = Owlv2Config(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": MAX_TEXT_LENGTH,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        projection_dim=32,
    )
    torch.manual_seed(seed)
    model = Owlv2ForObjectDetection(config).eval()
    if grid_boxes:
        with torch.no_grad():
            model.box_head.dense2.weight.zero_()
            model.box_head.dense2.bias.zero_()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path
