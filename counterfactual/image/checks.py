"""Input checks shared by the image backends."""

from __future__ import annotations

import cv2
import numpy as np

from counterfactual.image import EditRequest


def check_request(req: EditRequest) -> None:
    """Raise ``ValueError`` unless ``req.image`` is (H, W, 3) uint8 and ``req.mask`` (H, W) uint8."""
    image, mask = req.image, req.mask
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3:
        raise ValueError(f"image must be a uint8 (H, W, 3) array, got {_desc(image)}")
    if image.shape[2] != 3:
        raise ValueError(f"image must have 3 channels (RGB), got shape {image.shape}")
    if not isinstance(mask, np.ndarray) or mask.dtype != np.uint8 or mask.shape != image.shape[:2]:
        raise ValueError(f"mask must be a uint8 {image.shape[:2]} array, got {_desc(mask)}")


def _desc(a: object) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} array of shape {a.shape}"
    return type(a).__name__


def padded_box(
    bounds: tuple[int, int, int, int], pad: int, height: int, width: int
) -> tuple[int, int, int, int]:
    """``bounds`` grown by ``pad`` pixels on each side, clipped to the image."""
    x0, y0, x1, y1 = bounds
    return max(0, x0 - pad), max(0, y0 - pad), min(width, x1 + pad), min(height, y1 + pad)


def paste(dst: np.ndarray, src: np.ndarray, mask: np.ndarray) -> None:
    """Copy ``src`` into ``dst`` (same shape) where ``mask`` is non-zero, in place."""
    out = cv2.copyTo(src, mask, dst)
    if out is not dst:  # OpenCV wrote to a new buffer (e.g. a non-contiguous view)
        dst[...] = out
