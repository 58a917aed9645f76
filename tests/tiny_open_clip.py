"""A tiny open_clip architecture for offline tests of open_clip's own code paths.

The smallest config in open_clip's wheel (``ViT-S-32-alt``, 42M parameters; ``RN50``, 102M)
makes every training checkpoint 0.4-0.5 GB and every forward pass slow on CPU, while the tests
only need open_clip to build, train, save and load *a* model. This one has 3.4M parameters (3.2M
of them the 49,408-token embedding its default tokenizer needs), a 64x64 image and 16 tokens.
open_clip reads it the two ways a user hands it a model of their own: a ``local-dir:`` folder
(its trainer's ``--model``) or a config registered with ``open_clip.add_model_config``.
"""

from __future__ import annotations

import json
from pathlib import Path

IMAGE_SIZE, CONTEXT_LENGTH, EMBED_DIM = 64, 16, 32

MODEL_CFG = {
    "embed_dim": EMBED_DIM,
    "vision_cfg": {
        "image_size": IMAGE_SIZE, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16,
    },
    "text_cfg": {
        "context_length": CONTEXT_LENGTH, "vocab_size": 49408, "width": 64, "heads": 2,
        "layers": 2,
    },
}  # fmt: skip


def tiny_open_clip_dir(folder: Path) -> str:
    """Write ``open_clip_config.json`` (no weights: open_clip initialises them at random) to
    ``folder``; return the ``local-dir:FOLDER`` model name open_clip's ``create_model``,
    ``get_tokenizer`` and ``open_clip_train.main --model`` read."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": MODEL_CFG}))
    return f"local-dir:{folder}"


def register_tiny_open_clip(folder: Path, name: str = "cf-tiny-test") -> str:
    """Register the config under ``name`` as a built-in architecture of this process (what
    ``open_clip:ARCH:CHECKPOINT`` specs name); return ``name``."""
    import open_clip

    path = Path(folder) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(MODEL_CFG))
    open_clip.add_model_config(path)
    assert name in open_clip.list_models(), name
    return name
