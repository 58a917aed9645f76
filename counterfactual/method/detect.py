"""Open-vocabulary detection: boxes for corpora without them (CC3M, LAION), so that the alpha
rules can run on their images.

A transformers zero-shot detector (a hub id or a ``save_pretrained`` folder: OWLv2, Grounding
DINO or MM-Grounding-DINO, told apart by the saved config's ``model_type``) is asked, per image,
for the vocabulary classes its caption mentions (``queries="caption"``), for the whole
vocabulary when the caption mentions any class (``"caption+vocabulary"``), or for the whole
vocabulary always (``"vocabulary"``); each class becomes the text ``template.format(name)``.
How each family is prompted and how its boxes map to pixels is in
:mod:`counterfactual.method.detectors`.

Boxes: a backend gives ``xyxy`` pixels of the original image; :func:`postprocess` thresholds,
clips, drops empty boxes, runs per-class NMS and keeps the best ``max_detections``; a
:class:`Detection` is ``xywh`` pixels, as :class:`~counterfactual.records.ObjectAnnotation`
stores boxes.

torch and transformers are imported when a :class:`Detector` is built, never at import time.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from counterfactual._lazy import require
from counterfactual.method.detectors import MODEL_TYPES, ModelCall, backend_for
from counterfactual.method.detectors.owlv2 import to_pixels
from counterfactual.options import declare
from counterfactual.records import ObjectAnnotation
from counterfactual.vocab import ClassVocabulary

__all__ = [
    "MODEL_TYPES",
    "QUERY_MODES",
    "DetectConfig",
    "Detection",
    "Detector",
    "nms",
    "postprocess",
    "query_classes",
    "to_objects",
    "to_pixels",
]

QUERY_MODES = ("caption", "caption+vocabulary", "vocabulary")
"""Which classes an image is asked for; see :func:`query_classes`."""


@dataclass(frozen=True, slots=True)
class DetectConfig:
    """Options of the detector stage.

    ``score_threshold``: keep boxes whose sigmoid score is at least this, in ``[0, 1]``.
    ``nms_iou``: within one class, a box whose IoU with a better box is above this is dropped
    (``1.0`` keeps everything). ``max_detections``: most boxes kept per image, best first.
    Where and in what sizes the model runs is :class:`Detector`'s (in a synthesis run:
    :class:`~counterfactual.synth.plan.Runtime`).
    """

    model: str = declare(
        "google/owlv2-base-patch16-ensemble",
        help="OWLv2 or Grounding DINO hub id or folder (default: %(default)s)",
        flags=("--detector-model",),
    )
    score_threshold: float = declare(
        0.2,
        help="keep a detected box whose score (sigmoid of its class logit) is at least this, "
        "in [0, 1] (default: %(default)s)",
        kind="unit_interval",
        flags=("--detect-threshold",),
    )
    nms_iou: float = declare(
        0.5,
        help="per class, drop a box whose IoU with a better-scored box is above this, in [0, 1]; "
        "1 keeps all (default: %(default)s)",
        kind="unit_interval",
        flags=("--detect-nms-iou",),
    )
    queries: str = declare(
        "caption",
        help="classes asked for: those the caption mentions, the whole vocabulary when it "
        "mentions any (finds the unmentioned objects the alpha rules must keep), or always "
        "all (default: %(default)s)",
        choices=QUERY_MODES,
        flags=("--detect-queries",),
    )
    template: str = declare(
        "a photo of a {}",
        help="a class's query text, with exactly one {} for its name (default: '%(default)s')",
        flags=("--detect-template",),
    )
    max_detections: int = declare(
        100,
        help="most boxes kept per image, best first (default: %(default)s)",
        kind="positive_int",
        flags=("--detect-max",),
    )

    def __post_init__(self) -> None:
        if not self.model or self.model != self.model.strip():
            raise ValueError(f"model {self.model!r} is empty or has surrounding spaces")
        if not 0.0 <= self.score_threshold <= 1.0:
            raise ValueError(f"score_threshold must be in [0, 1], got {self.score_threshold}")
        if not 0.0 <= self.nms_iou <= 1.0:
            raise ValueError(f"nms_iou must be in [0, 1], got {self.nms_iou}")
        if self.queries not in QUERY_MODES:
            raise ValueError(f"queries {self.queries!r} is not one of {', '.join(QUERY_MODES)}")
        if self.template.count("{}") != 1 or not self.template.replace("{}", "").strip():
            raise ValueError(
                f"template {self.template!r} needs exactly one '{{}}' and some other text, "
                "e.g. 'a photo of a {}'"
            )
        if self.max_detections < 1:
            raise ValueError(f"max_detections must be >= 1, got {self.max_detections}")


@dataclass(frozen=True, slots=True)
class Detection:
    """One detected object: ``bbox`` is ``(x, y, w, h)`` pixels of the original image, inside
    it and with ``w, h > 0``; ``score`` is the sigmoid of the class logit, in ``[0, 1]``."""

    category: str
    bbox: tuple[float, float, float, float]
    score: float


def query_classes(caption: str, vocabulary: ClassVocabulary, mode: str) -> tuple[str, ...]:
    """The classes to ask the detector for, in vocabulary order.

    ``caption``: the classes the caption mentions, matched on its lower-cased words as
    ``np-removal`` matches them (inflections, longest entry first: "hot dogs" is a hot dog).
    ``caption+vocabulary``: the whole vocabulary when the caption mentions any class, else none.
    ``vocabulary``: the whole vocabulary, whatever the caption says.
    """
    if mode not in QUERY_MODES:
        raise ValueError(f"queries {mode!r} is not one of {', '.join(QUERY_MODES)}")
    if mode == "vocabulary":
        return vocabulary.classes
    mentioned = vocabulary.mentioned(caption)
    if mode == "caption+vocabulary":
        return vocabulary.classes if mentioned else ()
    return tuple(c for c in vocabulary.classes if c in mentioned)


def _iou_one(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one ``xyxy`` box with each row of ``others`` (continuous areas)."""
    iw = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    ih = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = iw * ih
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    return inter / (area + areas - inter)


def _best_first(scores: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``index`` reordered by score, highest first, ties to the lower index."""
    return index[np.lexsort((index, -scores[index]))]


def nms(boxes_xyxy: np.ndarray, scores: np.ndarray, iou: float) -> np.ndarray:
    """Greedy non-maximum suppression: indices kept, best first (ties to the lower index).

    A box is dropped when its IoU with an already kept box is above ``iou``.
    """
    boxes = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float64)
    order = _best_first(scores, np.arange(len(scores)))
    kept: list[int] = []
    while order.size:
        best = int(order[0])
        kept.append(best)
        rest = order[1:]
        order = rest[_iou_one(boxes[best], boxes[rest]) <= iou]
    return np.asarray(kept, dtype=np.int64)


def postprocess(
    boxes_xyxy: np.ndarray,
    scores: np.ndarray,
    labels: np.ndarray,
    classes: Sequence[str],
    image_size: tuple[int, int],
    config: DetectConfig,
) -> list[Detection]:
    """Raw detections of one image -> the kept ones, best first (ties to the lower index).

    ``boxes_xyxy``: ``(N, 4)`` pixels of the original image; ``scores``: ``(N,)`` in ``[0, 1]``;
    ``labels``: ``(N,)`` indices into ``classes`` (the queried classes); ``image_size``:
    ``(height, width)``. Steps: keep scores ``>= config.score_threshold``, drop non-finite
    boxes, clip to the image, drop boxes with no width or height, per-class NMS at
    ``config.nms_iou``, keep the best ``config.max_detections``.
    """
    boxes = np.asarray(boxes_xyxy, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    labels = np.asarray(labels).reshape(-1)
    if not len(boxes) == len(scores) == len(labels):
        raise ValueError(
            f"boxes, scores and labels differ in length: {len(boxes)}, {len(scores)}, {len(labels)}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= len(classes)):
        raise ValueError(f"labels must index the {len(classes)} queried classes")
    height, width = image_size
    clipped = np.clip(boxes, 0.0, [width, height, width, height])
    keep = (
        (scores >= config.score_threshold)
        & np.isfinite(boxes).all(axis=1)
        & (clipped[:, 2] > clipped[:, 0])
        & (clipped[:, 3] > clipped[:, 1])
    )
    kept: list[np.ndarray] = []
    for label in np.unique(labels[keep]):
        index = np.flatnonzero(keep & (labels == label))
        kept.append(index[nms(clipped[index], scores[index], config.nms_iou)])
    if not kept:
        return []
    final = _best_first(scores, np.concatenate(kept))[: config.max_detections]
    return [
        Detection(
            category=classes[int(labels[i])],
            bbox=(
                float(clipped[i, 0]),
                float(clipped[i, 1]),
                float(clipped[i, 2] - clipped[i, 0]),
                float(clipped[i, 3] - clipped[i, 1]),
            ),
            score=float(scores[i]),
        )
        for i in final
    ]


def to_objects(detections: Sequence[Detection]) -> tuple[ObjectAnnotation, ...]:
    """Detections as the object annotations the alpha rules read (score kept in ``score``).

    Boxes are rounded to 1/100 px and scores to 4 decimals: finer digits are float noise that
    differs between thread counts (a Ray actor and this process), and would change the json.
    (Both runners also give a model the same batches: :func:`counterfactual.synth.staging.in_chunks`.)
    """
    return tuple(
        ObjectAnnotation(
            bbox=(
                round(d.bbox[0], 2),
                round(d.bbox[1], 2),
                round(d.bbox[2], 2),
                round(d.bbox[3], 2),
            ),
            category=d.category,
            score=round(d.score, 4),
        )
        for d in detections
    )


_WHAT = "a hub id or local folder with an OWLv2 or Grounding DINO model and processor; offline?"


class Detector:
    """Open-vocabulary detection (OWLv2 or Grounding DINO), one query set per image.

    ``__call__(images, captions)``: RGB ``uint8`` ``(H, W, 3)`` arrays and their captions ->
    per image, its :class:`Detection` list (best first). An image whose caption yields no query
    class (see :func:`query_classes`) gets ``[]`` without running the model.

    ``device``/``dtype``: ``None`` is CUDA when available (float16 there), else CPU float32.
    ``batch_size``: images per model call.
    """

    def __init__(
        self,
        config: DetectConfig,
        vocabulary: ClassVocabulary,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
    ) -> None:
        from counterfactual.models.hf import Words, load_pretrained, looks_local, model_type
        from counterfactual.models.runtime import ModelRuntime

        runtime = ModelRuntime.of(device, dtype, batch_size)
        torch = require("torch", "models")
        self.config = config
        self.vocabulary = vocabulary
        self.batch_size = runtime.batch_size
        self.device = runtime.torch_device()
        self.dtype = runtime.torch_dtype(self.device)
        self._torch = torch
        name = os.path.expanduser(config.model)
        if not os.path.isdir(name) and (looks_local(config.model) or os.path.exists(name)):
            raise FileNotFoundError(f"detector model folder {config.model!r} does not exist")
        words = Words(
            no_config=f"could not load detector {config.model!r} ({_WHAT})",
            no_model=f"could not load detector {config.model!r} ({_WHAT})",
        )
        kind = model_type(name, words)
        if kind not in MODEL_TYPES:
            raise ValueError(
                f"detector {config.model!r} is a {kind!r} model, not one of "
                f"{', '.join(MODEL_TYPES)}"
            )
        self.model_type: str = kind
        self._backend = backend_for(kind)
        model, processor = load_pretrained(
            name, "AutoModelForZeroShotObjectDetection", words, dtype=self.dtype
        )
        self._model = model.to(self.device).eval()
        self._processor = processor

    def describe(self) -> dict[str, object]:
        """What a sample's json records about how its boxes were found."""
        c = self.config
        return {
            "model": c.model,
            "model_type": self.model_type,
            "queries": c.queries,
            "template": c.template,
            "score_threshold": c.score_threshold,
            "nms_iou": c.nms_iou,
            "max_detections": c.max_detections,
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def __call__(
        self, images: Sequence[np.ndarray], captions: Sequence[str]
    ) -> list[list[Detection]]:
        if len(images) != len(captions):
            raise ValueError(f"{len(images)} images but {len(captions)} captions")
        for i, image in enumerate(images):
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ValueError(
                    f"image {i} must be an RGB uint8 (H, W, 3) array, got {image.dtype} "
                    f"{image.shape}"
                )
            if image.shape[0] == 0 or image.shape[1] == 0:
                raise ValueError(f"image {i} is empty: {image.shape}")
        queries = [query_classes(c, self.vocabulary, self.config.queries) for c in captions]
        results: list[list[Detection]] = [[] for _ in images]
        todo = [i for i, q in enumerate(queries) if q]
        size = self.batch_size
        call = ModelCall(self.config.template, self.device, self.dtype, size)
        for start in range(0, len(todo), size):
            batch = todo[start : start + size]
            found = self._backend(
                self._model,
                self._processor,
                [images[i] for i in batch],
                [queries[i] for i in batch],
                call,
            )
            for i, candidates in zip(batch, found, strict=True):
                size_hw = images[i].shape[:2]
                results[i] = postprocess(
                    candidates.boxes_xyxy,
                    candidates.scores,
                    candidates.labels,
                    queries[i],
                    (int(size_hw[0]), int(size_hw[1])),
                    self.config,
                )
        return results
