"""Image and text embedders for retrieval evaluation (ODmAP@k, R@K): one small protocol, three
backends, all loaded by a spec string.

* ``hf-clip:NAME``: a Hugging Face ``CLIPModel`` (hub id or local folder);
  ``get_image_features`` / ``get_text_features``, the embeddings CLIP's own logits compare.
* ``blip:NAME``: a ``BlipForImageTextRetrieval`` checkpoint (``Salesforce/blip-itm-base-coco``);
  the ITC embeddings BLIP ranks with (``use_itm_head=False``): the projected, normalised [CLS]
  token of the vision model and of the text encoder run without the image.
* ``open_clip:ARCH:PRETRAINED``: an open_clip architecture with a pretrained tag or a checkpoint
  path (``open_clip:ViT-B-32:laion2b_s34b_b79k``, ``open_clip:ViT-B-32:/ckpt/epoch_10.pt``), or
  ``open_clip:hf-hub:ORG/NAME``. Needs ``pip install open_clip_torch``.
* a bare local folder written by ``save_pretrained``: its ``config.json`` ``model_type``
  (``clip`` or ``blip``) picks the backend.

Every embedder returns float32 ``(N, D)`` arrays with unit rows, so a dot product is a cosine
similarity and :mod:`counterfactual.eval.metrics.retrieval` takes them as they are. torch,
transformers and open_clip are imported when an embedder is built, never at import time.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
from PIL import Image

from counterfactual._lazy import check_torchvision, require
from counterfactual.models.hf import Words, load_config, load_pretrained, looks_local, model_type
from counterfactual.models.runtime import (  # noqa: F401  (check_cuda, resolve_*: named here too)
    ModelRuntime,
    check_cuda,
    resolve_device,
    resolve_dtype,
)
from counterfactual.models.trust import weight_errors, weights_failure

if TYPE_CHECKING:
    import torch

KINDS = ("hf-clip", "blip", "open_clip", "scratch")
"""The backends a :class:`ModelSpec` may name."""

_FOLDER_KINDS = {"clip": "hf-clip", "blip": "blip", "scratch-dual": "scratch"}
"""``config.json`` ``model_type`` -> backend, for bare local folders."""
_HF_HUB = "hf-hub:"
_OPEN_CLIP_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
_OPEN_CLIP_HINT = (
    "open_clip is needed for open_clip: specs but not installed: pip install open_clip_torch"
)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Which model to embed with; ``str(spec)`` is the text :func:`parse_model_spec` reads back.

    ``name`` is a hub id or local folder (``hf-clip``, ``blip``) or an open_clip architecture
    (``ViT-B-32``, ``hf-hub:ORG/NAME``). ``pretrained`` is the open_clip pretrained tag or
    checkpoint path, required for an open_clip architecture and ``None`` for the other kinds.
    """

    kind: str
    name: str
    pretrained: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"model kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not self.name or self.name != self.name.strip():
            raise ValueError(f"model name {self.name!r} is empty or has surrounding spaces")
        if self.kind != "open_clip":
            if self.pretrained is not None:
                raise ValueError(
                    f"pretrained={self.pretrained!r} is for open_clip specs only, not {self.kind!r}"
                )
        elif self.name.startswith(_HF_HUB):
            if self.pretrained is not None:
                raise ValueError(
                    f"open_clip {self.name!r} loads its own weights; drop pretrained="
                    f"{self.pretrained!r}"
                )
        elif not self.pretrained:
            raise ValueError(
                f"open_clip {self.name!r} needs a pretrained tag or checkpoint path, e.g. "
                f"'open_clip:{self.name}:laion2b_s34b_b79k' (random weights are no use here)"
            )

    def __str__(self) -> str:
        text = f"{self.kind}:{self.name}"
        return text if self.pretrained is None else f"{text}:{self.pretrained}"


def parse_model_spec(text: str) -> ModelSpec:
    """Read ``KIND:NAME`` (``KIND`` in :data:`KINDS`), ``open_clip:ARCH:PRETRAINED``,
    ``open_clip:hf-hub:ORG/NAME``, or a bare local model folder (kind from ``config.json``).

    Raises ``ValueError`` for an unknown kind, a missing name, a bare name that is not a local
    folder (a hub id needs its prefix: the same id could be loaded by more than one backend),
    or a folder whose ``model_type`` is neither ``clip`` nor ``blip``.
    """
    text = text.strip()
    kind, sep, rest = text.partition(":")
    if sep and kind in KINDS:
        if kind != "open_clip" or rest.startswith(_HF_HUB):
            return ModelSpec(kind, rest)
        arch, _, pretrained = rest.partition(":")
        return ModelSpec(kind, arch, pretrained or None)
    if os.path.isdir(text):
        return ModelSpec(_folder_kind(text), text)
    raise ValueError(
        f"model spec {text!r} is not a local model folder and has no kind prefix; write "
        f"'hf-clip:{text}', 'blip:{text}' or 'open_clip:ARCH:PRETRAINED'"
    )


def _folder_kind(folder: str) -> str:
    config = Path(folder) / "config.json"
    try:
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except FileNotFoundError as err:
        raise ValueError(
            f"model folder {folder!r} has no config.json; is it a save_pretrained folder?"
        ) from err
    except (OSError, ValueError, AttributeError) as err:
        raise ValueError(f"cannot read model_type from {str(config)!r}: {err}") from err
    if model_type not in _FOLDER_KINDS:
        raise ValueError(
            f"model folder {folder!r} has model_type {model_type!r}; only clip and blip "
            "folders are detected (use an explicit prefix, e.g. 'open_clip:ARCH:PATH')"
        )
    return _FOLDER_KINDS[model_type]


@runtime_checkable
class Embedder(Protocol):
    """Images and texts -> float32 ``(N, dim)`` arrays with unit L2 rows, in input order.

    Inputs are processed in batches of the embedder's ``batch_size`` under
    ``torch.inference_mode()``; empty input gives ``(0, dim)``. Images of any mode and size are
    converted to RGB and preprocessed as the model expects; texts longer than the model's
    context (77 tokens for CLIP) are truncated.
    """

    spec: ModelSpec
    dim: int

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray: ...

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray: ...


class _TorchEmbedder:
    """Batching, input checks and normalisation shared by the backends.

    Subclasses set ``spec``, ``dim`` and ``_model`` and implement ``_image_features`` (a list of
    RGB images -> ``(n, dim)`` tensor) and ``_text_features`` (a list of strings -> ``(n, dim)``).
    """

    spec: ModelSpec
    dim: int

    def __init__(
        self,
        device: str | torch.device | None,
        dtype: str | torch.dtype | None,
        batch_size: int,
    ) -> None:
        self.runtime = ModelRuntime.of(device, dtype, batch_size)
        self._torch = require("torch", "models")
        self.device = self.runtime.torch_device()
        self.dtype = self.runtime.torch_dtype(self.device)
        self.batch_size = self.runtime.batch_size

    def describe(self) -> dict[str, Any]:
        return {
            "model": str(self.spec),
            "dim": self.dim,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def embed_images(self, images: Sequence[Image.Image]) -> np.ndarray:
        """``(len(images), dim)`` float32, unit rows; any PIL mode (converted to RGB)."""
        rgb = []
        for index, image in enumerate(images):
            if not isinstance(image, Image.Image):
                raise TypeError(f"image {index} is a {type(image).__name__}, not a PIL image")
            rgb.append(image if image.mode == "RGB" else image.convert("RGB"))
        return self._embed(rgb, self._image_features)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, unit rows; texts past the model's context are cut."""
        if isinstance(texts, str):
            raise TypeError("embed_texts takes a sequence of strings, not one string")
        items = list(texts)
        for index, text in enumerate(items):
            if not isinstance(text, str):
                raise TypeError(f"text {index} is a {type(text).__name__}, not a str")
        return self._embed(items, self._text_features)

    def _embed(self, items: list[Any], features: Any) -> np.ndarray:
        torch = self._torch
        out = np.empty((len(items), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(items), self.batch_size):
                chunk = features(items[start : start + self.batch_size])
                chunk = torch.nn.functional.normalize(chunk.float(), dim=-1)
                out[start : start + len(chunk)] = chunk.cpu().numpy()
        return out

    def _image_features(self, images: list[Image.Image]) -> torch.Tensor:
        raise NotImplementedError

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        raise NotImplementedError


def _pooled(output: Any) -> torch.Tensor:
    """A features tensor from ``get_*_features``: transformers < 5 returns the tensor, 5 returns
    a ``BaseModelOutputWithPooling`` whose ``pooler_output`` holds the projected features."""
    pooled = getattr(output, "pooler_output", None)
    return output if pooled is None else pooled


@dataclass(frozen=True)
class PixelPrep:
    """The CPU half of a Hugging Face model's image preprocessing (convert to RGB, resize,
    centre-crop), picklable so a shard worker can run it and send only the result: ``uint8``
    ``(N, 3, H, W)`` arrays at the model's input size (224 px for CLIP ViT-L/14: 150 KB a crop).
    The GPU half (rescale, normalise) is :meth:`HFClipEmbedder.embed_pixels`. ``processor`` is
    the model's own image processor, run with rescaling and normalising off, so the resize is
    the one the model was loaded with."""

    processor: Any

    def __call__(self, images: Sequence[Image.Image]) -> np.ndarray:
        if not images:
            size = getattr(self.processor, "crop_size", None) or {"height": 0, "width": 0}
            return np.zeros((0, 3, size["height"], size["width"]), np.uint8)
        rgb = [image if image.mode == "RGB" else image.convert("RGB") for image in images]
        out = self.processor(images=rgb, do_rescale=False, do_normalize=False, return_tensors="np")[
            "pixel_values"
        ]
        return np.asarray(out).round().clip(0, 255).astype(np.uint8)


class _HFEmbedder(_TorchEmbedder):
    """A transformers model + processor, checked to be ``model_type`` and fully loaded."""

    _kind = ""
    _model_type = ""
    _model_class = ""

    def __init__(
        self,
        name: str,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        batch_size: int = 64,
    ) -> None:
        super().__init__(device, dtype, batch_size)
        spec = self.spec = ModelSpec(self._kind, name)
        name = spec.name
        if not os.path.isdir(name) and looks_local(name):
            raise FileNotFoundError(f"model folder {name!r} (spec {str(spec)!r}) does not exist")
        words = Words(
            no_config=f"cannot load {str(spec)!r}: no config found locally or in the Hugging "
            "Face cache (offline?)",
            no_model=f"cannot load {str(spec)!r}",
            not_checkpoint=f"{str(spec)!r} is not a {self._model_class} checkpoint",
        )
        kind = model_type(name, words)
        if kind != self._model_type:
            raise ValueError(f"{str(spec)!r} is a {kind!r} model, not {self._model_type!r}")
        config = load_config(name, words)
        model, processor = load_pretrained(
            name, self._model_class, words, dtype=self.dtype, needed=self._needed
        )
        for part in ("tokenizer", "image_processor"):
            if getattr(processor, part, None) is None:
                raise ValueError(f"the processor of {str(spec)!r} has no {part}")
        self._model = model.to(self.device).eval()
        self._tokenizer = processor.tokenizer
        self._image_processor = processor.image_processor
        positions = config.text_config.max_position_embeddings
        tokenizer_max = self._tokenizer.model_max_length
        # Tokenizers saved without a max length report a huge sentinel (int(1e30)).
        self.max_text_length = min(positions, tokenizer_max) if tokenizer_max else positions

    def _needed(self, key: str) -> bool:
        return True

    def _pixels(self, images: list[Image.Image]) -> torch.Tensor:
        pixels = self._image_processor(images=images, return_tensors="pt")["pixel_values"]
        return pixels.to(self.device, dtype=self.dtype)

    def pixel_prep(self) -> PixelPrep:
        """The CPU half of this model's image preprocessing, to run where the pictures are (a
        shard worker); :meth:`embed_pixels` does the rest where the model is."""
        return PixelPrep(self._image_processor)

    def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """``(N, dim)`` float32 unit rows from :class:`PixelPrep`'s ``uint8`` ``(N, 3, H, W)``
        arrays: rescaled and normalised with torch on the model's device, then embedded as
        :meth:`embed_images` embeds (equal to it within float tolerance)."""
        pixels = np.asarray(pixels)
        if pixels.dtype != np.uint8 or pixels.ndim != 4 or pixels.shape[1] != 3:
            raise ValueError(
                f"expected uint8 (N, 3, H, W) pixels, got {pixels.dtype} {pixels.shape}"
            )
        return self._embed(list(pixels), self._prepared_features)

    def _prepared_features(self, pixels: list[np.ndarray]) -> torch.Tensor:
        torch = self._torch
        scale, shift = self._affine()
        x = torch.from_numpy(np.stack(pixels)).to(self.device, non_blocking=True).float()
        return self._features_of(torch.addcmul(shift, x, scale).to(self.dtype))

    def _affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The processor's rescale and normalisation as one ``x * scale + shift`` per channel
        (``scale = rescale_factor / std``, ``shift = -mean / std``), on the model's device."""
        if getattr(self, "_scale_shift", None) is None:
            p, torch = self._image_processor, self._torch
            rescale = float(p.rescale_factor) if getattr(p, "do_rescale", True) else 1.0
            mean, std = np.zeros(3), np.ones(3)
            if getattr(p, "do_normalize", True):
                mean, std = np.asarray(p.image_mean, float), np.asarray(p.image_std, float)
            scale = torch.tensor(rescale / std, dtype=torch.float32, device=self.device)
            shift = torch.tensor(-mean / std, dtype=torch.float32, device=self.device)
            self._scale_shift = (scale.view(1, 3, 1, 1), shift.view(1, 3, 1, 1))
        return self._scale_shift

    def _features_of(self, pixels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _tokens(self, texts: list[str]) -> dict[str, torch.Tensor]:
        tokens = self._tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_text_length,
            return_tensors="pt",
        )
        return {
            "input_ids": tokens["input_ids"].to(self.device),
            "attention_mask": tokens["attention_mask"].to(self.device),
        }


class HFClipEmbedder(_HFEmbedder):
    """A Hugging Face ``CLIPModel`` (hub id or ``save_pretrained`` folder) with its processor.

    Embeddings are ``get_image_features`` / ``get_text_features`` (the projected pooled
    outputs), normalised: the ``image_embeds`` / ``text_embeds`` of ``CLIPModel.forward``.
    ``device=None`` is CUDA when available, else CPU; ``dtype=None`` float16 on CUDA, else
    float32. Texts are cut at the model's 77 tokens (end token kept).
    """

    _kind = "hf-clip"
    _model_type = "clip"
    _model_class = "CLIPModel"

    @property
    def dim(self) -> int:  # type: ignore[override]
        return int(self._model.config.projection_dim)

    def _needed(self, key: str) -> bool:
        return key != "logit_scale"

    def _image_features(self, images: list[Image.Image]) -> torch.Tensor:
        return self._features_of(self._pixels(images))

    def _features_of(self, pixels: torch.Tensor) -> torch.Tensor:
        return _pooled(self._model.get_image_features(pixel_values=pixels))

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        return _pooled(self._model.get_text_features(**self._tokens(texts)))


class BlipEmbedder(_HFEmbedder):
    """A ``BlipForImageTextRetrieval`` checkpoint with its processor, embedding as BLIP's
    image-text contrastive (ITC) head does for retrieval.

    Images: ``vision_proj(vision_model(pixels).last_hidden_state[:, 0])``; texts:
    ``text_proj(text_encoder(ids, mask).last_hidden_state[:, 0])`` (the [CLS] token, the text
    encoder run without the image), both normalised. Their dot products are the
    ``model(..., use_itm_head=False).itm_score`` cosines. The ITM head (which needs every
    image-text pair run together) is not used. Texts are cut at the text encoder's positions.
    """

    _kind = "blip"
    _model_type = "blip"
    _model_class = "BlipForImageTextRetrieval"

    @property
    def dim(self) -> int:  # type: ignore[override]
        return int(self._model.config.image_text_hidden_size)

    def _needed(self, key: str) -> bool:
        return not key.startswith("itm_head.")

    def _image_features(self, images: list[Image.Image]) -> torch.Tensor:
        return self._features_of(self._pixels(images))

    def _features_of(self, pixels: torch.Tensor) -> torch.Tensor:
        hidden = self._model.vision_model(pixel_values=pixels).last_hidden_state
        return self._model.vision_proj(hidden[:, 0, :])

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        hidden = self._model.text_encoder(**self._tokens(texts)).last_hidden_state
        return self._model.text_proj(hidden[:, 0, :])


_SAFE = {"weights_only": True}
"""open_clip's checkpoint read as tensors only (its default since 3.0, said here)."""


class OpenClipEmbedder(_TorchEmbedder):
    """An open_clip model: ``create_model_and_transforms(name, pretrained=pretrained)``, its
    evaluation transform and ``get_tokenizer(name)``; embeddings are ``encode_image`` /
    ``encode_text``, normalised.

    ``pretrained`` is an open_clip tag (``laion2b_s34b_b79k``) or a checkpoint path (an
    open_clip training run's ``epoch_N.pt``); ``name="hf-hub:ORG/NAME"`` takes ``None``.
    ``dtype`` float16/bfloat16 is open_clip's ``fp16``/``bf16`` precision (LayerNorms stay
    float32). Texts are cut at the tokenizer's context length (77 for CLIP models).
    """

    def __init__(
        self,
        name: str,
        pretrained: str | None,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        batch_size: int = 64,
    ) -> None:
        spec = ModelSpec("open_clip", name, pretrained)
        super().__init__(device, dtype, batch_size)
        self.spec = spec
        check_torchvision()  # open_clip imports it; a broken build gets the one-line hint
        try:
            import open_clip
        except ImportError as err:
            raise ImportError(_OPEN_CLIP_HINT) from err
        if pretrained is not None and looks_local(pretrained) and not os.path.isfile(pretrained):
            raise FileNotFoundError(
                f"open_clip checkpoint {pretrained!r} (spec {str(spec)!r}) does not exist"
            )
        precision = _OPEN_CLIP_PRECISION[str(self.dtype).removeprefix("torch.")]
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                name, pretrained=pretrained, precision=precision, device=self.device, **_SAFE
            )
            self._tokenizer = open_clip.get_tokenizer(name)
        except (RuntimeError, OSError, ValueError, KeyError, AssertionError) as err:
            raise ValueError(f"cannot load {str(spec)!r}: {err}") from err
        except weight_errors() as err:  # torch's weights_only unpickler refused the checkpoint
            why = weights_failure(err, pretrained or name) or err
            raise ValueError(f"cannot load {str(spec)!r}: {why}") from err
        self._model = model.eval()
        self._preprocess = preprocess
        with self._torch.inference_mode():
            self.dim = int(self._text_features([""]).shape[-1])

    def _image_features(self, images: list[Image.Image]) -> torch.Tensor:
        pixels = self._torch.stack([self._preprocess(image) for image in images])
        return self._model.encode_image(pixels.to(self.device, dtype=self.dtype))

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        return self._model.encode_text(self._tokenizer(texts).to(self.device))


class ScratchEmbedder(_TorchEmbedder):
    """``scratch:FOLDER``: the small dual encoder trained from scratch
    (:mod:`counterfactual.models.scratch`), in eval mode."""

    def __init__(
        self,
        name: str,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        batch_size: int = 64,
    ) -> None:
        super().__init__(device, "float32" if dtype is None else dtype, batch_size)
        if not Path(name).is_dir():
            raise FileNotFoundError(f"scratch model folder {name!r} does not exist")
        from counterfactual.models.scratch import load_scratch

        self.spec = ModelSpec("scratch", name)
        model, self._processor = load_scratch(name)
        self._model = model.to(self.device, dtype=self.dtype).eval()
        self.dim = model.config.embed_dim

    def _image_features(self, images: list[Image.Image]) -> torch.Tensor:
        pixels = self._processor.pixels(images).to(self.device, dtype=self.dtype)
        return self._model.encode_image(pixels)

    def _text_features(self, texts: list[str]) -> torch.Tensor:
        tokens = {k: v.to(self.device) for k, v in self._processor.tokens(texts).items()}
        return self._model.encode_text(tokens["input_ids"], tokens["attention_mask"])


def load_embedder(
    spec: str | ModelSpec,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    batch_size: int = 64,
) -> Embedder:
    """The embedder for ``spec`` (text as :func:`parse_model_spec` reads it, or a spec).

    ``device=None`` is CUDA when available, else CPU; ``dtype=None`` float16 on CUDA, float32
    elsewhere. Raises ``FileNotFoundError`` for a local path that does not exist, ``ValueError``
    for a model that cannot be loaded as its kind, ``ImportError`` when open_clip is missing.
    """
    if isinstance(spec, str):
        spec = parse_model_spec(spec)
    if spec.kind == "hf-clip":
        return HFClipEmbedder(spec.name, device, dtype, batch_size)
    if spec.kind == "blip":
        return BlipEmbedder(spec.name, device, dtype, batch_size)
    if spec.kind == "scratch":
        return ScratchEmbedder(spec.name, device, dtype, batch_size)
    return OpenClipEmbedder(spec.name, spec.pretrained, device, dtype, batch_size)
