"""A small CLIP-style dual encoder trained from scratch on a CPU (the controlled world's model):
a CNN image tower and a bag-of-words text tower, each projected to unit embeddings compared by
cosine at a learned temperature (CLIP's loss).

It is saved and loaded like a Hugging Face model, so ``counterfactual train --recipe scratch``
and ``counterfactual eval --model scratch:FOLDER`` use it as they use CLIP: a folder holds
``config.json`` (``model_type: scratch-dual``, the sizes), ``model.safetensors`` (absent: the
weights are drawn at load from ``config.json``'s ``seed``) and ``vocab.json`` (the words the text
tower knows; id 0 pads, id 1 is any unknown word). :func:`init_model` writes such a folder.

Data contracts: ``pixel_values`` float32 ``(B, 3, S, S)``, RGB scaled to [0, 1] then normalised
by :data:`MEAN`/:data:`STD`; ``input_ids`` int64 ``(B, L)`` word ids, 0-padded;
``attention_mask`` int64 ``(B, L)``, 1 on words. Imports torch: load it lazily.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

MODEL_TYPE = "scratch-dual"
MEAN = (0.5, 0.5, 0.5)
STD = (0.25, 0.25, 0.25)
PAD, UNKNOWN = "<pad>", "<unk>"
_WORD = re.compile(r"[a-z]+")
_WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class ScratchConfig:
    """Sizes of the two towers: pictures are resized to ``image_size``; the CNN has one 3x3
    conv + 2x2 max-pool block per entry of ``channels``, the first conv at stride
    ``stem_stride``; words embed in ``text_dim``; both project to ``embed_dim``. ``seed`` draws
    the initial weights."""

    image_size: int = 48
    channels: tuple[int, ...] = (16, 32, 64)
    stem_stride: int = 2
    text_dim: int = 128
    embed_dim: int = 128
    vocab_size: int = 2
    seed: int = 0
    model_type: str = MODEL_TYPE

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        for name in ("image_size", "stem_stride", "text_dim", "embed_dim", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.channels or min(self.channels) < 1:
            raise ValueError(f"channels must be one or more positive integers: {self.channels}")
        if self.model_type != MODEL_TYPE:
            raise ValueError(f"model_type must be {MODEL_TYPE!r}, got {self.model_type!r}")


class ScratchDualEncoder(torch.nn.Module):
    """The two towers and CLIP's learned temperature (``logit_scale``, log of 1/0.07 at
    first)."""

    def __init__(self, config: ScratchConfig) -> None:
        super().__init__()
        self.config = config
        layers: list[torch.nn.Module] = []
        before = 3
        for i, width in enumerate(config.channels):
            stride = config.stem_stride if i == 0 else 1
            layers += [
                torch.nn.Conv2d(before, width, 3, stride=stride, padding=1, bias=False),
                torch.nn.BatchNorm2d(width),
                torch.nn.ReLU(inplace=True),
                torch.nn.MaxPool2d(2),
            ]
            before = width
        self.cnn = torch.nn.Sequential(*layers)
        self.image_proj = torch.nn.Linear(2 * before, config.embed_dim)
        self.words = torch.nn.Embedding(config.vocab_size, config.text_dim, padding_idx=0)
        self.text_proj = torch.nn.Sequential(
            torch.nn.Linear(config.text_dim, config.text_dim),
            torch.nn.ReLU(inplace=True),
            torch.nn.Linear(config.text_dim, config.embed_dim),
        )
        self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(1 / 0.07)))

    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Unnormalised image embeddings: mean- and max-pooled CNN features, projected."""
        maps = self.cnn(pixel_values)
        pooled = torch.cat([maps.mean(dim=(2, 3)), maps.amax(dim=(2, 3))], dim=1)
        return self.image_proj(pooled)

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Unnormalised text embeddings: the mean of the word vectors (padding left out)."""
        weights = attention_mask.float()
        lengths = weights.sum(dim=1, keepdim=True).clamp(min=1)
        vectors = self.words(input_ids) * weights[..., None]
        bag = vectors.sum(dim=1) / lengths
        return self.text_proj(bag)

    def forward(
        self, pixel_values: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """CLIP's symmetric cross-entropy over the batch (pair ``i`` matches text ``i``)."""
        images = torch.nn.functional.normalize(self.encode_image(pixel_values), dim=-1)
        texts = torch.nn.functional.normalize(self.encode_text(input_ids, attention_mask), dim=-1)
        logits = self.logit_scale.exp() * images @ texts.t()
        labels = torch.arange(len(logits), device=logits.device)
        cross_entropy = torch.nn.functional.cross_entropy
        return (cross_entropy(logits, labels) + cross_entropy(logits.t(), labels)) / 2

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {**asdict(self.config), "channels": list(self.config.channels)}
        (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n", "utf-8")
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, str(folder / _WEIGHTS))


class ScratchProcessor:
    """Pictures and captions to the model's tensors (module docstring), like a Hugging Face
    processor: ``processor(text=..., images=..., return_tensors="pt", padding=True,
    truncation=True, max_length=N)``."""

    def __init__(self, vocab: Sequence[str], image_size: int) -> None:
        if len(vocab) < 2 or vocab[0] != PAD or vocab[1] != UNKNOWN:
            raise ValueError(f"a vocabulary starts with {PAD!r}, {UNKNOWN!r}")
        self.vocab = list(vocab)
        self.ids = {w: i for i, w in enumerate(self.vocab)}
        self.image_size = image_size

    @staticmethod
    def words(text: str) -> list[str]:
        return _WORD.findall(text.lower())

    def tokens(self, texts: Sequence[str], max_length: int = 64) -> dict[str, torch.Tensor]:
        rows = [[self.ids.get(w, 1) for w in self.words(t)][:max_length] or [1] for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.int64)
        mask = torch.zeros((len(rows), width), dtype=torch.int64)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def pixels(self, images: Sequence[Image.Image]) -> torch.Tensor:
        size = self.image_size
        arrays = []
        for image in images:
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
            arrays.append(np.asarray(rgb, np.float32))
        batch = np.stack(arrays) / 255.0
        batch = (batch - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
        return torch.from_numpy(np.ascontiguousarray(batch.transpose(0, 3, 1, 2)))

    def __call__(
        self,
        text: Sequence[str] | None = None,
        images: Sequence[Image.Image] | None = None,
        return_tensors: str = "pt",
        padding: bool = True,
        truncation: bool = True,
        max_length: int = 64,
    ) -> dict[str, torch.Tensor]:
        if return_tensors != "pt":
            raise ValueError(f"return_tensors must be 'pt', got {return_tensors!r}")
        out: dict[str, torch.Tensor] = {}
        if text is not None:
            out.update(self.tokens(list(text), max_length))
        if images is not None:
            out["pixel_values"] = self.pixels(list(images))
        return out

    def save_pretrained(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vocab.json").write_text(json.dumps(self.vocab) + "\n", "utf-8")


def build_vocab(texts: Iterable[str], min_count: int = 1) -> list[str]:
    """The words of ``texts`` seen at least ``min_count`` times, sorted, after the pad and
    unknown tokens."""
    counts = Counter(w for t in texts for w in ScratchProcessor.words(t))
    return [PAD, UNKNOWN, *sorted(w for w, n in counts.items() if n >= min_count)]


def init_model(
    folder: str | Path, vocab: Sequence[str], config: ScratchConfig | None = None
) -> Path:
    """Write an untrained model folder (config and vocabulary; the weights are drawn from the
    config's seed when it is loaded): what ``train --recipe scratch --model FOLDER`` starts
    from."""
    config = config or ScratchConfig()
    config = ScratchConfig(**{**asdict(config), "vocab_size": len(vocab)})
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    data = {**asdict(config), "channels": list(config.channels)}
    (folder / "config.json").write_text(json.dumps(data, indent=1) + "\n", "utf-8")
    ScratchProcessor(vocab, config.image_size).save_pretrained(folder)
    weights = folder / _WEIGHTS
    if weights.exists():
        weights.unlink()
    return folder


def is_scratch(folder: str | Path) -> bool:
    """Whether ``folder`` holds a scratch model (its ``config.json`` says so)."""
    try:
        data = json.loads((Path(folder) / "config.json").read_text("utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and data.get("model_type") == MODEL_TYPE


def load_scratch(folder: str | Path) -> tuple[ScratchDualEncoder, ScratchProcessor]:
    """Model (float32, training mode as built) and processor from a folder; ``ValueError`` when
    it is not a scratch model folder or its weights do not fit its config."""
    folder = Path(folder)
    try:
        data: Mapping[str, Any] = json.loads((folder / "config.json").read_text("utf-8"))
        vocab = json.loads((folder / "vocab.json").read_text("utf-8"))
        config = ScratchConfig(**data)
    except (OSError, json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{folder} is not a scratch model folder: {err}") from err
    if len(vocab) != config.vocab_size:
        raise ValueError(f"{folder}: {len(vocab)} words but vocab_size {config.vocab_size}")
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(config.seed)
    try:
        model = ScratchDualEncoder(config)
    finally:
        torch.random.set_rng_state(generator_state)
    weights = folder / _WEIGHTS
    if weights.exists():
        from safetensors.torch import load_file

        try:
            model.load_state_dict(load_file(str(weights)))
        except RuntimeError as err:
            raise ValueError(f"{weights} does not fit {folder}/config.json: {err}") from err
    return model, ScratchProcessor(vocab, config.image_size)
