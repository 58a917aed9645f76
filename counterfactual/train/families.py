"""What each recipe's model family trains: how it loads (:class:`_Family` and its
subclasses, by recipe in ``FAMILIES``), its contrastive loss (:func:`contrastive_loss`), and one
optimisation step (``Step``: autocast, backward, clipping, Adam(W), the family's clamp). Torch is
imported lazily."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from counterfactual._lazy import require
from counterfactual.models.hf import Words, load_pretrained, model_type
from counterfactual.train.config import RECIPES, Recipe, TrainConfig

if TYPE_CHECKING:
    import torch

MAX_LOGIT_SCALE = math.log(100.0)  # open_clip clamps exp(logit_scale) at 100 after each step
BLIP_TEMPERATURE = 0.07
"""The ITC temperature for BLIP: its initial value in BLIP. BLIP learns it, but
``BlipForImageTextRetrieval`` checkpoints do not hold it, so it stays fixed here."""


def contrastive_loss(similarities: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE over a batch: ``similarities[i, j]`` is image ``i`` against text ``j``
    (cosines), pair ``i`` matches text ``i``; the mean of the image->text and text->image cross
    entropies of ``similarities / temperature`` (BLIP's ITC loss without momentum distillation;
    CLIP's with ``temperature = 1 / logit_scale.exp()``)."""
    import torch

    logits = similarities.float() / temperature
    labels = torch.arange(logits.shape[0], device=logits.device)
    cross_entropy = torch.nn.functional.cross_entropy
    return (cross_entropy(logits, labels) + cross_entropy(logits.t(), labels)) / 2


class _Family:
    """How a recipe's model family is loaded, what loss a batch gives, what a step keeps in
    range. ``needed``: the weights a checkpoint must hold for this training."""

    def __init__(self, recipe: Recipe) -> None:
        self.recipe = recipe

    def load(self, source: str) -> tuple[Any, Any]:
        """Model (float32) and processor from a hub id or folder, or ``ValueError``."""
        torch = require("torch", "models")
        recipe = self.recipe
        what = f"{recipe.model_class} (recipe {recipe.name!r})"
        words = Words(
            no_config=f"could not load {recipe.name.upper()} {source} (a hub id or folder with "
            f"a {what})",
            no_model=f"could not load {recipe.name.upper()} {source}",
            not_checkpoint=f"{source} is not a {what} checkpoint",
        )
        kind = model_type(source, words)
        if kind != recipe.model_type:
            other = [r.name for r in RECIPES.values() if r.model_type == kind]
            hint = f"; use recipe {other[0]!r}" if other else ""
            raise ValueError(
                f"{source} holds a {kind!r} model, not the {what} the recipe trains{hint}"
            )
        model, processor = load_pretrained(
            source, recipe.model_class, words, dtype=torch.float32, needed=self.needed
        )
        return model, processor

    def needed(self, key: str) -> bool:
        return True

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        raise NotImplementedError

    def after_step(self, model: Any) -> None:
        """Called after each optimizer step, without gradients."""


class _Clip(_Family):
    """``CLIPModel``: its own contrastive loss (``return_loss=True``) at its learned
    temperature, clamped at 100 after each step as open_clip does."""

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        return model(**inputs, return_loss=True).loss

    def after_step(self, model: Any) -> None:
        model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)


class _Blip(_Family):
    """``BlipForImageTextRetrieval``: ``forward(use_itm_head=False)`` gives the ITC cosines of
    ``normalize(vision_proj(image CLS))`` and ``normalize(text_proj(text CLS))`` (the text
    encoder without the image); :func:`contrastive_loss` at :data:`BLIP_TEMPERATURE`. The ITM
    head is neither trained nor needed."""

    def needed(self, key: str) -> bool:
        return not key.startswith("itm_head.")

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        cosines = model(
            input_ids=inputs["input_ids"],
            attention_mask=inputs["attention_mask"],
            pixel_values=inputs["pixel_values"],
            use_itm_head=False,
        ).itm_score
        return contrastive_loss(cosines, BLIP_TEMPERATURE)


class _Scratch(_Family):
    """:class:`~counterfactual.models.scratch.ScratchDualEncoder`, the small dual encoder trained
    from scratch (the controlled world's): its own CLIP loss, temperature clamped as CLIP's."""

    def load(self, source: str) -> tuple[Any, Any]:
        from counterfactual.models.scratch import is_scratch, load_scratch

        if not is_scratch(source):
            raise ValueError(
                f"{source} is not a scratch model folder (config.json with model_type "
                "'scratch-dual'; counterfactual.models.scratch.init_model writes one)"
            )
        return load_scratch(source)

    def loss(self, model: Any, inputs: Mapping[str, Any]) -> torch.Tensor:
        return model(inputs["pixel_values"], inputs["input_ids"], inputs["attention_mask"])

    def after_step(self, model: Any) -> None:
        model.logit_scale.clamp_(0, MAX_LOGIT_SCALE)


FAMILIES: Mapping[str, _Family] = {
    "clip": _Clip(RECIPES["clip"]),
    "blip": _Blip(RECIPES["blip"]),
    "scratch": _Scratch(RECIPES["scratch"]),
}


class Step:
    """One optimisation step per call on a batch of processor outputs: forward under autocast
    (bf16/fp16 on CUDA), the family's contrastive loss, backward (scaled for fp16), optional
    gradient-norm clipping, Adam(W), then the family's clamp. Returns the loss as a float."""

    def __init__(
        self, model: Any, family: _Family, config: TrainConfig, device: Any, precision: str
    ) -> None:
        import torch

        self.model = model
        self.family = family
        self.device = device
        self.params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
        self.optimizer = optimizer(
            self.params,
            lr=config.lr,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
        self.autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.clip = config.grad_clip_norm

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        scaler = self.scaler.state_dict() if self.scaler is not None else None
        return {"optimizer": self.optimizer.state_dict(), "scaler": scaler}

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(saved["optimizer"])
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])

    def __call__(self, inputs: Mapping[str, Any]) -> float:
        import torch

        inputs = {k: v.to(self.device, non_blocking=True) for k, v in inputs.items()}
        with torch.autocast(self.device.type, dtype=self.autocast, enabled=bool(self.autocast)):
            loss = self.family.loss(self.model, inputs)
        value = float(loss.detach().float().item())
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        with torch.no_grad():
            self.family.after_step(self.model)
        return value


__all__ = ["BLIP_TEMPERATURE", "MAX_LOGIT_SCALE", "contrastive_loss"]
