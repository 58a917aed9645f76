"""Detector backends: how each family of transformers zero-shot detectors is prompted and how
its outputs become raw boxes, before :func:`counterfactual.method.detect.postprocess`.

A backend is a function ``(model, processor, images, queries, call) -> list[Candidates]``:
``images`` are RGB ``uint8`` ``(H, W, 3)`` arrays, ``queries`` each image's classes (non-empty).
:data:`BACKENDS` maps a saved config's ``model_type`` to its backend.
"""

from __future__ import annotations

from counterfactual.method.detectors.base import Backend, Candidates, ModelCall

__all__ = ["MODEL_TYPES", "Backend", "Candidates", "ModelCall", "backend_for"]


def _backends() -> dict[str, Backend]:
    from counterfactual.method.detectors import grounding_dino, owlv2

    return {
        "owlv2": owlv2.detect,
        "grounding-dino": grounding_dino.detect,
        "mm-grounding-dino": grounding_dino.detect,
    }


MODEL_TYPES = ("owlv2", "grounding-dino", "mm-grounding-dino")
"""The ``model_type`` values (a saved ``config.json``'s) that :func:`backend_for` serves."""


def backend_for(model_type: str) -> Backend:
    """The backend for a ``model_type``; ``ValueError`` naming it when none serves it."""
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"a {model_type!r} model is not a supported detector (one of {', '.join(MODEL_TYPES)})"
        )
    return _backends()[model_type]


__all__ = ["MODEL_TYPES", "Backend", "Candidates", "ModelCall", "backend_for"]
