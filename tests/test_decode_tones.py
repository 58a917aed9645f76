"""Every picture decodes with its real tones or fails with a reason (issue 13): each test writes a
file with known pixels, decodes it through ``load_rgb`` (or a run), and compares the tones."""

from __future__ import annotations

import io
import json
import struct
import warnings
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from bad_coco import synth_args
from PIL import Image, ImageCms

from counterfactual.cli import main
from counterfactual.imageio import SampleError, load_rgb
from counterfactual.readers.generate import generate_coco
from counterfactual.records import ImageRecord
from counterfactual.shards.frames import FrameRule
from counterfactual.shards.pictures import load_record_image
from counterfactual.shards.samples import iter_samples

H, W = 24, 40


def ramp16() -> np.ndarray:
    """(H, W) uint16 covering 0..65535, with low bytes that differ from the high ones."""
    return np.linspace(0, 65535, H * W).round().astype(np.uint16).reshape(H, W)


def gray(values: np.ndarray) -> np.ndarray:
    return np.repeat(values[..., None], 3, axis=2).astype(np.uint8)


def colours(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (H, W, 3), dtype=np.uint8)


# --- high bit depth -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["PNG", "TIFF"])
def test_16_bit_grayscale_keeps_its_high_byte(tmp_path: Path, fmt: str) -> None:
    values = ramp16()
    path = tmp_path / f"g16.{fmt.lower()}"
    Image.fromarray(values).save(path, fmt)
    assert Image.open(path).mode == "I;16"
    out = load_rgb(path)
    assert out.dtype == np.uint8 and out.shape == (H, W, 3)
    assert np.array_equal(out, gray(values >> 8))
    assert out.min() == 0 and out.max() == 255  # the full range, not clipped to white


def test_big_endian_16_bit(tmp_path: Path) -> None:
    values = ramp16()
    path = tmp_path / "g16b.tif"
    Image.frombytes("I;16B", (W, H), values.astype(">u2").tobytes()).save(path)
    assert Image.open(path).mode == "I;16B"
    assert np.array_equal(load_rgb(path), gray(values >> 8))


def test_16_bit_pgm_with_its_own_maxval(tmp_path: Path) -> None:
    # PIL opens a PGM with maxval 1000 as mode I scaled to 0..65535: 500 of 1000 is mid-gray
    path = tmp_path / "g.pgm"
    path.write_bytes(b"P5\n4 1\n1000\n" + np.array([0, 250, 500, 1000], ">u2").tobytes())
    assert Image.open(path).mode == "I"
    assert load_rgb(path)[0, :, 0].tolist() == [0, 64, 128, 255]


def test_32_bit_integers_in_16_bit_range_and_out_of_it(tmp_path: Path) -> None:
    values = ramp16().astype(np.int32)
    Image.fromarray(values).save(tmp_path / "i32.tif")
    assert Image.open(tmp_path / "i32.tif").mode == "I"
    assert np.array_equal(load_rgb(tmp_path / "i32.tif"), gray(values >> 8))
    values[1, 1] = 70000
    Image.fromarray(values).save(tmp_path / "wide.tif")
    with pytest.raises(SampleError) as err:
        load_rgb(tmp_path / "wide.tif")
    assert err.value.reason == "decode-error" and "0..70000 outside 0..65535" in err.value.detail


@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_16_bit_rgb(tmp_path: Path, suffix: str) -> None:
    r = ramp16()
    rgb16 = np.stack([r, 65535 - r, (r // 3) | 0x00FF], axis=-1)
    path = tmp_path / f"rgb16{suffix}"
    cv2.imwrite(str(path), rgb16[..., ::-1])  # OpenCV writes BGR
    assert np.array_equal(load_rgb(path), (rgb16 >> 8).astype(np.uint8))


def test_16_bit_rgba_png_is_composited_over_white(tmp_path: Path) -> None:
    r = ramp16()
    alpha = np.zeros_like(r)
    alpha[:, W // 2 :] = 65535  # left half transparent, right half opaque
    rgba16 = np.stack([r, 65535 - r, r // 2, alpha], axis=-1)
    cv2.imwrite(str(tmp_path / "rgba16.png"), rgba16[..., [2, 1, 0, 3]])
    out = load_rgb(tmp_path / "rgba16.png")
    assert (out[:, : W // 2] == 255).all()
    assert np.array_equal(out[:, W // 2 :], (rgba16[:, W // 2 :, :3] >> 8).astype(np.uint8))


def test_float_tiff_in_unit_range_is_scaled_by_255(tmp_path: Path) -> None:
    values = np.linspace(0, 1, H * W, dtype=np.float32).reshape(H, W)
    Image.fromarray(values).save(tmp_path / "f.tif")
    assert Image.open(tmp_path / "f.tif").mode == "F"
    assert np.array_equal(load_rgb(tmp_path / "f.tif"), gray(np.rint(values * 255)))


@pytest.mark.parametrize(
    ("bad", "detail"), [(2.5, "0..2.5 outside [0, 1]"), (-0.5, "-0.5..1 outside"), (np.nan, "")]
)
def test_float_tiff_outside_unit_range_is_a_decode_error(
    tmp_path: Path, bad: float, detail: str
) -> None:
    values = np.linspace(0, 1, H * W, dtype=np.float32).reshape(H, W)
    values[3, 3] = bad
    Image.fromarray(values).save(tmp_path / "f.tif")
    with pytest.raises(SampleError) as err:
        load_rgb(tmp_path / "f.tif")
    assert err.value.reason == "decode-error" and "float picture" in err.value.detail
    assert detail in err.value.detail


# --- transparency, palettes, animation ------------------------------------------------------


def palette_picture() -> tuple[Image.Image, np.ndarray]:
    """A palette picture of indices 0..7 and its palette (8 RGB colours); index 0 is the one
    the tests make transparent."""
    palette = np.random.default_rng(3).integers(0, 256, (8, 3), dtype=np.uint8)
    index = (np.arange(H * W) % 8).reshape(H, W).astype(np.uint8)
    im = Image.fromarray(index, "P")
    im.putpalette(palette.ravel().tolist())
    return im, palette


def test_palette_png_with_transparency(tmp_path: Path) -> None:
    im, palette = palette_picture()
    im.save(tmp_path / "p.png", transparency=0)
    index = np.asarray(im)
    out = load_rgb(tmp_path / "p.png")
    assert (out[index == 0] == 255).all()  # transparent: the white background
    assert np.array_equal(out[index > 0], palette[index[index > 0]])  # opaque: the palette


def test_palette_png_with_partial_alpha_per_entry(tmp_path: Path) -> None:
    im, palette = palette_picture()
    im.save(tmp_path / "pa.png", transparency=bytes([0, 128] + [255] * 6))
    index = np.asarray(im)
    out = load_rgb(tmp_path / "pa.png").astype(int)
    half = (palette[1].astype(int) * 128 + 255 * 127 + 127) // 255
    assert (out[index == 1] == half).all()
    assert np.array_equal(out[index > 1], palette[index[index > 1]])


@pytest.mark.parametrize("mode", ["RGBA", "LA"])
def test_alpha_is_composited_over_white(tmp_path: Path, mode: str) -> None:
    rgb = colours() if mode == "RGBA" else gray(colours()[..., 0])
    alpha = np.random.default_rng(1).integers(0, 256, (H, W), dtype=np.uint8)
    alpha[0, 0], alpha[0, 1] = 0, 255
    channels = rgb if mode == "RGBA" else rgb[..., :1]
    Image.fromarray(np.dstack([channels, alpha]), mode).save(tmp_path / "a.png")
    out = load_rgb(tmp_path / "a.png").astype(int)
    a = alpha[..., None].astype(int)
    assert np.array_equal(out, (rgb.astype(int) * a + 255 * (255 - a) + 127) // 255)
    assert (out[0, 0] == 255).all() and np.array_equal(out[0, 1], rgb[0, 1])


def test_rgb_png_with_a_colour_key(tmp_path: Path) -> None:
    rgb = colours()
    rgb[:4, :4] = (10, 20, 30)
    Image.fromarray(rgb).save(tmp_path / "key.png", transparency=(10, 20, 30))
    out = load_rgb(tmp_path / "key.png")
    keyed = (rgb == (10, 20, 30)).all(axis=-1)
    assert (out[keyed] == 255).all() and np.array_equal(out[~keyed], rgb[~keyed])


def test_animated_gif_gives_its_first_frame(tmp_path: Path) -> None:
    first, palette = palette_picture()
    later = [Image.fromarray((np.asarray(first) + k) % 8, "P") for k in (3, 5)]
    for frame in later:
        frame.putpalette(palette.ravel().tolist())
    first.save(tmp_path / "a.gif", save_all=True, append_images=later, duration=50, loop=0)
    assert Image.open(tmp_path / "a.gif").n_frames == 3
    assert np.array_equal(load_rgb(tmp_path / "a.gif"), palette[np.asarray(first)])


def test_animated_webp_gives_its_first_frame(tmp_path: Path) -> None:
    frames = [Image.fromarray(colours(seed)) for seed in range(3)]
    frames[0].save(tmp_path / "a.webp", save_all=True, append_images=frames[1:], lossless=True)
    assert Image.open(tmp_path / "a.webp").n_frames == 3
    assert np.array_equal(load_rgb(tmp_path / "a.webp"), colours(0))


# --- JPEG ----------------------------------------------------------------------------------


def smooth() -> np.ndarray:
    """A smooth colour picture that JPEG keeps within a few levels."""
    y, x = np.mgrid[0:64, 0:96]
    return np.stack([x * 2 + 30, y * 2 + 40, 200 - x - y], axis=-1).astype(np.uint8)


def test_progressive_jpeg(tmp_path: Path) -> None:
    Image.fromarray(smooth()).save(tmp_path / "p.jpg", quality=95, progressive=True)
    assert Image.open(tmp_path / "p.jpg").info.get("progressive")
    diff = np.abs(load_rgb(tmp_path / "p.jpg").astype(int) - smooth())
    assert diff.mean() < 1.5 and diff.max() <= 8


def test_cmyk_jpeg(tmp_path: Path) -> None:
    Image.fromarray(smooth()).convert("CMYK").save(tmp_path / "c.jpg", quality=95)
    assert Image.open(tmp_path / "c.jpg").mode == "CMYK"
    diff = np.abs(load_rgb(tmp_path / "c.jpg").astype(int) - smooth())
    assert diff.mean() < 2 and diff.max() <= 12


# --- ICC profiles ---------------------------------------------------------------------------


def _s15(v: float) -> bytes:
    return struct.pack(">i", round(v * 65536))


def linear_srgb_icc() -> bytes:
    """An ICC v2 display profile with sRGB's primaries (D50-adapted) and a linear tone curve:
    stored values are linear light, so sRGB tones are ``srgb_encode(v / 255)``."""
    xyz = lambda x, y, z: b"XYZ \0\0\0\0" + _s15(x) + _s15(y) + _s15(z)  # noqa: E731
    name = b"linear sRGB primaries\0"
    desc = b"desc\0\0\0\0" + struct.pack(">I", len(name)) + name + bytes(4 + 4 + 2 + 1 + 67)
    curve = b"curv\0\0\0\0" + struct.pack(">IH", 1, 0x0100) + b"\0\0"  # gamma 1.0
    tags = [
        (b"desc", desc),
        (b"wtpt", xyz(0.9642, 1.0, 0.8249)),
        (b"rXYZ", xyz(0.4361, 0.2225, 0.0139)),
        (b"gXYZ", xyz(0.3851, 0.7169, 0.0971)),
        (b"bXYZ", xyz(0.1431, 0.0606, 0.7141)),
        (b"rTRC", curve),
        (b"gTRC", curve),
        (b"bTRC", curve),
    ]
    offset = 128 + 4 + 12 * len(tags)
    table, data = struct.pack(">I", len(tags)), b""
    for sig, body in tags:
        body += bytes(-len(body) % 4)
        table += sig + struct.pack(">II", offset + len(data), len(body))
        data += body
    size = offset + len(data)
    header = (
        struct.pack(">I", size)
        + b"lcms"
        + struct.pack(">I", 0x02100000)
        + b"mntrRGB XYZ "
        + bytes(12)
        + b"acsp"
        + bytes(24)
        + struct.pack(">I", 0)
        + _s15(0.9642)
        + _s15(1.0)
        + _s15(0.8249)
        + bytes(48)
    )
    assert len(header) == 128
    return header + table + data


def srgb_encode(linear: np.ndarray) -> np.ndarray:
    v = np.where(linear <= 0.0031308, 12.92 * linear, 1.055 * linear ** (1 / 2.4) - 0.055)
    return v * 255


def test_srgb_profile_leaves_tones_unchanged(tmp_path: Path) -> None:
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    Image.fromarray(colours()).save(tmp_path / "s.png", icc_profile=srgb)
    assert Image.open(tmp_path / "s.png").info["icc_profile"]
    assert np.array_equal(load_rgb(tmp_path / "s.png"), colours())


@pytest.mark.parametrize("fmt", ["png", "jpg", "tiff", "webp"])
def test_non_srgb_profile_is_converted_to_srgb(tmp_path: Path, fmt: str) -> None:
    stored = smooth() if fmt == "jpg" else colours()
    extra = {"quality": 95} if fmt == "jpg" else {"lossless": True} if fmt == "webp" else {}
    path = tmp_path / f"linear.{fmt}"
    Image.fromarray(stored).save(path, icc_profile=linear_srgb_icc(), **extra)
    assert Image.open(path).info["icc_profile"] == linear_srgb_icc()
    out = load_rgb(path).astype(float)
    expected = srgb_encode(stored / 255)
    tolerance = 6 if fmt == "jpg" else 2  # JPEG's loss is amplified in the dark tones
    assert np.abs(out - expected).max() <= tolerance
    mid = (stored > 20) & (stored < 235)
    assert (out[mid] > stored[mid]).all()  # linear light reads brighter in sRGB


def test_unusable_profiles_are_ignored(tmp_path: Path) -> None:
    Image.fromarray(colours()).save(tmp_path / "bad.png", icc_profile=b"not a profile" * 20)
    assert np.array_equal(load_rgb(tmp_path / "bad.png"), colours())
    # an RGB profile on a grayscale picture does not fit it: the gray levels stay
    Image.fromarray(colours()[..., 0]).save(tmp_path / "l.png", icc_profile=linear_srgb_icc())
    assert np.array_equal(load_rgb(tmp_path / "l.png"), gray(colours()[..., 0]))


def test_lab_tiff_is_converted_to_srgb(tmp_path: Path) -> None:
    lab = np.zeros((H, W, 3), np.uint8)  # PIL's LAB holds a* and b* as signed bytes
    lab[..., 0] = 128  # L* = 50.2, a* = b* = 0: a neutral mid-gray
    lab[:, W // 2 :, 0] = 255  # L* = 100: white
    lab[:4, :4, 1:] = 128  # a* = b* = -128: far outside sRGB, clipped to (0, 165, 255)
    Image.fromarray(lab, "LAB").save(tmp_path / "lab.tif")
    out = load_rgb(tmp_path / "lab.tif").astype(int)
    assert np.abs(out[:4, :4] - (0, 165, 255)).max() <= 1
    out[:4, :4] = 119
    assert np.abs(out[:, : W // 2] - 119).max() <= 1
    assert np.abs(out[:, W // 2 :] - 255).max() <= 1


# --- EXIF orientation -----------------------------------------------------------------------

# the transpose that turns the upright picture into the stored one, for EXIF orientation 1..8
TO_STORED = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def save_oriented(path: Path, upright: np.ndarray, orientation: int) -> np.ndarray:
    """Save ``upright`` stored per EXIF ``orientation``; returns the stored pixels."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    im = Image.fromarray(upright)
    method = TO_STORED[orientation]
    stored = im if method is None else im.transpose(method)
    stored.save(path, exif=exif)
    return np.asarray(stored)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation_comes_out_upright(tmp_path: Path, orientation: int) -> None:
    path = tmp_path / "o.png"
    stored = save_oriented(path, colours(), orientation)
    assert np.array_equal(load_rgb(path), colours())
    assert np.array_equal(load_rgb(path, upright=False), stored)


def record(path: Path, width: int, height: int) -> ImageRecord:
    return ImageRecord("1", path.name, width, height, (), (), root=path.parent)


@pytest.mark.parametrize("orientation", [5, 6, 7, 8])
def test_declared_size_picks_the_frame_of_a_rotated_picture(
    tmp_path: Path, orientation: int
) -> None:
    path = tmp_path / "r.png"
    stored = save_oriented(path, colours(), orientation)
    assert stored.shape[:2] == (W, H)
    # declared as displayed (COCO): upright; as stored (a tool that ignores EXIF): as stored
    assert np.array_equal(load_record_image(record(path, W, H), 10**6), colours())
    assert np.array_equal(load_record_image(record(path, H, W), 10**6), stored)
    # at another scale the aspect ratio picks the frame the same way
    assert np.array_equal(load_record_image(record(path, 2 * H, 2 * W), 10**6), stored)
    assert np.array_equal(load_record_image(record(path, 2 * W, 2 * H), 10**6), colours())
    with pytest.raises(SampleError) as err:
        load_record_image(record(path, W, W), 10**6)
    assert (err.value.reason, err.value.detail) == (
        "size-mismatch",
        f"annotated {W}x{W}, decoded {W}x{H}",
    )


def test_transposed_size_without_exif_is_still_a_mismatch(tmp_path: Path) -> None:
    Image.fromarray(colours()).save(tmp_path / "plain.png")
    assert load_record_image(record(tmp_path / "plain.png", W, H), 10**6).shape == (H, W, 3)
    with pytest.raises(SampleError) as err:
        load_record_image(record(tmp_path / "plain.png", H, W), 10**6)
    assert err.value.reason == "size-mismatch"


def test_square_rotated_picture_follows_the_frame_rule(tmp_path: Path) -> None:
    """A square picture's size cannot tell the frame: the run's rule does (default stored)."""
    upright = colours()[:, :H]
    stored = save_oriented(tmp_path / "sq.png", upright, 6)
    square = record(tmp_path / "sq.png", H, H)
    assert np.array_equal(load_record_image(square, 10**6), stored)
    assert np.array_equal(load_record_image(square, 10**6, FrameRule("oriented")), upright)


# --- decompression bombs --------------------------------------------------------------------


def png_claiming(path: Path, width: int, height: int) -> None:
    """A small grayscale PNG whose header claims ``width`` x ``height`` (CRC fixed)."""
    Image.new("L", (8, 8), 7).save(path)
    data = bytearray(path.read_bytes())
    start = data.index(b"IHDR")
    data[start + 4 : start + 12] = struct.pack(">II", width, height)
    crc = zlib.crc32(bytes(data[start : start + 17]))
    data[start + 17 : start + 21] = struct.pack(">I", crc)
    path.write_bytes(bytes(data))


def test_bomb_past_pil_hard_limit_is_image_too_large(tmp_path: Path) -> None:
    png_claiming(tmp_path / "bomb.png", 20_000, 10_000)  # 2e8 pixels: PIL's own error
    with pytest.raises(SampleError) as err:
        load_rgb(tmp_path / "bomb.png", max_pixels=10**12)
    assert err.value.reason == "image-too-large"
    assert err.value.detail == (
        "200000000 pixels, within --max-pixels 1000000000000 but over PIL's own limit of "
        f"{2 * Image.MAX_IMAGE_PIXELS} (2 x PIL.Image.MAX_IMAGE_PIXELS)"
    )
    with pytest.raises(SampleError) as err:  # PIL refuses it first, the run's limit is named
        load_rgb(tmp_path / "bomb.png", max_pixels=50_000_000)
    assert err.value.detail == "200000000 pixels, over --max-pixels 50000000"


def test_bomb_in_pil_warning_range_follows_max_pixels(tmp_path: Path) -> None:
    png_claiming(tmp_path / "bomb.png", 10_000, 9_000)  # 9e7 pixels: PIL only warns
    with pytest.raises(SampleError) as err:
        load_rgb(tmp_path / "bomb.png", max_pixels=50_000_000)
    detail = "10000x9000 = 90000000 pixels, over --max-pixels 50000000"
    assert (err.value.reason, err.value.detail) == ("image-too-large", detail)
    # within max_pixels the warning neither refuses the picture nor leaks: its data is cut
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(SampleError) as err:
            load_rgb(tmp_path / "bomb.png", max_pixels=100_000_000)
    assert err.value.reason == "decode-error"
    assert not [w for w in caught if issubclass(w.category, Image.DecompressionBombWarning)]


# --- end to end -----------------------------------------------------------------------------


def test_16_bit_png_and_stored_frame_through_a_run(tmp_path: Path) -> None:
    """A 16-bit PNG, and a rotated PNG annotated at its stored size, through `counterfactual
    synth`: both written, keeping their tones outside the erased boxes."""
    width, height = 128, 96
    files = generate_coco(tmp_path / "coco", 2, seed=1, size=(width, height))
    inst = json.loads(files.instances.read_text())
    boxes = [(1, [0, 0, 24, 24]), (18, [100, 70, 24, 24])]  # a person and a dog, in corners
    inst["annotations"] = [
        {"id": 10 * i + j, "image_id": i, "category_id": cat, "bbox": bbox, "iscrowd": 0}
        for i in (1, 2)
        for j, (cat, bbox) in enumerate(boxes)
    ]
    caps = json.loads(files.captions.read_text())
    for cap in caps["annotations"]:
        cap["caption"] = "A person next to a dog on a street."
    y, x = np.mgrid[0:height, 0:width]
    deep = (x * 380 + y * 150 + 3000).astype(np.uint16)  # 8-bit tones 11..255, smooth
    sideways = cv2.resize(smooth(), (width, height))  # stored as annotated; upright it is tall
    for im in inst["images"]:
        (files.images / im["file_name"]).unlink()
        im["file_name"] = f"{im['id']}.png"
    Image.fromarray(deep).save(files.images / "1.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(sideways).save(files.images / "2.png", exif=exif)
    files.instances.write_text(json.dumps(inst))
    files.captions.write_text(json.dumps(caps))
    out = tmp_path / "out"
    argv = synth_args(files, out, "--runner", "local", "--image-method", "zero")
    assert main(argv) == 0
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert {r["image_id"] for r in rows if r["status"] == "written"} == {"1", "2"}, rows
    source = {"1": gray(deep >> 8), "2": sideways}
    for row in iter_samples(out):
        assert row.jpg is not None
        image = np.asarray(Image.open(io.BytesIO(row.jpg)).convert("RGB"))
        assert image.shape == (height, width, 3)
        keep = np.ones((height, width), bool)
        for bx, by, bw, bh in row.meta.mask_boxes:  # erased, with a margin for JPEG ringing
            x0, y0 = max(0, int(bx) - 8), max(0, int(by) - 8)
            keep[y0 : int(by + bh) + 8, x0 : int(bx + bw) + 8] = False
        assert keep.mean() > 0.7
        diff = np.abs(image.astype(int) - source[row.meta.image_id])[keep]
        assert diff.mean() < 2 and diff.max() <= 12, row.key
        assert image[keep].mean() < 200  # not the all-white picture of clipped 16-bit values
