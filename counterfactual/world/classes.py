"""The object classes of the controlled world: what each looks like and how it is named.

A class is a shape, a colour and a texture (so a classifier needs more than one cue), drawn at a
size drawn from its own range and blended into the background by its ``contrast`` (1: its own
colour; lower: closer to the background under it, harder to see). Classes come in pairs
(anchor, partner): the world's co-occurrence knob ties a partner to its anchor in train.
"""

from __future__ import annotations

from dataclasses import dataclass

SHAPES = (
    "disc",
    "ring",
    "triangle",
    "square",
    "diamond",
    "chevron",
    "cross",
    "halfdisc",
    "trapezoid",
    "bars",
    "star",
    "tree",
    "hexagon",
    "clock",
)
"""What :func:`counterfactual.world.draw.draw_object` can draw."""

TEXTURES = ("solid", "stripes", "dots", "checker", "outline")
"""Fills: one colour, dark stripes, dark dots, a checkerboard, or a dark outline."""


@dataclass(frozen=True, slots=True)
class ObjectClass:
    """One class: its name (a noun the captions use; the plural adds ``-s`` or ``-es``), shape,
    RGB colour, colour word, texture, ``size`` range (object side as a fraction of the picture
    side) and ``contrast`` in (0, 1]."""

    name: str
    shape: str
    color: tuple[int, int, int]
    color_word: str
    texture: str
    size: tuple[float, float] = (0.2, 0.32)
    contrast: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or not self.name.isalpha() or not self.name.islower():
            raise ValueError(f"class name must be one lower-case word, got {self.name!r}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape of {self.name!r} must be one of {SHAPES}, got {self.shape!r}")
        if self.texture not in TEXTURES:
            raise ValueError(f"texture of {self.name!r} must be one of {TEXTURES}")
        low, high = self.size
        if not 0 < low <= high < 1:
            raise ValueError(f"size of {self.name!r} must be 0 < low <= high < 1, got {self.size}")
        if not 0 < self.contrast <= 1:
            raise ValueError(f"contrast of {self.name!r} must be in (0, 1], got {self.contrast}")

    @property
    def plural(self) -> str:
        return self.name + ("es" if self.name.endswith(("s", "x", "ch", "sh")) else "s")


ANCHOR_SIZE = (0.22, 0.34)
PARTNER_SIZE = (0.15, 0.24)
PARTNER_CONTRAST = 0.65
"""The default partners are smaller and paler than their anchors: the anchor is the easier
cue, so a model trained where they co-occur is tempted to read the partner off the anchor."""

CLASSES: tuple[ObjectClass, ...] = (
    ObjectClass("dog", "disc", (150, 90, 40), "brown", "dots", ANCHOR_SIZE),
    ObjectClass(
        "frisbee", "ring", (240, 220, 40), "yellow", "solid", PARTNER_SIZE, PARTNER_CONTRAST
    ),
    ObjectClass("cat", "triangle", (150, 150, 160), "grey", "stripes", ANCHOR_SIZE),
    ObjectClass("ball", "disc", (220, 40, 40), "red", "solid", PARTNER_SIZE, PARTNER_CONTRAST),
    ObjectClass("car", "square", (40, 80, 220), "blue", "outline", ANCHOR_SIZE),
    ObjectClass("tree", "tree", (30, 150, 50), "green", "solid", PARTNER_SIZE, PARTNER_CONTRAST),
    ObjectClass("boat", "trapezoid", (245, 245, 245), "white", "stripes", ANCHOR_SIZE),
    ObjectClass("bird", "chevron", (20, 20, 20), "black", "solid", PARTNER_SIZE, PARTNER_CONTRAST),
    ObjectClass("cow", "square", (235, 235, 235), "white", "checker", ANCHOR_SIZE),
    ObjectClass("bench", "bars", (140, 120, 40), "olive", "solid", PARTNER_SIZE, PARTNER_CONTRAST),
    ObjectClass("clock", "clock", (250, 250, 230), "white", "outline", ANCHOR_SIZE),
    ObjectClass(
        "cup", "trapezoid", (240, 140, 30), "orange", "solid", PARTNER_SIZE, PARTNER_CONTRAST
    ),
    ObjectClass("kite", "diamond", (220, 40, 200), "pink", "stripes", ANCHOR_SIZE),
    ObjectClass(
        "umbrella", "halfdisc", (40, 200, 220), "cyan", "solid", PARTNER_SIZE, PARTNER_CONTRAST
    ),
    ObjectClass("star", "star", (250, 200, 0), "gold", "solid", ANCHOR_SIZE),
    ObjectClass("cross", "cross", (120, 40, 160), "purple", "solid", ANCHOR_SIZE),
)
"""The default classes: seven (anchor, partner) pairs in order, then two unpaired classes."""

PAIRS: tuple[tuple[str, str], ...] = tuple(
    (CLASSES[i].name, CLASSES[i + 1].name) for i in range(0, 14, 2)
)
"""The default (anchor, partner) pairs: dog-frisbee, cat-ball, car-tree, boat-bird, cow-bench,
clock-cup, kite-umbrella."""
