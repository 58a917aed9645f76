"""A tiny, seeded, randomly initialised sentence-transformers model (BERT + mean pooling) for
offline tests: saved with ``SentenceTransformer.save`` and loaded back by folder, as a user's
hub id or local model would be. The embeddings mean nothing."""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "what why how where who which will is are was does did do can the a an of to and in on "
    "with his her their he she they it casey riley man woman people next so here happy sad "
    "doing acting going feel look because raining umbrella dry bus cake table nn nnp vbz vbg "
    "jj rb vb propn noun verb adj ? . , '"
).split()


def build_tiny_sentence_model(path: Path, seed: int = 0, dim: int = 32) -> Path:
    """Build a ``dim``-wide two-layer BERT with mean pooling and save it to ``path``."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path = Path(path)
    source = path.parent / f"{path.name}-hf"
    source.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (source / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(str(source / "vocab.txt"), do_lower_case=True)
    tokenizer.save_pretrained(str(source))
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=dim,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    BertModel(config).eval().save_pretrained(str(source))
    # a plain transformers folder gets mean pooling; saving writes the sentence-transformers
    # layout (modules.json, pooling config) that a hub sentence model has
    SentenceTransformer(str(source), device="cpu").save(str(path))
    return path
