"""Pretrained image-text models for evaluation; torch, transformers and open_clip load lazily.

* :mod:`~counterfactual.models.embed`: :class:`Embedder` (images and texts -> unit float32
  rows) for Hugging Face CLIP, BLIP retrieval (ITC) and open_clip models, chosen by a
  :class:`ModelSpec` string such as ``hf-clip:openai/clip-vit-base-patch32``.
* :mod:`~counterfactual.models.runtime`: :class:`ModelRuntime` (device, dtype, batch size,
  checked once for every backend), :data:`DTYPES`.
* :mod:`~counterfactual.models.hf`: :func:`~counterfactual.models.hf.load_pretrained`, the one
  Hugging Face load-and-check of a model and its processor.
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
)
from counterfactual.models.runtime import (
    DTYPES,
    ModelRuntime,
    check_batch_size,
    check_dtype,
    resolve_device,
    resolve_dtype,
)

__all__ = [
    "DTYPES",
    "KINDS",
    "BlipEmbedder",
    "Embedder",
    "HFClipEmbedder",
    "ModelRuntime",
    "ModelSpec",
    "OpenClipEmbedder",
    "check_batch_size",
    "check_dtype",
    "load_embedder",
    "parse_model_spec",
    "resolve_device",
    "resolve_dtype",
]
