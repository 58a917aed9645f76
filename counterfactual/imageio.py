"""Decode and encode pictures. Decoding is strict: every problem becomes a
:class:`SampleError` with a reason for the status record, never a crash.

Pictures may lie in a local folder or under a URL (``s3://bucket/images``, see
:mod:`counterfactual.fs`); a missing object is the same ``missing-file`` as a missing file."""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

import cv2
import numpy as np
from PIL import ExifTags, Image, PngImagePlugin, UnidentifiedImageError

from counterfactual import fs
from counterfactual.fs import safe_relative_path
from counterfactual.messages import one_line

try:  # LittleCMS bindings; a Pillow built without them decodes without colour management
    from PIL import ImageCms
except ImportError:  # pragma: no cover - depends on how Pillow was built
    ImageCms = None  # type: ignore[assignment]

DEFAULT_MAX_PIXELS = 100_000_000
_HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")


class SampleError(Exception):
    """A per-sample failure: ``reason`` is a short kebab-case code for the status record."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def resolve_inside(root: Path | str, relative: str) -> Path | str:
    """``root / relative``, refusing anything that resolves outside ``root`` (symlinks too:
    :func:`counterfactual.fs.inside`, the rule every reader applies to the files it opens).

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
    path = fs.inside(root, Path(fs.as_path(root)) / relative)
    if path is None:
        raise SampleError("unsafe-path", relative)
    return path


ORIENTATIONS = range(1, 9)
"""The EXIF orientation values; any other (or none) reads as 1, pixels as stored, as PIL's
``ImageOps.exif_transpose`` takes them."""
SWAPPING = frozenset({5, 6, 7, 8})
"""The orientations whose upright picture has the stored one's width and height swapped."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded picture: ``stored`` (H, W, 3) uint8 sRGB as the file stores its pixels, and
    its EXIF ``orientation`` (1..8; 1 when untagged), which says how to turn it upright."""

    stored: np.ndarray
    orientation: int = 1

    def upright(self) -> np.ndarray:
        """The pixels turned upright per the orientation: what ``ImageOps.exif_transpose``
        makes of the stored picture, as a contiguous array."""
        return _to_upright(self.stored, self.orientation)

    def frame(self, oriented: bool) -> np.ndarray:
        """The upright pixels (``oriented``) or the stored ones."""
        return self.upright() if oriented else self.stored


@dataclass(frozen=True, slots=True)
class Header:
    """What a picture's header says, pixels not decoded: the stored ``width`` and ``height``
    and the EXIF ``orientation`` (1..8, see :data:`ORIENTATIONS`)."""

    width: int
    height: int
    orientation: int = 1


def _to_upright(stored: np.ndarray, orientation: int) -> np.ndarray:
    """``stored`` turned upright per EXIF ``orientation`` (an exact permutation of pixels)."""
    a = stored
    if orientation == 2:
        a = a[:, ::-1]
    elif orientation == 3:
        a = a[::-1, ::-1]
    elif orientation == 4:
        a = a[::-1]
    elif orientation == 5:
        a = a.swapaxes(0, 1)
    elif orientation == 6:
        a = np.rot90(a, -1)
    elif orientation == 7:
        a = a[::-1, ::-1].swapaxes(0, 1)
    elif orientation == 8:
        a = np.rot90(a, 1)
    else:
        return stored
    return np.ascontiguousarray(a)


def _orientation(im: Image.Image) -> int:
    """``im``'s EXIF orientation as ``exif_transpose`` reads it (EXIF, else XMP), 1..8."""
    value = im.getexif().get(ExifTags.Base.Orientation, 1)
    return value if isinstance(value, int) and value in ORIENTATIONS else 1


def load_rgb(
    path: Path | str, max_pixels: int = DEFAULT_MAX_PIXELS, *, upright: bool = True
) -> np.ndarray:
    """The picture at ``path`` (a local path or a URL) as (H, W, 3) uint8 sRGB, turned upright
    per its EXIF orientation (``upright=False``: as stored), tones as in :func:`rgb8`.

    The first frame of an animation is used. Pictures of more than ``max_pixels`` pixels, and
    any that PIL's own decompression-bomb limit refuses (``PIL.Image.MAX_IMAGE_PIXELS`` x 2),
    are ``image-too-large`` before decoding (detail: the size, ``--max-pixels``, and PIL's
    limit when it is the one that refused). A missing file or object is ``missing-file``; an
    object that cannot be read is ``unreadable``, unless the store itself fails
    (:func:`~counterfactual.fs.store_error`: refused, throttled, down), which is raised as it
    is; a picture that cannot be decoded is ``decode-error``.
    """
    return load_picture(path, max_pixels).frame(upright)


def load_picture(path: Path | str, max_pixels: int = DEFAULT_MAX_PIXELS) -> Decoded:
    """:func:`load_rgb` as stored, with the EXIF orientation: both frames from one decode."""
    if fs.is_url(path):
        return _open(io.BytesIO(_read_url(path)), max_pixels, fs.name(path))
    path = Path(fs.as_path(path))
    if not path.is_file():
        raise SampleError("missing-file", str(path.name))
    return _open(path, max_pixels)


def _read_url(path: str) -> bytes:
    try:
        with fs.open_file(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError as err:
        raise SampleError("missing-file", fs.name(path)) from err
    except OSError as err:
        if fs.store_error(err) is not None:
            raise  # the store refuses or is down, not this picture: the run stops
        raise SampleError("unreadable", f"{fs.name(path)}: {err}") from err


def decode_rgb(
    data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS, *, upright: bool = True
) -> np.ndarray:
    """:func:`load_rgb` for an encoded picture in memory (a tar member, a Parquet cell)."""
    return decode_picture(data, max_pixels).frame(upright)


def decode_picture(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Decoded:
    """:func:`load_picture` for an encoded picture in memory."""
    return _open(io.BytesIO(data), max_pixels)


def read_header(source: Path | str | bytes) -> Header:
    """The stored size and EXIF orientation of a picture (a path, a URL or encoded bytes) from
    its header alone: no pixel is decoded, and of a file or object only the first blocks are
    read (a PNG whose EXIF chunk follows its pixel data reads as untagged here). A picture that
    cannot be opened is the :class:`SampleError` that :func:`load_rgb` would raise."""
    if isinstance(source, bytes):
        return _header(io.BytesIO(source))
    if not fs.is_url(source):
        path = Path(fs.as_path(source))
        if not path.is_file():
            raise SampleError("missing-file", path.name)
        return _header(path)
    try:
        with fs.open_file(source, "rb") as fh:
            return _header(fh)
    except FileNotFoundError as err:
        raise SampleError("missing-file", fs.name(source)) from err
    except OSError as err:
        raise SampleError("unreadable", f"{fs.name(source)}: {err}") from err


def _header(source: Path | BinaryIO) -> Header:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source) as im:
                untagged_png = isinstance(im, PngImagePlugin.PngImageFile) and (
                    "exif" not in im.info
                )
                orientation = 1 if untagged_png else _orientation(im)
                return Header(im.width, im.height, orientation)
    except UnidentifiedImageError as err:
        raise SampleError("decode-error", "not a picture format PIL reads") from err
    except Image.DecompressionBombError as err:
        raise SampleError("image-too-large", str(err)) from err
    except (OSError, ValueError, SyntaxError, EOFError) as err:
        raise SampleError("decode-error", f"{type(err).__name__}: {err}") from err


def _open(source: Path | BinaryIO, max_pixels: int, name: str = "") -> Decoded:
    try:
        with warnings.catch_warnings():
            # our max_pixels is the limit below PIL's hard one; PIL's warning is only noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(source) as im:
                if im.width * im.height > max_pixels:
                    raise SampleError("image-too-large", _too_large(im.size, max_pixels))
                im.load()
                orientation = _orientation(im)
                arr = np.asarray(rgb8(im))
    except SampleError:
        raise
    except UnidentifiedImageError as err:  # PIL's message holds the BytesIO's address
        name = source.name if isinstance(source, Path) else name
        where = f": {name}" if name else ""
        raise SampleError("decode-error", f"not a picture format PIL reads{where}") from err
    except Image.DecompressionBombError as err:
        raise SampleError("image-too-large", _bomb(err, max_pixels)) from err
    except (OSError, ValueError, SyntaxError, EOFError) as err:  # truncated or corrupt data
        raise SampleError("decode-error", f"{type(err).__name__}: {err}") from err
    if arr.size == 0:
        raise SampleError("decode-error", "empty image")
    return Decoded(arr, orientation)


def _too_large(size: tuple[int, int], max_pixels: int) -> str:
    """``image-too-large``'s detail: the picture's size and the run's limit."""
    width, height = size
    return f"{width}x{height} = {width * height} pixels, over --max-pixels {max_pixels}"


_PIL_BOMB = re.compile(r"\((\d+) pixels\) exceeds limit of (\d+) pixels")


def _bomb(err: Exception, max_pixels: int) -> str:
    """The detail of a picture PIL refused as a bomb before its size could be seen (over
    ``2 * PIL.Image.MAX_IMAGE_PIXELS``): its pixel count and the run's ``--max-pixels``, or
    PIL's limit when that is the lower one."""
    found = _PIL_BOMB.search(str(err))
    if found is None:
        return f"over PIL's own limit ({one_line(str(err))}), --max-pixels {max_pixels}"
    pixels, limit = int(found.group(1)), int(found.group(2))
    if pixels > max_pixels:
        return f"{pixels} pixels, over --max-pixels {max_pixels}"
    return (
        f"{pixels} pixels, within --max-pixels {max_pixels} but over PIL's own limit of {limit} "
        "(2 x PIL.Image.MAX_IMAGE_PIXELS)"
    )


def rgb8(im: Image.Image) -> Image.Image:
    """``im`` in 8-bit sRGB (mode ``RGB``) with its real tones.

    - 16-bit integers (``I;16*``, and ``I``, which PIL uses for 16-bit PGM/PPM and 32-bit
      TIFF) are taken as 0..65535 and keep their high byte (``>> 8``, as PIL reads a 48-bit
      RGB PNG); an ``I`` picture with values outside 0..65535 is a ``decode-error``.
    - Floats (``F``) are taken as 0..1 and scaled by 255, rounded; a float picture with values
      outside [0, 1] (or NaN) is a ``decode-error``, since its range is unknown.
    - Transparency (an alpha channel, a palette's alpha or a colour key) is composited over
      white; the colour key of a 16-bit picture is ignored.
    - An embedded ICC profile other than sRGB is converted to sRGB (LittleCMS, perceptual
      intent); a profile that cannot be read or does not fit the picture is ignored, as
      browsers do.
    - Everything else (grayscale, bilevel, palette, CMYK, YCbCr, HSV, LAB) is PIL's conversion.
    """
    icc = im.info.get("icc_profile")
    if im.mode in _HIGH_BIT_MODES:
        im = Image.fromarray(_gray8(np.asarray(im), im.mode), "L")
    elif im.has_transparency_data:
        im = _over_white(im.convert("RGBA"))
    elif im.mode not in ("L", "RGB", "CMYK"):  # the modes a colour transform takes
        im = im.convert("RGB")
    if icc and ImageCms is not None:
        im = _icc_to_srgb(im, icc)
    return im if im.mode == "RGB" else im.convert("RGB")


def _gray8(values: np.ndarray, mode: str) -> np.ndarray:
    """One channel of a high bit depth picture in 0..255 (see :func:`rgb8`)."""
    if values.size == 0:
        return values.astype(np.uint8)
    if mode == "F":
        if not (np.isfinite(values).all() and values.min() >= 0 and values.max() <= 1):
            low, high = np.nanmin(values), np.nanmax(values)
            raise SampleError(
                "decode-error", f"float picture with values {low:g}..{high:g} outside [0, 1]"
            )
        return np.rint(values * 255).astype(np.uint8)
    values = values.astype(np.int64)  # I;16B is big-endian, I is signed
    if values.min() < 0 or values.max() > 65535:
        raise SampleError(
            "decode-error",
            f"{mode} picture with values {values.min()}..{values.max()} outside 0..65535",
        )
    return (values >> 8).astype(np.uint8)


def _over_white(rgba: Image.Image) -> Image.Image:
    """An RGBA picture composited over white: ``rgb * a + 255 * (1 - a)``, rounded."""
    arr = np.asarray(rgba).astype(np.uint32)
    alpha = arr[..., 3:]
    rgb = (arr[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255
    return Image.fromarray(rgb.astype(np.uint8), "RGB")


def _icc_to_srgb(im: Image.Image, icc: bytes) -> Image.Image:
    """``im`` (L, RGB or CMYK) from its embedded profile to sRGB; unchanged for an sRGB
    profile, a damaged one, or one of another colour space than ``im``."""
    try:
        profile = ImageCms.ImageCmsProfile(io.BytesIO(icc))
        if ImageCms.getProfileDescription(profile).startswith("sRGB"):
            return im
        out = ImageCms.profileToProfile(im, profile, _srgb_profile(), outputMode="RGB")
    except (OSError, ImageCms.PyCMSError):
        return im
    assert out is not None
    return out


@lru_cache(maxsize=1)
def _srgb_profile() -> Any:
    return ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB"))


def encode_jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """JPEG bytes of an (H, W, 3) uint8 RGB array."""
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(image, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise SampleError("encode-error", f"cannot encode array of shape {image.shape}")
    return buf.tobytes()


def encode_png(mask: np.ndarray) -> bytes:
    """Lossless PNG bytes of an (H, W) uint8 array (a mask: 8-bit greyscale, 255 = repaint)."""
    if mask.ndim != 2 or mask.dtype != np.uint8:
        raise ValueError(f"a mask is an (H, W) uint8 array, got {mask.dtype} {mask.shape}")
    ok, buf = cv2.imencode(".png", mask)
    if not ok:
        raise SampleError("encode-error", f"cannot encode mask of shape {mask.shape}")
    return buf.tobytes()


def decode_jpeg(data: bytes) -> np.ndarray:
    """(H, W, 3) uint8 RGB from encoded bytes (for reading shards back)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))
