"""The CPU inpainter that needs no weights: OpenCV's Telea or Navier-Stokes inpainting on a
padded crop around the mask, at reduced scale when the crop is large."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from counterfactual.image.base import EditRequest, Eraser, at_least, recorded
from counterfactual.image.checks import check_request, padded_box, paste
from counterfactual.method.masks import mask_bounds

_FLAGS = {"telea": cv2.INPAINT_TELEA, "ns": cv2.INPAINT_NS}
OPENCV_ALGORITHMS = tuple(_FLAGS)


@dataclass(frozen=True, slots=True)
class OpenCVConfig:
    """OpenCV's inpainting on a padded crop."""

    algorithm: str = field(default="telea", metadata=recorded("opencv_algorithm"))
    """``telea`` or ``ns`` (Navier-Stokes)."""
    radius: int = field(default=3, metadata=recorded("opencv_radius"))
    """Neighbourhood of each inpainted pixel, px."""
    max_side: int = field(default=192, metadata=recorded("opencv_max_side"))
    """The padded crop around the mask is inpainted at most this many pixels on its long side
    and scaled back (0 = native resolution)."""
    crop_padding: float = 0.25
    """Context around the mask's bounding box, as a fraction of its size, for the crop."""

    def __post_init__(self) -> None:
        if self.algorithm not in OPENCV_ALGORITHMS:
            raise ValueError(f"opencv_algorithm {self.algorithm!r} is not 'telea' or 'ns'")
        if self.radius < 1 or self.max_side < 0:
            raise ValueError(
                f"opencv_radius must be >= 1 and opencv_max_side >= 0 (0 = native), got "
                f"{self.radius} and {self.max_side}"
            )
        at_least("crop_padding", self.crop_padding, 0)


class OpenCVInpainter:
    def __init__(self, config: OpenCVConfig | None = None) -> None:
        self.config = config or OpenCVConfig()
        self.flag = _FLAGS[self.config.algorithm]

    def describe(self) -> dict[str, Any]:
        return {
            "method": "inpaint",
            "backend": "opencv",
            "algorithm": self.config.algorithm,
            "radius": self.config.radius,
            "max_side": self.config.max_side,
        }

    def __call__(self, batch: Sequence[EditRequest]) -> list[np.ndarray]:
        return [self.edit(req) for req in batch]

    def edit(self, req: EditRequest) -> np.ndarray:
        check_request(req)
        bounds = mask_bounds(req.mask)
        out = req.image.copy()
        if bounds is None:
            return out
        h, w = out.shape[:2]
        side = max(bounds[2] - bounds[0], bounds[3] - bounds[1])
        pad = max(2 * self.config.radius, round(self.config.crop_padding * side))
        x0, y0, x1, y1 = padded_box(bounds, pad, h, w)
        crop, crop_mask = req.image[y0:y1, x0:x1], req.mask[y0:y1, x0:x1]
        long_side = max(x1 - x0, y1 - y0)
        max_side = self.config.max_side
        if max_side and long_side > max_side:
            scale = max_side / long_side
            size = (max(1, round((x1 - x0) * scale)), max(1, round((y1 - y0) * scale)))
            small = cv2.resize(crop, size, interpolation=cv2.INTER_AREA)
            small_mask = cv2.resize(crop_mask, size, interpolation=cv2.INTER_AREA)
            small_mask = np.where(small_mask > 0, 255, 0).astype(np.uint8)
            filled = cv2.inpaint(small, small_mask, self.config.radius, self.flag)
            filled = cv2.resize(filled, (x1 - x0, y1 - y0), interpolation=cv2.INTER_CUBIC)
        else:
            filled = cv2.inpaint(crop, crop_mask, self.config.radius, self.flag)
        paste(out[y0:y1, x0:x1], filled, crop_mask)
        return out


def _build(config: OpenCVConfig, **runtime: Any) -> OpenCVInpainter:
    return OpenCVInpainter(config)


ERASER = Eraser(
    name="opencv",
    config=OpenCVConfig,
    build=_build,
    summary="opencv (Telea, CPU)",
)
