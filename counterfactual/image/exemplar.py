"""An exemplar fill on CPU, no weights: the hole is rebuilt from patches of the picture around it.

Wexler et al.'s completion (*Space-Time Completion of Video*, 2007), as PatchMatch-based tools
such as Photoshop's content-aware fill run it: on a padded crop around the mask, from a coarse
level (seeded by OpenCV's Telea fill) to the working size, each pass finds for every patch that
touches the hole the most similar patch lying wholly outside it (a kd-tree over the patches,
OpenCV's FLANN with a fixed number of checks), and each hole pixel becomes the mean of what the
patches covering it copy there. The result keeps the texture and edges of the surroundings where
Telea and Navier-Stokes smear the border colours inwards (``make bench ARGS="--only fill"``
measures both on held-out regions of real photos).

Images are ``uint8`` RGB ``(H, W, 3)``; masks ``uint8`` ``(H, W)``, 255 = repaint. Pixels outside
the mask come back unchanged; the same request gives the same pixels every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from counterfactual.image.base import EditRequest, Eraser, at_least, recorded
from counterfactual.image.checks import check_request, padded_box, paste
from counterfactual.method.masks import mask_bounds
from counterfactual.options import declare

_COARSEST = 24
"""The pyramid stops halving when the crop's long side would go below this, px."""
_ITERATIONS = 2
"""PatchMatch rounds (propagation and random search) per pass."""


@dataclass(frozen=True, slots=True)
class ExemplarConfig:
    """The exemplar fill's options."""

    patch: int = declare(
        7,
        help="exemplar: patch side in px, odd, >= 3",
        flags=("--exemplar-patch",),
        kind="positive_int",
        metadata=recorded("exemplar_patch", sparse=True),
    )
    """Side of the square patches compared and copied, px at the working size, odd, >= 3."""
    max_side: int = declare(
        160,
        help="exemplar: cap the crop's long side in px, >= 0 (0: native resolution)",
        flags=("--exemplar-max-side",),
        kind="nonnegative_int",
        metadata=recorded("exemplar_max_side", sparse=True),
    )
    """The padded crop is filled at most this many pixels on its long side and scaled back
    (0 = native resolution: slower, sharper)."""
    context: float = declare(
        0.75,
        help="exemplar: context around the mask box to copy from, fraction of its longer side",
        flags=("--exemplar-context",),
        kind="nonnegative_float",
        metadata=recorded("exemplar_context", sparse=True),
    )
    """Context around the mask's bounding box, as a fraction of its longer side: where the
    patches are taken from."""
    passes: int = declare(
        3,
        help="exemplar: search-and-vote passes per pyramid level, >= 1",
        flags=("--exemplar-passes",),
        kind="positive_int",
        metadata=recorded("exemplar_passes", sparse=True),
    )
    """Search-and-vote passes per pyramid level, >= 1."""

    def __post_init__(self) -> None:
        if self.patch < 3 or self.patch % 2 == 0:
            raise ValueError(f"exemplar_patch must be odd and >= 3, got {self.patch}")
        if self.max_side != 0 and self.max_side < 2 * self.patch:
            raise ValueError(
                f"exemplar_max_side must be 0 (native) or >= {2 * self.patch} (twice the "
                f"patch), got {self.max_side}"
            )
        if self.passes < 1:
            raise ValueError(f"exemplar_passes must be >= 1, got {self.passes}")
        at_least("exemplar_context", self.context, 0)


class ExemplarInpainter:
    """Fills each request's mask from patches of its own picture (see the module doc)."""

    def __init__(self, config: ExemplarConfig | None = None) -> None:
        self.config = config or ExemplarConfig()

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {
            "method": "inpaint",
            "backend": "exemplar",
            "patch": c.patch,
            "max_side": c.max_side,
            "context": c.context,
            "passes": c.passes,
        }

    def __call__(self, batch: Sequence[EditRequest]) -> list[np.ndarray]:
        return [self.edit(req) for req in batch]

    def edit(self, req: EditRequest) -> np.ndarray:
        check_request(req)
        out = req.image.copy()
        bounds = region(self.config, req.mask)
        if bounds is None:
            return out
        x0, y0, x1, y1 = bounds
        crop, crop_mask = req.image[y0:y1, x0:x1], req.mask[y0:y1, x0:x1]
        filled = fill_crop(crop, crop_mask > 0, self.config)
        paste(out[y0:y1, x0:x1], filled, crop_mask)
        return out


def region(config: ExemplarConfig, mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """The crop ``(x0, y0, x1, y1)`` the fill reads and writes for ``mask``; ``None``: empty."""
    bounds = mask_bounds(mask)
    if bounds is None:
        return None
    side = max(bounds[2] - bounds[0], bounds[3] - bounds[1])
    pad = max(2 * config.patch, round(config.context * side))
    return padded_box(bounds, pad, *mask.shape[:2])


def fill_crop(crop: np.ndarray, hole: np.ndarray, config: ExemplarConfig) -> np.ndarray:
    """``crop`` (``uint8`` RGB) with the ``hole`` (bool, same ``H, W``) filled; pixels outside
    the hole are the crop's where it is filled at native size, the scaled-back fill elsewhere
    (the caller pastes the hole only)."""
    h, w = hole.shape
    long_side = max(h, w)
    scale = config.max_side / long_side if config.max_side and long_side > config.max_side else 1
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    work = crop if scale == 1 else cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
    work_hole = hole if scale == 1 else _shrink_hole(hole, size)
    filled = _complete(work, work_hole, config)
    if scale == 1:
        return filled
    return cv2.resize(filled, (w, h), interpolation=cv2.INTER_CUBIC)


def _shrink_hole(hole: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The hole at ``size`` (w, h): a pixel any part of which was hole is hole."""
    return cv2.resize(hole.astype(np.uint8) * 255, size, interpolation=cv2.INTER_AREA) > 0


def _pyramid(image: np.ndarray, hole: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(image, hole)`` from the coarsest level to the given size, halving each time."""
    levels = [(image, hole)]
    while max(levels[-1][1].shape) // 2 >= _COARSEST and min(levels[-1][1].shape) // 2 >= 8:
        im, ho = levels[-1]
        size = (max(1, im.shape[1] // 2), max(1, im.shape[0] // 2))
        levels.append((cv2.resize(im, size, interpolation=cv2.INTER_AREA), _shrink_hole(ho, size)))
    return levels[::-1]


def _complete(image: np.ndarray, hole: np.ndarray, config: ExemplarConfig) -> np.ndarray:
    """Coarse to fine: Telea seeds the coarsest level, each finer one starts from the level
    below scaled up (its picture and its matches), then ``config.passes`` times PatchMatch
    and a vote. The draws are seeded: the same input gives the same pixels."""
    rng = np.random.default_rng(0)
    estimate: np.ndarray | None = None
    previous: np.ndarray | None = None
    for im, ho in _pyramid(image, hole):
        if estimate is None:
            estimate = cv2.inpaint(im, ho.astype(np.uint8) * 255, 3, cv2.INPAINT_TELEA)
        else:
            up = cv2.resize(estimate, (im.shape[1], im.shape[0]), interpolation=cv2.INTER_LINEAR)
            estimate = np.where(ho[..., None], up, im)
        level = _Level.of(im, ho, config.patch)
        if level is None:  # no whole patch outside the hole: keep the smooth fill
            previous = None
            continue
        match = _initial_match(level, previous, rng)
        for _ in range(config.passes):
            target = _features(estimate, level.radius)[
                level.targets[0] * im.shape[1] + level.targets[1]
            ]
            match = _patchmatch(level, target, match, rng)
            estimate = _vote(estimate, level, match)
        previous = np.arange(ho.size).reshape(ho.shape)
        previous[level.targets] = match
    assert estimate is not None
    return estimate


@dataclass(frozen=True, slots=True)
class _Level:
    """One pyramid level: the picture, its hole, the patch radius, where a source patch may
    be centred (wholly outside the hole and the picture's border) and every pixel's patch
    features of the picture (only the sources' are read)."""

    image: np.ndarray
    hole: np.ndarray
    radius: int
    valid: np.ndarray
    features: np.ndarray
    targets: tuple[np.ndarray, np.ndarray]

    @classmethod
    def of(cls, image: np.ndarray, hole: np.ndarray, patch: int) -> _Level | None:
        r = patch // 2
        h, w = hole.shape
        if h < patch or w < patch:
            return None
        near = cv2.dilate(hole.astype(np.uint8), np.ones((patch, patch), np.uint8)) > 0
        valid = np.zeros_like(near)
        valid[r : h - r, r : w - r] = True
        valid &= ~near
        if not valid.any():
            return None
        return cls(image, hole, r, valid, _features(image, r), np.nonzero(near))


def _features(image: np.ndarray, r: int) -> np.ndarray:
    """``(H * W, (2r+1)^2 * 3)`` float32: the patch centred on each pixel, row-major (the
    picture reflected at its border)."""
    padded = cv2.copyMakeBorder(image, r, r, r, r, cv2.BORDER_REFLECT_101)
    windows = np.lib.stride_tricks.sliding_window_view(padded, (2 * r + 1, 2 * r + 1), (0, 1))
    h, w = image.shape[:2]
    return windows.reshape(h * w, -1).astype(np.float32)


def _random_sources(level: _Level, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` flat indices of source centres drawn uniformly."""
    sources = np.flatnonzero(level.valid)
    return sources[rng.integers(0, len(sources), count)]


def _initial_match(level: _Level, previous: np.ndarray | None, rng: np.random.Generator):
    """Each target's source (flat index): the coarser level's match scaled up, where it lands
    on a source, else a random source."""
    ty, tx = level.targets
    h, w = level.hole.shape
    match = _random_sources(level, len(ty), rng)
    if previous is None:
        return match
    ph, pw = previous.shape
    py, px = np.minimum(ty // 2, ph - 1), np.minimum(tx // 2, pw - 1)
    old = previous[py, px]
    sy = np.clip(2 * (old // pw) + ty % 2, 0, h - 1)
    sx = np.clip(2 * (old % pw) + tx % 2, 0, w - 1)
    scaled = sy * w + sx
    ok = level.valid.reshape(-1)[scaled]
    match[ok] = scaled[ok]
    return match


def _distance(target: np.ndarray, level: _Level, match: np.ndarray) -> np.ndarray:
    diff = target - level.features[match]
    return np.einsum("ij,ij->i", diff, diff)


def _patchmatch(
    level: _Level, target: np.ndarray, match: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Barnes et al.'s PatchMatch, every target at once: :data:`_ITERATIONS` rounds of
    propagation (a neighbour's match, shifted) and random search (ever smaller windows around
    the current match); a candidate wins when its patch is closer."""
    ty, tx = level.targets
    h, w = level.hole.shape
    valid = level.valid.reshape(-1)
    best = _distance(target, level, match)
    where = np.full(h * w, -1, np.int64)
    where[ty * w + tx] = np.arange(len(ty))

    def trial(candidate: np.ndarray, usable: np.ndarray) -> None:
        usable = usable & valid[np.where(usable, candidate, 0)]
        rows = np.flatnonzero(usable)
        if len(rows):
            d = _distance(target[rows], level, candidate[rows])
            better = d < best[rows]
            match[rows[better]], best[rows[better]] = candidate[rows[better]], d[better]

    for step in range(_ITERATIONS):
        sign = 1 if step % 2 == 0 else -1
        for dy, dx in ((0, sign), (sign, 0)):
            ny, nx = ty - dy, tx - dx
            inside = (ny >= 0) & (ny < h) & (nx >= 0) & (nx < w)
            neighbour = where[np.where(inside, ny * w + nx, 0)]
            has = inside & (neighbour >= 0)
            from_match = match[np.where(has, neighbour, 0)]
            cy, cx = from_match // w + dy, from_match % w + dx
            ok = has & (cy >= 0) & (cy < h) & (cx >= 0) & (cx < w)
            trial(np.where(ok, cy * w + cx, 0), ok)
        radius = max(h, w)
        while radius >= 1:
            cy = match // w + rng.integers(-radius, radius + 1, len(match))
            cx = match % w + rng.integers(-radius, radius + 1, len(match))
            ok = (cy >= 0) & (cy < h) & (cx >= 0) & (cx < w)
            trial(np.where(ok, cy * w + cx, 0), ok)
            radius //= 2
    return match


def _vote(estimate: np.ndarray, level: _Level, match: np.ndarray) -> np.ndarray:
    """Each hole pixel: the mean of what the patches covering it copy there from their
    matches."""
    r = level.radius
    h, w = level.hole.shape
    ty, tx = level.targets
    sy, sx = match // w, match % w
    hole = level.hole.reshape(-1)
    source = level.image.reshape(-1, 3).astype(np.float64)
    total = np.zeros((h * w, 3), np.float64)
    count = np.zeros(h * w, np.float64)
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            qy, qx = ty + dy, tx + dx
            ok = (qy >= 0) & (qy < h) & (qx >= 0) & (qx < w)
            at = qy[ok] * w + qx[ok]
            into = hole[at]
            at, src = at[into], ((sy[ok] + dy) * w + (sx[ok] + dx))[into]
            count += np.bincount(at, minlength=h * w)
            for c in range(3):
                total[:, c] += np.bincount(at, weights=source[src, c], minlength=h * w)
    out = estimate.copy()
    filled = hole & (count > 0)
    values = np.round(total[filled] / count[filled, None])
    out.reshape(-1, 3)[filled] = np.clip(values, 0, 255).astype(np.uint8)
    return out


def _build(config: ExemplarConfig, **runtime: Any) -> ExemplarInpainter:
    return ExemplarInpainter(config)


ERASER = Eraser(
    name="exemplar",
    config=ExemplarConfig,
    build=_build,
    summary="exemplar (patches of the picture around the hole, CPU)",
    region=region,
)
