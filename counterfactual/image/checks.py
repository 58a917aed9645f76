"""Input checks shared by the image backends."""

from __future__ import annotations

import cv2
import numpy as np

from counterfactual.image import EditRequest


def check_request(req: EditRequest) -> None:
    """Raise ``ValueError`` unless the image is (H, W, 3) uint8 and the mask (H, W) uint8."""
    image, mask = req.image, req.mask
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise ValueError(f"image must be a uint8 array, got {_kind(image)}")
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must have shape (H, W, 3), got {image.shape}")
    if not isinstance(mask, np.ndarray) or mask.dtype != np.uint8:
        raise ValueError(f"mask must be a uint8 array, got {_kind(mask)}")
    if mask.shape != image.shape[:2]:
        raise ValueError(
            f"mask must have shape {image.shape[:2]} (the image's H, W), got {mask.shape}"
        )


def _kind(a: object) -> str:
    return str(a.dtype) if isinstance(a, np.ndarray) else type(a).__name__


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
