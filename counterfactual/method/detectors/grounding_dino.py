"""Grounding DINO (``GroundingDinoForObjectDetection``, and MM-Grounding-DINO): all of an
image's classes in one text, boxes normalised to the image itself.

The text is the classes' phrases (``template.format(name)``, lower-cased), each ending with
``" ."``, e.g. ``"a photo of a dog . a photo of a cat ."``; the model scores every box against
every text token (at most ``config.max_text_len``, 256, with ``[CLS]`` and ``[SEP]``). A class's
score for a box is the best sigmoid over the tokens of its name (found by their character
offsets, so shared template words and the separators count for no class); a box keeps its best
class. Classes that do not fit in one text are asked in further texts for the same image.

The processor resizes keeping the aspect ratio and pads a batch at the bottom and right, with a
pixel mask; boxes are ``cxcywh`` normalised to the unpadded image, hence to the original one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from counterfactual.method.detectors.base import Candidates, ModelCall

_DELIMITERS = str.maketrans({".": " ", "?": " "})
"""Grounding DINO splits phrases at these tokens; inside a phrase they become spaces."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One text for the model: ``text`` the phrases, each ending with ``" ."``; ``spans[k]``:
    the ``(start, end)`` characters of class ``k``'s name in it."""

    text: str
    spans: tuple[tuple[int, int], ...]


def phrase(name: str, template: str) -> tuple[str, int, int]:
    """A class's phrase, lower-cased and without ``.``/``?`` (the phrase separators), with the
    ``(start, end)`` characters of ``name`` inside it."""
    before, _, after = template.partition("{}")
    before, name, after = (part.lower().translate(_DELIMITERS) for part in (before, name, after))
    return before + name + after, len(before), len(before) + len(name)


def prompt(classes: Sequence[str], template: str) -> Prompt:
    """The text asking for ``classes`` (in order) and where each class's name lies in it."""
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    position = 0
    for name in classes:
        text, start, end = phrase(name, template)
        parts.append(text)
        spans.append((position + start, position + end))
        position += len(text) + len(" . ")
    return Prompt(" . ".join(parts) + " .", tuple(spans))


def chunks(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive class indices grouped so that each group's token ``lengths`` sum to at most
    ``budget``; a class longer than the budget is a group of its own (its text is cut)."""
    groups: list[list[int]] = []
    used = budget + 1
    for index, length in enumerate(lengths):
        if used + length > budget:
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += length
    return groups


def box_pixels(boxes_cxcywh: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """Boxes ``(N, 4)`` ``cxcywh`` normalised to the image as ``(N, 4)`` float64 ``xyxy`` pixels
    of the ``(height, width)`` image (not clipped): ``x`` scales by the width, ``y`` by the
    height."""
    boxes = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    height, width = image_size
    cx, cy, w, h = boxes.T
    corners = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    return corners * np.asarray([width, height, width, height], dtype=np.float64)


def class_logits(
    logits: np.ndarray, offsets: np.ndarray, spans: Sequence[tuple[int, int]]
) -> np.ndarray:
    """``(queries, tokens)`` logits of one text -> ``(queries, classes)``: per class, the best
    logit over the tokens whose character ``offsets`` (``(tokens, 2)``) lie inside its span;
    ``-inf`` for a class none of whose tokens made it into the text."""
    count = min(logits.shape[1], len(offsets))
    start, end = offsets[:count, 0], offsets[:count, 1]
    out = np.full((logits.shape[0], len(spans)), -np.inf, dtype=np.float64)
    for k, (first, last) in enumerate(spans):
        tokens = np.flatnonzero((start >= first) & (end <= last) & (end > start))
        if tokens.size:
            out[:, k] = logits[:, tokens].max(axis=1)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


def detect(
    model: Any,
    processor: Any,
    images: Sequence[np.ndarray],
    queries: Sequence[tuple[str, ...]],
    call: ModelCall,
) -> list[Candidates]:
    """Per image, every object query's box with its best class."""
    import torch

    max_length = int(model.config.max_text_len)
    tokenizer = processor.tokenizer
    items: list[tuple[int, list[int]]] = []  # (image, the classes of one text)
    for i, classes in enumerate(queries):
        texts = [phrase(name, call.template)[0] for name in classes]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        lengths = [len(t) + 1 for t in ids]  # and the " ." after each phrase
        items += [(i, group) for group in chunks(lengths, max_length - 2)]  # [CLS], [SEP]

    found: list[list[Candidates]] = [[] for _ in images]
    for begin in range(0, len(items), call.batch_size):
        batch = items[begin : begin + call.batch_size]
        prompts = [prompt([queries[i][k] for k in group], call.template) for i, group in batch]
        inputs = processor(
            images=[images[i] for i, _ in batch],
            text=[p.text for p in prompts],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            return_offsets_mapping=True,
        )
        offsets = inputs.pop("offset_mapping").numpy()
        inputs = {k: v.to(call.device) for k, v in inputs.items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(call.dtype)
        with torch.inference_mode():
            outputs = model(**inputs)
        logits = outputs.logits.float().cpu().numpy()  # (batch, object queries, max_text_len)
        boxes = outputs.pred_boxes.float().cpu().numpy()
        for b, ((i, group), p) in enumerate(zip(batch, prompts, strict=True)):
            per_class = class_logits(logits[b], offsets[b], p.spans)
            best = per_class.max(axis=1)
            keep = np.isfinite(best)
            found[i].append(
                Candidates(
                    box_pixels(boxes[b][keep], images[i].shape[:2]),
                    _sigmoid(best[keep]),
                    np.asarray(group, dtype=np.int64)[per_class[keep].argmax(axis=1)],
                )
            )
    return [
        Candidates(
            np.concatenate([c.boxes_xyxy for c in parts]),
            np.concatenate([c.scores for c in parts]),
            np.concatenate([c.labels for c in parts]),
        )
        for parts in found
    ]
