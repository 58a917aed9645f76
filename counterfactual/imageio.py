"""Decode and encode pictures. Decoding is strict: every problem becomes a
:class:`SampleError` with a reason for the status record, never a crash.

Pictures may lie in a local folder or under a URL (``s3://bucket/images``, see
:mod:`counterfactual.fs`); a missing object is the same ``missing-file`` as a missing file."""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import BinaryIO

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from counterfactual import fs
from counterfactual.readers import safe_relative_path

DEFAULT_MAX_PIXELS = 100_000_000


class SampleError(Exception):
    """A per-sample failure: ``reason`` is a short kebab-case code for the status record."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def resolve_inside(root: Path | str, relative: str) -> Path | str:
    """``root / relative``, refusing anything that resolves outside ``root`` (symlinks too).

    For a URL ``root`` (``s3://bucket/images``) the result is the URL ``root/relative``; an
    object store has no symlinks, so ``relative`` is only checked to be a plain relative path
    (not absolute, no ``..``, no drive or scheme).
    """
    if fs.is_url(root):
        safe = safe_relative_path(relative)
        if safe is None or safe in (".", ""):
            raise SampleError("unsafe-path", relative)
        joined = fs.join(root, safe)
        assert isinstance(joined, str)
        return joined
    base = Path(fs.as_path(root)).resolve()
    path = (base / relative).resolve()
    if base != path and base not in path.parents:
        raise SampleError("unsafe-path", relative)
    return path


def load_rgb(path: Path | str, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """The picture at ``path`` (a local path or a URL) as (H, W, 3) uint8 RGB, upright per its
    EXIF orientation.

    Grayscale, palette, CMYK and alpha images are converted to RGB. Pictures of more than
    ``max_pixels`` pixels are refused before decoding (decompression bombs). A missing file or
    object is ``missing-file``; an object that cannot be read is ``unreadable``.
    """
    if fs.is_url(path):
        try:
            with fs.open_file(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError as err:
            raise SampleError("missing-file", fs.name(path)) from err
        except OSError as err:
            raise SampleError("unreadable", f"{fs.name(path)}: {err}") from err
        return _open_rgb(io.BytesIO(data), max_pixels, fs.name(path))
    path = Path(fs.as_path(path))
    if not path.is_file():
        raise SampleError("missing-file", str(path.name))
    return _open_rgb(path, max_pixels)


def decode_rgb(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """:func:`load_rgb` for an encoded picture in memory (a shard's ``jpg``)."""
    return _open_rgb(io.BytesIO(data), max_pixels)


def _open_rgb(source: Path | BinaryIO, max_pixels: int, name: str = "") -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as im:
                if im.width * im.height > max_pixels:
                    raise SampleError("image-too-large", f"{im.width}x{im.height}")
                im.load()
                upright = ImageOps.exif_transpose(im)
                rgb = upright.convert("RGB")
    except SampleError:
        raise
    except UnidentifiedImageError as err:  # PIL's message holds the BytesIO's address
        name = source.name if isinstance(source, Path) else name
        where = f": {name}" if name else ""
        raise SampleError("decode-error", f"not a picture format PIL reads{where}") from err
    except Image.DecompressionBombError as err:
        raise SampleError("decode-error", str(err)) from err
    except Image.DecompressionBombWarning as err:
        raise SampleError("image-too-large", str(err)) from err
    except (OSError, ValueError, SyntaxError, EOFError) as err:  # truncated or corrupt data
        raise SampleError("decode-error", f"{type(err).__name__}: {err}") from err
    arr = np.asarray(rgb)
    if arr.size == 0:
        raise SampleError("decode-error", "empty image")
    return arr


def encode_jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """JPEG bytes of an (H, W, 3) uint8 RGB array."""
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise SampleError("encode-error", f"cannot encode array of shape {image.shape}")
    return buf.tobytes()


def decode_jpeg(data: bytes) -> np.ndarray:
    """(H, W, 3) uint8 RGB from encoded bytes (for reading shards back)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))
