"""OWLv2 (``Owlv2ForObjectDetection``): one text query per class, boxes on a padded square.

The processor pads an image with zeros at the bottom and right to a square of side
``max(height, width)`` and resizes that square; the model predicts ``cxcywh`` boxes normalised
to the padded square and, per box, a logit for each query.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from counterfactual.method.detectors.base import Candidates, ModelCall


def to_pixels(boxes_cxcywh: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """OWLv2 boxes (``(N, 4)`` ``cxcywh`` normalised to the padded square) as ``(N, 4)`` float64
    ``xyxy`` pixels of the original ``(height, width)`` image (not clipped).

    The processor pads at the bottom and right to a square of side ``max(height, width)``, so
    one scale, that side, serves both axes.
    """
    boxes = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    side = float(max(image_size))
    cx, cy, w, h = boxes.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1) * side


def detect(
    model: Any,
    processor: Any,
    images: Sequence[np.ndarray],
    queries: Sequence[tuple[str, ...]],
    call: ModelCall,
) -> list[Candidates]:
    """Per image, every patch's box with its best query: score the sigmoid of that logit."""
    import torch

    texts = [[call.template.format(c) for c in q] for q in queries]
    # OWLv2 reads at most 16 tokens per query; longer ones are cut rather than refused
    inputs = processor(images=list(images), text=texts, return_tensors="pt", truncation=True)
    inputs = {k: v.to(call.device) for k, v in inputs.items()}
    inputs["pixel_values"] = inputs["pixel_values"].to(call.dtype)
    with torch.inference_mode():
        outputs = model(**inputs)
    logits = outputs.logits.float()  # (batch, patches, max queries)
    # The processor pads short query lists with " ", which the model does not mask.
    counts = torch.tensor([len(q) for q in queries], device=logits.device)
    padding = torch.arange(logits.shape[-1], device=logits.device)[None, :] >= counts[:, None]
    logits = logits.masked_fill(padding[:, None, :], float("-inf"))
    best = logits.max(dim=-1)
    scores = torch.sigmoid(best.values).cpu().numpy()
    labels = best.indices.cpu().numpy()
    boxes = outputs.pred_boxes.float().cpu().numpy()
    return [
        Candidates(to_pixels(boxes[b], image.shape[:2]), scores[b], labels[b].astype(np.int64))
        for b, image in enumerate(images)
    ]
