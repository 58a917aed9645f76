"""Input checks shared by the image backends."""

from __future__ import annotations

import cv2
import numpy as np

from counterfactual.image.base import EditRequest


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


def paste(dst: np.ndarray, src: np.ndarray, mask: np.ndarray, feather: int = 0) -> None:
    """Copy ``src`` into ``dst`` (same shape) where ``mask`` is non-zero, in place.

    ``feather > 0`` fades ``src`` into ``dst`` over the ``feather`` pixels outside the mask
    (:func:`feather_alpha`): masked pixels are ``src``'s, pixels farther than ``feather`` px from
    the mask keep ``dst``'s bytes, the band between is a blend that hides the seam."""
    if feather > 0:
        alpha = feather_alpha(mask, feather)
        band = (alpha > 0) & (alpha < 1)
        blend = alpha[band][:, None] * src[band] + (1 - alpha[band][:, None]) * dst[band]
        dst[band] = np.clip(np.round(blend), 0, 255).astype(np.uint8)
    out = cv2.copyTo(src, mask, dst)
    if out is not dst:  # OpenCV wrote to a new buffer (e.g. a non-contiguous view)
        dst[...] = out


def feather_alpha(mask: np.ndarray, feather: int) -> np.ndarray:
    """float32 weight of the fill per pixel: 1 on the mask (> 0), falling linearly with the
    Euclidean distance to it to ``1 / (feather + 1)`` at ``feather`` px, 0 beyond."""
    inside = mask > 0
    if not inside.any():
        return np.zeros(mask.shape, np.float32)
    distance = cv2.distanceTransform(
        np.where(inside, 0, 255).astype(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE
    )
    alpha = (feather + 1 - distance) / (feather + 1)
    return np.clip(alpha, 0.0, 1.0).astype(np.float32)
