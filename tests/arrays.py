"""Small image and mask arrays for the image-backend tests."""

import numpy as np


def random_image(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Seeded noise, ``(height, width, 3)`` uint8 RGB."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def rect_mask(height: int, width: int, y0: int, y1: int, x0: int, x1: int) -> np.ndarray:
    """A ``(height, width)`` uint8 mask, 255 on rows ``y0:y1`` and columns ``x0:x1``."""
    mask = np.zeros((height, width), np.uint8)
    mask[y0:y1, x0:x1] = 255
    return mask
