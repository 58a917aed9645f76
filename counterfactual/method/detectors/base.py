"""What every detector backend shares: the raw detections it returns (:class:`Candidates`), how
it calls its model (:class:`ModelCall`) and its signature (:data:`Backend`). A leaf, so that the
backends and the package's ``__init__`` (which finds them) import it without a circle."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Candidates:
    """One image's raw detections: ``boxes_xyxy`` ``(N, 4)`` float64 pixels of the original
    image (not clipped), ``scores`` ``(N,)`` in ``[0, 1]``, ``labels`` ``(N,)`` int64 indices
    into the image's queried classes."""

    boxes_xyxy: np.ndarray
    scores: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True, slots=True)
class ModelCall:
    """How to call the model: ``template`` turns a class into its query text; ``device`` and
    ``dtype`` are torch's; ``batch_size``: most (image, prompt) pairs per forward pass."""

    template: str
    device: Any
    dtype: Any
    batch_size: int


Backend = Callable[
    [Any, Any, Sequence[np.ndarray], Sequence[tuple[str, ...]], ModelCall], list[Candidates]
]
