"""Pretrained image-text models for evaluation; torch, transformers and open_clip load lazily.

* :mod:`~counterfactual.models.embed`: :class:`Embedder` (images and texts -> unit float32
  rows) for Hugging Face CLIP, BLIP retrieval (ITC) and open_clip models, chosen by a
  :class:`ModelSpec` string such as ``hf-clip:openai/clip-vit-base-patch32``.
"""

from counterfactual.models.embed import (
    KINDS,
    BlipEmbedder,
    Embedder,
    HFClipEmbedder,
    ModelSpec,
    OpenClipEmbedder,
    load_embedder,
    parse_model_spec,
    resolve_device,
    resolve_dtype,
)

__all__ = [
    "KINDS",
    "BlipEmbedder",
    "Embedder",
    "HFClipEmbedder",
    "ModelSpec",
    "OpenClipEmbedder",
    "load_embedder",
    "parse_model_spec",
    "resolve_device",
    "resolve_dtype",
]
