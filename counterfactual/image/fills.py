"""Constant-ish fills (Kim et al., Table 3): ``zero``, ``mean`` colour of the removed region, and
``blur`` (a strong Gaussian blur of the removed region). Only the mask's bounding box is
touched."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from counterfactual.image.base import EditRequest, Eraser
from counterfactual.image.checks import check_request, padded_box, paste
from counterfactual.method.masks import mask_bounds
from counterfactual.options import declare

FILL_METHODS = ("zero", "mean", "blur")

# Blur at reduced scale when sigma is large: blurring a downscaled crop with sigma
# ``_SMALL_SIGMA`` and scaling back is a close, much cheaper stand-in for the full blur.
_SMALL_SIGMA = 3.0


@dataclass(frozen=True, slots=True)
class FillConfig:
    """The fills' options (``zero``, ``mean``, ``blur``)."""

    blur_sigma: float = declare(
        15.0, help="blur: Gaussian sigma in px, > 0", flags=("--blur-sigma",), kind="positive_float"
    )
    """``blur``: the Gaussian's standard deviation, px, > 0."""

    def __post_init__(self) -> None:
        if not self.blur_sigma > 0:
            raise ValueError(f"blur_sigma must be > 0, got {self.blur_sigma}")


class FillEditor:
    """``method`` (one of :data:`~counterfactual.image.FILL_METHODS`) on the mask's bounding
    box, with ``config``'s options."""

    def __init__(self, method: str, config: FillConfig | None = None) -> None:
        if method not in FILL_METHODS:
            raise ValueError(f"FillEditor does not do method {method!r}")
        self.method = method
        self.config = config or FillConfig()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"method": self.method}
        if self.method == "blur":
            out["sigma"] = self.config.blur_sigma
        return out

    def __call__(self, batch: Sequence[EditRequest]) -> list[np.ndarray]:
        return [self.edit(req) for req in batch]

    def edit(self, req: EditRequest) -> np.ndarray:
        check_request(req)
        bounds = mask_bounds(req.mask)
        out = req.image.copy()
        if bounds is None:
            return out
        x0, y0, x1, y1 = bounds
        region, mask = out[y0:y1, x0:x1], req.mask[y0:y1, x0:x1]
        if self.method == "zero":
            fill = np.zeros_like(region)
        elif self.method == "mean":
            h, w = mask.shape
            mean = np.round(cv2.mean(region, mask=mask)[:3]).astype(np.uint8).tolist()
            fill = cv2.merge([np.full((h, w), v, np.uint8) for v in mean])
        else:
            px0, py0, px1, py1 = padded_box(
                bounds, math.ceil(3 * self.config.blur_sigma), *out.shape[:2]
            )
            blurred = blur(req.image[py0:py1, px0:px1], self.config.blur_sigma)
            fill = blurred[y0 - py0 : y1 - py0, x0 - px0 : x1 - px0]
        paste(region, np.ascontiguousarray(fill), mask)
        return out


def blur(image: np.ndarray, sigma: float) -> np.ndarray:
    """Gaussian blur with standard deviation ``sigma`` pixels.

    For large ``sigma`` the image is shrunk by an integer factor (OpenCV's fast area path),
    blurred with ``sigma / factor`` and scaled back: a close, much cheaper stand-in.
    """
    factor = int(sigma // _SMALL_SIGMA)
    if factor < 2:
        return cv2.GaussianBlur(image, (0, 0), sigma)
    h, w = image.shape[:2]
    padded = cv2.copyMakeBorder(image, 0, -h % factor, 0, -w % factor, cv2.BORDER_REFLECT_101)
    ph, pw = padded.shape[:2]
    small = cv2.resize(padded, (pw // factor, ph // factor), interpolation=cv2.INTER_AREA)
    small = cv2.GaussianBlur(small, (0, 0), sigma / factor)
    return cv2.resize(small, (pw, ph), interpolation=cv2.INTER_LINEAR)[:h, :w]


def _build(config: FillConfig, *, method: str, **runtime: Any) -> FillEditor:
    return FillEditor(method, config)


ERASER = Eraser(
    name="fill",
    config=FillConfig,
    build=_build,
    summary="zero (black), mean (the picture's mean colour) or blur",
    methods=FILL_METHODS,
)
