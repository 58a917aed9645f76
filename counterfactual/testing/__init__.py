"""Tiny, seeded, randomly initialised models for offline tests and benchmarks.

The tests and ``benchmarks/bench.py`` both use these, so they live in the package and import
without ``sys.path`` edits. Importing this package is light: torch, transformers and diffusers
load inside the builders. One module per model (their sizes and constants differ), and one
for corpora:

* :mod:`~counterfactual.testing.diffusion`: :func:`build_tiny_inpaint_pipeline` (SD),
  :func:`build_tiny_sdxl_inpaint_pipeline` (SDXL: two text encoders, size conditioning) and the
  CLIP-style BPE tokenizer files the tiny CLIP-family models read
  (:func:`write_clip_tokenizer_files`).
* :mod:`~counterfactual.testing.owlv2`: :func:`build_tiny_owlv2` (OWLv2 detector + processor),
  :func:`write_owl_tokenizer_files`.
* :mod:`~counterfactual.testing.corpora`: small box-less corpora (WebDataset shards, Parquet
  and CSV tables, the demo's pictures as samples), imported from the module itself.
"""

from counterfactual.testing.diffusion import (
    BOS,
    EOS,
    build_tiny_inpaint_pipeline,
    build_tiny_sdxl_inpaint_pipeline,
    write_clip_tokenizer_files,
)
from counterfactual.testing.owlv2 import build_tiny_owlv2, write_owl_tokenizer_files

__all__ = [
    "BOS",
    "EOS",
    "build_tiny_inpaint_pipeline",
    "build_tiny_owlv2",
    "build_tiny_sdxl_inpaint_pipeline",
    "write_clip_tokenizer_files",
    "write_owl_tokenizer_files",
]
