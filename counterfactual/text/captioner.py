"""Caption the edited image with a pretrained image captioner (the paper's "captioner" text method).

Any Hugging Face image-only captioner loadable with ``AutoProcessor`` and
``AutoModelForImageTextToText`` works by hub id or local path: BLIP
(``Salesforce/blip-image-captioning-base``, the default), GIT, vision-encoder-decoder models.
Prompted chat VLMs are not supported: no text prompt is passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from PIL import Image

from counterfactual._lazy import require
from counterfactual.models.hf import Words, load_pretrained, load_tokenizer
from counterfactual.models.runtime import ModelRuntime
from counterfactual.text.base import RewriteRequest, RewriteResult, TextOptions

if TYPE_CHECKING:
    import torch

NO_IMAGE = "no-image"
"""Reason when a request carries no image."""
BAD_IMAGE = "bad-image"
"""Reason when the image is not an (H, W, 3) uint8 array with H, W >= 1."""
EMPTY_CAPTION = "empty-caption"
"""Reason when the model generated only special tokens or whitespace."""


class Captioner:
    """Writes a new caption for each edited image; the original caption is ignored.

    ``__init__`` loads the processor and model once (``config.model``, hub id or local path) onto
    ``device`` in ``dtype``; ``__call__`` captions a batch, ``batch_size`` images per model call,
    with greedy or beam search (never sampling), so the same image and model give the same
    caption.
    """

    def __init__(
        self,
        config: TextOptions,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 256,
    ) -> None:
        if config.method != "captioner":
            raise ValueError(f"Captioner needs method='captioner', got {config.method!r}")
        runtime = ModelRuntime.of(device, dtype, batch_size)
        if config.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {config.max_new_tokens}")
        if config.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {config.num_beams}")
        torch = require("torch", "models")
        self.config = config
        self._torch = torch
        self._device = runtime.torch_device()
        self._dtype: torch.dtype = runtime.torch_dtype(self._device)
        self.dtype = str(self._dtype).removeprefix("torch.")
        self.batch_size = runtime.batch_size
        what = "a hub id or local directory with an image-to-text model"
        words = Words(
            no_config=f"could not load image captioner {config.model!r} ({what})",
            no_model=f"could not load image captioner {config.model!r} ({what})",
        )
        model, processor = load_pretrained(
            config.model, "AutoModelForImageTextToText", words, dtype=self._dtype
        )
        # A processor without a tokenizer (image processor only) cannot decode: load one.
        if not hasattr(processor, "batch_decode"):
            self._decoder = load_tokenizer(
                config.model, f"no tokenizer found for captioner {config.model!r}"
            )
        else:
            self._decoder = processor
        self._processor = processor
        self._model = model.to(self._device).eval()

    def describe(self) -> dict[str, Any]:
        return {
            "method": "captioner",
            "model": self.config.model,
            "max_new_tokens": self.config.max_new_tokens,
            "num_beams": self.config.num_beams,
            "dtype": self.dtype,
        }

    def __call__(self, batch: Sequence[RewriteRequest]) -> list[RewriteResult]:
        """One result per request, in order.

        ``request.image`` is the edited image, (H, W, 3) uint8 RGB; any size (the processor
        resizes). No image gives ``reason="no-image"``, a malformed one ``"bad-image"``, a caption
        with no words ``"empty-caption"``.
        """
        results: list[RewriteResult | None] = [None] * len(batch)
        todo: list[tuple[int, Image.Image]] = []
        for i, request in enumerate(batch):
            image = request.image
            if image is None:
                results[i] = RewriteResult(text=None, reason=NO_IMAGE)
            elif not _is_rgb_uint8(image):
                results[i] = RewriteResult(text=None, reason=BAD_IMAGE)
            else:
                todo.append((i, Image.fromarray(np.ascontiguousarray(image))))
        size = self.batch_size
        for start in range(0, len(todo), size):
            chunk = todo[start : start + size]
            captions = self._caption([image for _, image in chunk])
            for (i, _), caption in zip(chunk, captions, strict=True):
                results[i] = (
                    RewriteResult(text=caption)
                    if caption
                    else RewriteResult(text=None, reason=EMPTY_CAPTION)
                )
        # Every slot is filled: skipped requests above, captioned ones in the loop.
        return cast(list[RewriteResult], results)

    def _caption(self, images: list[Image.Image]) -> list[str]:
        inputs = self._processor(images=images, return_tensors="pt")
        inputs = inputs.to(self._device, dtype=self._dtype)
        with self._torch.inference_mode():
            tokens = self._model.generate(
                **inputs,
                max_new_tokens=self.config.max_new_tokens,
                num_beams=self.config.num_beams,
                do_sample=False,
            )
        texts = self._decoder.batch_decode(tokens, skip_special_tokens=True)
        return [text.strip() for text in texts]


def _is_rgb_uint8(image: np.ndarray) -> bool:
    return (
        isinstance(image, np.ndarray)
        and image.dtype == np.uint8
        and image.ndim == 3
        and image.shape[2] == 3
        and image.shape[0] > 0
        and image.shape[1] > 0
    )
