"""The LaMa backend, run on a tiny TorchScript model with LaMa's interface saved and reloaded
through the real loading code."""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from arrays import random_image, rect_mask

torch = pytest.importorskip("torch")

from bad_coco import make_bad_coco, synth_args  # noqa: E402
from tiny_lama import WrongShape, build_tiny_lama  # noqa: E402

from counterfactual.cli import build_parser, main  # noqa: E402
from counterfactual.image import (  # noqa: E402
    INPAINT_BACKENDS,
    EditRequest,
    ImageConfig,
    LamaConfig,
    make_editor,
)
from counterfactual.image.lama import MIN_CROP, LamaInpainter  # noqa: E402


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_lama(tmp_path_factory.mktemp("lama") / "tiny-lama.pt")


def _config(model: Path | str, **overrides: object) -> ImageConfig:
    lama = LamaConfig(model=str(model), **overrides)  # type: ignore[arg-type]
    return ImageConfig(method="inpaint", backend="lama", lama=lama)


@pytest.fixture(scope="module")
def editor(model_path: Path) -> LamaInpainter:
    built = make_editor(_config(model_path))
    assert isinstance(built, LamaInpainter)
    return built


_image, _mask = random_image, rect_mask


class _Counting:
    """Wraps the scripted model and records the shape of each image batch it receives."""

    def __init__(self, model: object) -> None:
        self.model = model
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        self.calls.append(tuple(image.shape))
        return self.model(image, mask)  # type: ignore[operator]


def test_describe(editor: LamaInpainter, model_path: Path) -> None:
    info = editor.describe()
    assert (info["method"], info["backend"], info["model"]) == ("inpaint", "lama", str(model_path))
    assert len(info["model_sha256"]) == 64
    assert (info["min_crop"], info["max_side"], info["dtype"]) == (MIN_CROP, 0, "float32")
    json.dumps(info)  # goes into every sample's metadata


@pytest.mark.parametrize(
    ("height", "width", "y0", "y1", "x0", "x1"),
    [
        (61, 83, 20, 36, 24, 40),  # odd sizes, in the middle
        (61, 83, 0, 12, 0, 20),  # touching the top-left corner
        (61, 83, 40, 61, 70, 83),  # touching the bottom and right borders
        (61, 83, 0, 61, 30, 31),  # a one-pixel-wide line through the whole height
        (300, 517, 250, 300, 480, 517),  # a crop smaller than the image, at the corner
        (300, 517, 101, 130, 200, 263),  # a crop in the middle of a large image
        (7, 5, 2, 4, 1, 3),  # smaller than one padded block
    ],
    ids=["middle", "top-left", "bottom-right", "thin-line", "big-corner", "big-middle", "tiny"],
)
def test_only_masked_pixels_change(
    editor: LamaInpainter, height: int, width: int, y0: int, y1: int, x0: int, x1: int
) -> None:
    image = _image(height, width)
    mask = _mask(height, width, y0, y1, x0, x1)
    (out,) = editor([EditRequest(image=image, mask=mask)])
    assert out.dtype == np.uint8 and out.shape == image.shape
    outside = mask == 0
    np.testing.assert_array_equal(out[outside], image[outside])
    assert np.any(out[~outside] != image[~outside])


def test_crops_are_padded_to_multiples_of_8_at_native_size(
    model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    editor = make_editor(_config(model_path, work_side=0))  # no canvases: the native sizes
    counting = _Counting(editor._model)  # type: ignore[attr-defined]
    monkeypatch.setattr(editor, "_model", counting)
    # a 50x40 box grows to a MIN_CROP square; the 300-high image clips it to 300 x 256
    editor([EditRequest(image=_image(300, 517), mask=_mask(300, 517, 100, 150, 200, 240))])
    # the whole 61x83 image is the crop, padded to 64x88
    editor([EditRequest(image=_image(61, 83), mask=_mask(61, 83, 20, 36, 24, 40))])
    assert counting.calls == [(1, 3, 256, 256), (1, 3, 64, 88)]


def test_max_side_scales_the_crop_down_and_back(model_path: Path) -> None:
    capped = make_editor(_config(model_path, max_side=100, work_side=0))
    counting = _Counting(capped._model)  # type: ignore[attr-defined]
    capped._model = counting  # type: ignore[attr-defined]
    image = _image(300, 400)
    mask = _mask(300, 400, 60, 240, 100, 260)
    (out,) = capped([EditRequest(image=image, mask=mask)])
    assert counting.calls == [(1, 3, 104, 104)]  # 300 -> 100 -> padded to 104
    assert capped.describe()["max_side"] == 100
    np.testing.assert_array_equal(out[mask == 0], image[mask == 0])
    assert np.any(out[mask > 0] != image[mask > 0])


def test_any_nonzero_mask_value_means_repaint(editor: LamaInpainter) -> None:
    image = _image(40, 40)
    mask = _mask(40, 40, 10, 20, 10, 20) // 255  # values 0 and 1
    mask[30, 30] = 7
    (out,) = editor([EditRequest(image=image, mask=mask)])
    (same,) = editor([EditRequest(image=image, mask=np.where(mask > 0, 255, 0).astype(np.uint8))])
    np.testing.assert_array_equal(out, same)
    np.testing.assert_array_equal(out[mask == 0], image[mask == 0])


def test_empty_mask_and_empty_batch(editor: LamaInpainter) -> None:
    image = _image(24, 40)
    (out,) = editor([EditRequest(image=image, mask=np.zeros((24, 40), np.uint8))])
    np.testing.assert_array_equal(out, image)
    assert out is not image
    assert editor([]) == []


def test_deterministic_and_seed_free(editor: LamaInpainter, model_path: Path) -> None:
    image = _image(90, 70, seed=3)
    mask = _mask(90, 70, 10, 50, 12, 44)
    first, again, other_seed = editor(
        [
            EditRequest(image=image, mask=mask, seed=7),
            EditRequest(image=image, mask=mask, seed=7),
            EditRequest(image=image, mask=mask, seed=8),
        ]
    )
    (reloaded,) = make_editor(_config(model_path))([EditRequest(image=image, mask=mask)])
    for out in (again, other_seed, reloaded):
        np.testing.assert_array_equal(out, first)


def test_batch_equals_one_by_one(model_path: Path, editor: LamaInpainter) -> None:
    batched = make_editor(_config(model_path, work_side=0), batch_size=2)
    counting = _Counting(batched._model)  # type: ignore[attr-defined]
    batched._model = counting  # type: ignore[attr-defined]
    requests = [
        EditRequest(image=_image(61, 83, 1), mask=_mask(61, 83, 10, 30, 10, 30)),
        EditRequest(image=_image(40, 100, 4), mask=_mask(40, 100, 0, 40, 45, 55)),
        EditRequest(image=_image(60, 81, 2), mask=_mask(60, 81, 40, 60, 20, 50)),  # pads to 64x88
        EditRequest(image=_image(32, 32, 3), mask=np.zeros((32, 32), np.uint8)),
        EditRequest(image=_image(64, 88, 5), mask=_mask(64, 88, 0, 5, 0, 88)),
    ]
    outputs = batched(requests)
    assert counting.calls == [(2, 3, 64, 88), (1, 3, 64, 88), (1, 3, 40, 104)]
    native = make_editor(_config(model_path, work_side=0))
    one_by_one = [native([request])[0] for request in requests]
    for request, single, out in zip(requests, one_by_one, outputs, strict=True):
        assert out.shape == request.image.shape
        outside = request.mask == 0
        np.testing.assert_array_equal(out[outside], request.image[outside])
        # float noise between batch sizes moves a value by one step at most
        assert np.abs(single.astype(int) - out.astype(int)).max() <= 1


def test_grayscale_content_stays_uint8_rgb(editor: LamaInpainter) -> None:
    gray = np.random.default_rng(5).integers(0, 256, (50, 70), dtype=np.uint8)
    image = np.repeat(gray[..., None], 3, axis=2)
    mask = _mask(50, 70, 15, 35, 20, 50)
    (out,) = editor([EditRequest(image=image, mask=mask)])
    assert out.dtype == np.uint8 and out.shape == (50, 70, 3)
    np.testing.assert_array_equal(out[mask == 0], image[mask == 0])
    assert np.any(out[mask > 0] != image[mask > 0])


@pytest.mark.parametrize(
    ("image", "mask", "match"),
    [
        (_image(16, 16), np.zeros((16, 15), np.uint8), "mask must have shape"),
        (_image(16, 16), np.zeros((16, 16), bool), "mask must be a uint8"),
        (_image(16, 16).astype(np.float32), np.zeros((16, 16), np.uint8), "image must be a uint8"),
        (_image(16, 16)[..., :1], np.zeros((16, 16), np.uint8), "image must have shape"),
    ],
    ids=["mask-width", "mask-bool", "image-float", "image-gray"],
)
def test_bad_inputs_are_value_errors(
    editor: LamaInpainter, image: np.ndarray, mask: np.ndarray, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        editor([EditRequest(image=image, mask=mask)])


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no-such\.pt.*does not exist.*big-lama\.pt"):
        make_editor(_config(tmp_path / "no-such.pt"))
    with pytest.raises(ValueError, match="is a folder"):
        make_editor(_config(tmp_path))


@pytest.mark.parametrize(
    "model", ["smartywu/big-lama", "stabilityai/stable-diffusion-2-inpainting"]
)
def test_hub_id_is_a_clear_error(model: str) -> None:
    with pytest.raises(ValueError, match="hub id.*not supported.*download"):
        make_editor(_config(model))


def test_not_torchscript_is_a_clear_error(tmp_path: Path) -> None:
    state_dict = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, state_dict)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a model")
    for path in (state_dict, garbage):
        with pytest.raises(ValueError, match="cannot load .* as a TorchScript model"):
            make_editor(_config(path))


def test_wrong_output_shape_is_a_clear_error(tmp_path: Path) -> None:
    path = build_tiny_lama(tmp_path / "wrong.pt", WrongShape())
    with pytest.raises(ValueError, match=r"returned \(1, 1, 64, 64\).*expected \(1, 3, 64, 64\)"):
        make_editor(_config(path))


def test_wrong_interface_is_a_clear_error(tmp_path: Path) -> None:
    class ImageOnly(torch.nn.Module):
        def forward(self, image: torch.Tensor) -> torch.Tensor:
            return image

    path = build_tiny_lama(tmp_path / "one-input.pt", ImageOnly())
    with pytest.raises(ValueError, match=r"does not work as a LaMa model"):
        make_editor(_config(path))


def test_model_errors_propagate(model_path: Path) -> None:
    editor = make_editor(_config(model_path))

    def broken(image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("CUDA out of memory")

    editor._model = broken  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="out of memory"):
        editor([EditRequest(image=_image(16, 16), mask=_mask(16, 16, 2, 6, 2, 6))])


def test_bad_config_is_a_value_error(model_path: Path) -> None:
    with pytest.raises(ValueError, match="lama_max_side"):
        _config(model_path, max_side=-1)
    with pytest.raises(ValueError, match="device"):
        make_editor(_config(model_path), device="gpu-please")
    with pytest.raises(ValueError, match="no LaMa model given"):
        make_editor(_config(""))


def test_cli_offers_every_backend() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    synth = commands.choices["synth"]
    action = next(a for a in synth._actions if a.dest == "inpaint_backend")
    assert tuple(action.choices) == INPAINT_BACKENDS and "lama" in action.choices


@pytest.mark.slow
def test_synth_end_to_end_with_lama(model_path: Path, tmp_path: Path) -> None:
    coco = make_bad_coco(tmp_path / "coco")
    out = tmp_path / "out"
    args = synth_args(
        coco,
        out,
        "--limit",
        "10",
        "--image-method",
        "inpaint",
        "--inpaint-backend",
        "lama",
        "--inpaint-model",
        str(model_path),
        "--max-pixels",
        "1000000",
    )
    assert main(args) == 0
    metas = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    metas.append(json.loads(tar.extractfile(member).read()))  # type: ignore[union-attr]
    assert metas
    for meta in metas:
        assert meta["image_method"]["backend"] == "lama"
        assert meta["image_method"]["model"] == str(model_path)
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert not any(r["reason"] == "model-error" for r in rows)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(model_path: Path, editor: LamaInpainter) -> None:
    cuda = make_editor(_config(model_path), device="cuda", batch_size=4)
    requests = [
        EditRequest(image=_image(300, 517, seed), mask=_mask(300, 517, 40 * seed, 100, 50, 300))
        for seed in range(1, 4)
    ]
    for request, got, want in zip(requests, cuda(requests), editor(requests), strict=True):
        np.testing.assert_array_equal(got[request.mask == 0], request.image[request.mask == 0])
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 2
