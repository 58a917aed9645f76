"""Drawing a scene: a background, then each object's shape filled with its class's colour and
texture, drawn at :data:`SUPERSAMPLE` times the picture's side and reduced with area
averaging (smooth edges). Pure functions of a :class:`~counterfactual.world.scene.Scene`: the
same scene draws the same pixels, with or without some of its objects (the clean renders)."""

from __future__ import annotations

from collections.abc import Collection

import cv2
import numpy as np

from counterfactual.world.classes import ObjectClass
from counterfactual.world.scene import BACKGROUNDS, Scene, SceneObject

SUPERSAMPLE = 4


def render(
    scene: Scene, classes: dict[str, ObjectClass], without: Collection[str] = ()
) -> np.ndarray:
    """The scene as an ``(H, W, 3)`` uint8 RGB array, leaving out every object of the classes
    in ``without`` (what the picture would be had they never been there)."""
    side = scene.size * SUPERSAMPLE
    canvas = background(scene.background, scene.background_seed, side)
    mean = canvas.reshape(-1, 3).mean(axis=0)
    for obj in scene.objects:
        if obj.cls not in without:
            draw_object(canvas, obj, classes[obj.cls], mean)
    small = cv2.resize(canvas, (scene.size, scene.size), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(small)


def background(kind: str, seed: int, side: int) -> np.ndarray:
    """One of :data:`~counterfactual.world.scene.BACKGROUNDS`, ``(side, side, 3)`` uint8."""
    if kind not in BACKGROUNDS:
        raise ValueError(f"background must be one of {BACKGROUNDS}, got {kind!r}")
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    if kind == "grass":
        base = np.array([70, 120, 60]) + rng.integers(-15, 16, 3)
        noise = cv2.GaussianBlur(rng.normal(0, 18, (side, side)).astype(np.float32), (0, 0), 3)
        img = base[None, None, :] + noise[..., None]
    elif kind == "sand":
        base = np.array([200, 180, 130]) + rng.integers(-15, 16, 3)
        noise = cv2.GaussianBlur(rng.normal(0, 12, (side, side)).astype(np.float32), (0, 0), 2)
        img = base[None, None, :] + noise[..., None]
    elif kind == "sky":
        top = np.array([90, 140, 210]) + rng.integers(-20, 21, 3)
        bottom = np.array([180, 210, 240]) + rng.integers(-15, 16, 3)
        img = top[None, None, :] * (1 - yy[..., None]) + bottom[None, None, :] * yy[..., None]
    elif kind == "floor":
        a = rng.integers(90, 160, 3)
        b = np.clip(a + rng.integers(20, 50), 0, 255)
        tile = side // int(rng.integers(4, 8))
        check = (np.arange(side)[:, None] // tile + np.arange(side)[None, :] // tile) % 2
        img = np.where(check[..., None] == 1, b[None, None, :], a[None, None, :])
    else:  # wall: a muted colour with soft horizontal bands
        base = rng.integers(80, 180, 3)
        period = float(rng.uniform(0.1, 0.3))
        bands = 12 * np.sin(2 * np.pi * yy / period)
        img = base[None, None, :] + bands[..., None]
    return np.clip(img, 0, 255).astype(np.uint8)


def shape_mask(shape: str, w: int, h: int) -> np.ndarray:
    """A ``(h, w)`` uint8 mask (255 inside) of ``shape`` filling a ``w`` x ``h`` box."""
    m = np.zeros((h, w), np.uint8)
    cx, cy, rx, ry = w // 2, h // 2, max(w // 2 - 1, 1), max(h // 2 - 1, 1)

    def poly(points: list[tuple[float, float]]) -> None:
        pts = np.array([[x * (w - 1), y * (h - 1)] for x, y in points], np.int32)
        cv2.fillPoly(m, [pts], 255)

    if shape in ("disc", "clock"):
        cv2.ellipse(m, (cx, cy), (rx, ry), 0, 0, 360, 255, -1)
    elif shape == "ring":
        cv2.ellipse(m, (cx, cy), (rx, ry), 0, 0, 360, 255, -1)
        cv2.ellipse(m, (cx, cy), (rx // 2, ry // 2), 0, 0, 360, 0, -1)
    elif shape == "triangle":
        poly([(0, 1), (1, 1), (0.5, 0)])
    elif shape == "square":
        m[:] = 255
    elif shape == "diamond":
        poly([(0.5, 0), (1, 0.5), (0.5, 1), (0, 0.5)])
    elif shape == "chevron":
        poly([(0, 0.2), (0.5, 0.6), (1, 0.2), (1, 0.5), (0.5, 0.95), (0, 0.5)])
    elif shape == "cross":
        poly([(0.35, 0), (0.65, 0), (0.65, 1), (0.35, 1)])
        poly([(0, 0.35), (1, 0.35), (1, 0.65), (0, 0.65)])
    elif shape == "halfdisc":
        cv2.ellipse(m, (cx, int(h * 0.55)), (rx, int(h * 0.5)), 0, 180, 360, 255, -1)
        poly([(0.45, 0.5), (0.55, 0.5), (0.55, 1), (0.45, 1)])
    elif shape == "trapezoid":
        poly([(0, 0.15), (1, 0.15), (0.8, 0.9), (0.2, 0.9)])
    elif shape == "bars":
        for top in (0.05, 0.4, 0.75):
            poly([(0, top), (1, top), (1, top + 0.2), (0, top + 0.2)])
    elif shape == "star":
        angles = np.pi / 2 + np.arange(10) * np.pi / 5
        radius = np.where(np.arange(10) % 2 == 0, 0.5, 0.2)
        poly(
            [
                (0.5 + r * np.cos(a), 0.5 - r * np.sin(a))
                for a, r in zip(angles, radius, strict=True)
            ]
        )
    elif shape == "tree":
        poly([(0.5, 0), (1, 0.7), (0, 0.7)])
        poly([(0.4, 0.7), (0.6, 0.7), (0.6, 1), (0.4, 1)])
    elif shape == "hexagon":
        poly([(0.25, 0), (0.75, 0), (1, 0.5), (0.75, 1), (0.25, 1), (0, 0.5)])
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return m


def draw_object(
    canvas: np.ndarray, obj: SceneObject, cls: ObjectClass, background_mean: np.ndarray
) -> None:
    """Paint ``obj`` into ``canvas`` (supersampled), in place."""
    s = SUPERSAMPLE
    x, y = int(round(obj.x * s)), int(round(obj.y * s))
    w, h = max(int(round(obj.w * s)), 2), max(int(round(obj.h * s)), 2)
    mask = shape_mask(cls.shape, w, h) > 0
    color = background_mean + cls.contrast * (np.asarray(cls.color, np.float32) - background_mean)
    dark = color * 0.45
    yy, xx = np.mgrid[0:h, 0:w]
    period = max(w // 4, 2)
    if cls.texture == "stripes":
        pattern = ((xx + yy) // period) % 2 == 1
    elif cls.texture == "dots":
        pattern = ((xx % period - period / 2) ** 2 + (yy % period - period / 2) ** 2) < (
            period / 3.5
        ) ** 2
    elif cls.texture == "checker":
        pattern = ((xx // period) + (yy // period)) % 2 == 1
    elif cls.texture == "outline":
        inner = cv2.erode(mask.astype(np.uint8), np.ones((3, 3), np.uint8), iterations=max(s, 2))
        pattern = mask & (inner == 0)
    else:
        pattern = np.zeros((h, w), bool)
    layer = np.where(pattern[..., None], dark[None, None, :], color[None, None, :])
    if cls.shape == "clock":
        hands = np.zeros((h, w), np.uint8)
        cv2.line(hands, (w // 2, h // 2), (w // 2, h // 6), 255, max(s // 2, 1))
        cv2.line(hands, (w // 2, h // 2), (w * 3 // 4, h // 2), 255, max(s // 2, 1))
        layer[hands > 0] = dark
    region = canvas[y : y + h, x : x + w]
    mask = mask[: region.shape[0], : region.shape[1]]
    layer = layer[: region.shape[0], : region.shape[1]]
    region[mask] = np.clip(layer[mask], 0, 255).astype(np.uint8)
