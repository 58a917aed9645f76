"""What a scene is and how scenes are drawn at random: :class:`WorldConfig` (the knobs),
:class:`Scene` (a background and placed objects, JSON-able so any scene can be drawn again,
with or without some of its objects), :func:`sample_scene`.

How classes co-occur: each scene holds one or two of the configured (anchor, partner) pairs,
and sometimes one unpaired class. An active pair shows both its classes with probability
``q / (2 - q)``, else only one of them (each half the time), so that p(partner | anchor) =
p(anchor | partner) = ``q``. Train scenes use ``q = cooccurrence``; val and test scenes use
``q = 0.5``, where a class tells nothing about its partner (the balanced test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from counterfactual.options import declare
from counterfactual.world.classes import CLASSES, PAIRS, ObjectClass

BACKGROUNDS = ("grass", "sand", "sky", "floor", "wall")
SPLITS = ("train", "val", "test")
BALANCED = 0.5
CAPTION_STYLES = ("list", "sentences")
"""The test and val co-occurrence: p(partner | anchor) = 1/2, no shortcut."""


@dataclass(frozen=True)
class WorldConfig:
    """The world's knobs; checked on construction (``ValueError`` names the bad value).

    ``images``: scenes in all; ``val`` and ``test``: how many of them are val and test (the
    rest train). ``size``: picture side in pixels. ``cooccurrence``: p(partner | anchor) in
    train, in [0.5, 1) (0.5: no shortcut). ``pairs``: the (anchor, partner) class pairs;
    ``classes``: every class (unpaired ones appear alone). ``captions``: per picture.
    ``max_count``: the most objects of one class in a scene. ``seed``: every draw.
    ``caption_style``: :data:`CAPTION_STYLES`, ``list`` (the classes in lists, relations and
    places) or ``sentences`` (each class the subject or object of a verb: "a brown dog sits to
    the left of two frisbees on the grass", phrases np-removal can cut)."""

    images: int = declare(6000, help="scenes in all (default: %(default)s)", kind="positive_int")
    val: int = declare(300, help="val scenes (default: %(default)s)", kind="nonnegative_int")
    test: int = declare(700, help="test scenes (default: %(default)s)", kind="nonnegative_int")
    size: int = declare(48, help="picture side in px (default: %(default)s)", kind="positive_int")
    cooccurrence: float = declare(
        0.9, help="p(partner | anchor) in train, in [0.5, 1) (default: %(default)s)", kind="float"
    )
    pairs: tuple[tuple[str, str], ...] = PAIRS
    classes: tuple[ObjectClass, ...] = CLASSES
    captions: int = declare(
        5, help="captions per picture (default: %(default)s)", kind="positive_int"
    )
    max_count: int = 2
    seed: int = declare(0, help="seed of every draw (default: %(default)s)", kind="nonnegative_int")
    caption_style: str = declare(
        "list",
        help="list: classes listed with relations and places; sentences: with verbs, each "
        "class a phrase np-removal can cut (default: %(default)s)",
        choices=("list", "sentences"),
        flags=("--caption-style",),
    )

    def __post_init__(self) -> None:
        for name in ("images", "size", "captions", "max_count"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("val", "test", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.val + self.test >= self.images:
            raise ValueError(
                f"val ({self.val}) + test ({self.test}) leave no train image of {self.images}"
            )
        if self.size < 24:
            raise ValueError(f"size must be at least 24 px, got {self.size}")
        if not BALANCED <= self.cooccurrence < 1:
            raise ValueError(f"cooccurrence must be in [0.5, 1), got {self.cooccurrence!r}")
        if self.caption_style not in CAPTION_STYLES:
            raise ValueError(
                f"caption_style must be one of {CAPTION_STYLES}, got {self.caption_style!r}"
            )
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"class names repeat: {names}")
        paired = [c for pair in self.pairs for c in pair]
        unknown = sorted(set(paired) - set(names))
        if unknown:
            raise ValueError(f"pairs name unknown classes: {unknown}")
        if len(set(paired)) != len(paired) or not self.pairs:
            raise ValueError(f"pairs must be one or more pairs of distinct classes: {self.pairs}")
        object.__setattr__(self, "pairs", tuple((a, b) for a, b in self.pairs))

    @property
    def class_map(self) -> dict[str, ObjectClass]:
        return {c.name: c for c in self.classes}

    @property
    def singles(self) -> tuple[str, ...]:
        """Classes in no pair."""
        paired = {c for pair in self.pairs for c in pair}
        return tuple(c.name for c in self.classes if c.name not in paired)

    def split_of(self, index: int) -> str:
        """The split of scene ``index``: the last ``test`` are test, the ``val`` before them
        val, the rest train."""
        if index >= self.images - self.test:
            return "test"
        return "val" if index >= self.images - self.test - self.val else "train"

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "val": self.val,
            "test": self.test,
            "size": self.size,
            "cooccurrence": self.cooccurrence,
            "pairs": [list(p) for p in self.pairs],
            "classes": [
                {
                    "name": c.name,
                    "shape": c.shape,
                    "color": list(c.color),
                    "color_word": c.color_word,
                    "texture": c.texture,
                    "size": list(c.size),
                    "contrast": c.contrast,
                }
                for c in self.classes
            ],
            "captions": self.captions,
            "max_count": self.max_count,
            "seed": self.seed,
            # absent at the default: a list-captioned world's world.json is as it was
            **({"caption_style": self.caption_style} if self.caption_style != "list" else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorldConfig:
        classes = tuple(
            ObjectClass(
                c["name"],
                c["shape"],
                tuple(c["color"]),
                c["color_word"],
                c["texture"],
                tuple(c["size"]),
                c["contrast"],
            )
            for c in data["classes"]
        )
        rest = {k: v for k, v in data.items() if k not in ("classes", "pairs")}
        return cls(**rest, classes=classes, pairs=tuple(tuple(p) for p in data["pairs"]))


@dataclass(frozen=True, slots=True)
class SceneObject:
    """One object: its class and box (``x, y, w, h`` in pixels of the picture, float)."""

    cls: str
    x: float
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class Scene:
    """A picture's content: ``size`` px square, a background kind and seed, its objects in
    drawing order, its split."""

    image_id: int
    split: str
    size: int
    background: str
    background_seed: int
    objects: tuple[SceneObject, ...] = field(default_factory=tuple)

    @property
    def classes(self) -> tuple[str, ...]:
        """The classes present, in order of first appearance."""
        return tuple(dict.fromkeys(o.cls for o in self.objects))

    def to_dict(self) -> dict[str, Any]:
        return {
            "image_id": self.image_id,
            "split": self.split,
            "size": self.size,
            "background": self.background,
            "background_seed": self.background_seed,
            "objects": [[o.cls, o.x, o.y, o.w, o.h] for o in self.objects],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scene:
        objects = tuple(SceneObject(str(c), *map(float, box)) for c, *box in data["objects"])
        return cls(
            int(data["image_id"]),
            str(data["split"]),
            int(data["size"]),
            str(data["background"]),
            int(data["background_seed"]),
            objects,
        )


def both_probability(q: float) -> float:
    """p(both classes of an active pair) that makes p(partner | anchor) = p(anchor | partner)
    = ``q`` when the other outcomes are one class alone, each equally likely."""
    return q / (2 - q)


def pick_classes(config: WorldConfig, rng: np.random.Generator, q: float) -> list[str]:
    """The classes of one scene at co-occurrence ``q``."""
    chosen: list[str] = []
    n_pairs = min(len(config.pairs), int(rng.integers(1, 3)))
    for p in rng.choice(len(config.pairs), n_pairs, replace=False):
        anchor, partner = config.pairs[int(p)]
        if rng.random() < both_probability(q):
            chosen += [anchor, partner]
        else:
            chosen.append(anchor if rng.random() < 0.5 else partner)
    singles = config.singles
    if singles and rng.random() < 0.5:
        chosen.append(singles[int(rng.integers(len(singles)))])
    return chosen


def sample_scene(config: WorldConfig, index: int) -> Scene:
    """Scene ``index`` (0-based; image id ``index + 1``), a function of the config's seed and
    the index alone."""
    split = config.split_of(index)
    rng = np.random.default_rng([config.seed, index])
    q = config.cooccurrence if split == "train" else BALANCED
    classes = config.class_map
    placed: list[SceneObject] = []
    for name in pick_classes(config, rng, q):
        count = 1 + int(rng.binomial(config.max_count - 1, 0.2))
        for _ in range(count):
            placed.append(_place(classes[name], config.size, placed, rng))
    order = rng.permutation(len(placed))
    return Scene(
        image_id=index + 1,
        split=split,
        size=config.size,
        background=BACKGROUNDS[int(rng.integers(len(BACKGROUNDS)))],
        background_seed=int(rng.integers(2**31)),
        objects=tuple(placed[i] for i in order),
    )


def _place(
    cls: ObjectClass, size: int, placed: list[SceneObject], rng: np.random.Generator
) -> SceneObject:
    """A box for one object: the least overlapping of a few random tries (overlap spoils both
    the picture and the selection rules)."""
    best: SceneObject | None = None
    best_overlap = math.inf
    for _ in range(12):
        side = float(rng.uniform(*cls.size)) * size
        w = side * float(rng.uniform(0.85, 1.15))
        h = side * float(rng.uniform(0.85, 1.15))
        x = float(rng.uniform(0, size - w))
        y = float(rng.uniform(0, size - h))
        candidate = SceneObject(cls.name, round(x, 2), round(y, 2), round(w, 2), round(h, 2))
        overlap = sum(_intersection(candidate, other) for other in placed)
        if overlap < best_overlap:
            best, best_overlap = candidate, overlap
        if overlap == 0:
            break
    assert best is not None
    return best


def _intersection(a: SceneObject, b: SceneObject) -> float:
    w = min(a.x + a.w, b.x + b.w) - max(a.x, b.x)
    h = min(a.y + a.h, b.y + b.h) - max(a.y, b.y)
    return max(w, 0.0) * max(h, 0.0)
