"""The captioner text backend, on a tiny random BLIP saved and reloaded through the real loaders."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from counterfactual.text import RewriteRequest, RewriteResult, TextConfig, make_rewriter  # noqa: E402
from counterfactual.text.captioner import Captioner  # noqa: E402
from tests.tiny_captioner import WORDS, build_tiny_blip  # noqa: E402

pytestmark = pytest.mark.slow


def _config(model: Path | str, **overrides: object) -> TextConfig:
    options: dict[str, object] = {"max_new_tokens": 5, "num_beams": 1}
    options.update(overrides)
    return TextConfig(method="captioner", model=str(model), **options)  # type: ignore[arg-type]


def _image(height: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _request(image: np.ndarray | None) -> RewriteRequest:
    return RewriteRequest(caption="a dog on the grass", removed=("dog",), image=image)


@pytest.fixture(scope="module")
def blip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_blip(tmp_path_factory.mktemp("captioner") / "tiny-blip")


@pytest.fixture(scope="module")
def captioner(blip_path: Path) -> Captioner:
    rewriter = make_rewriter(_config(blip_path))
    assert isinstance(rewriter, Captioner)
    return rewriter


def _check(result: RewriteResult) -> None:
    assert result.text is None or (isinstance(result.text, str) and result.text.strip())
    assert (result.text is None) == (result.reason is not None)
    if result.text is not None:
        assert result.text == result.text.strip()


def test_describe(captioner: Captioner, blip_path: Path) -> None:
    assert captioner.describe() == {
        "method": "captioner",
        "model": str(blip_path),
        "max_new_tokens": 5,
        "num_beams": 1,
        "dtype": "float32",
    }


def test_batch_of_different_sizes_in_order_and_deterministic(captioner: Captioner) -> None:
    images = [_image(40, 56, 0), _image(17, 90, 1), _image(32, 32, 2)]
    first = captioner([_request(image) for image in images])
    second = captioner([_request(image) for image in images])
    assert len(first) == 3
    for result in first:
        _check(result)
    assert first == second
    # The tiny model's captions follow the image (see tiny_captioner), so order is observable.
    assert len({result.text for result in first}) > 1
    # In order: each image alone gets the caption it got in the batch.
    for image, batched in zip(images, first, strict=True):
        assert captioner([_request(image)]) == [batched]


def test_captions_are_words_from_the_vocabulary(captioner: Captioner) -> None:
    results = captioner([_request(_image(24, 24, seed)) for seed in range(4)])
    texts = [result.text for result in results if result.text is not None]
    assert texts
    for text in texts:
        # At most max_new_tokens words, none of them a special token.
        assert 1 <= len(text.split()) <= 5
        assert set(text.split()) <= set(WORDS)


def test_small_batch_size_gives_same_results(blip_path: Path, captioner: Captioner) -> None:
    images = [_image(30, 20, seed) for seed in range(5)]
    requests = [_request(image) for image in images]
    chunked = make_rewriter(_config(blip_path), batch_size=2)
    assert chunked(requests) == captioner(requests)


def test_beam_search_runs(blip_path: Path) -> None:
    beam = make_rewriter(_config(blip_path, num_beams=2))
    results = beam([_request(_image(32, 32, 7)), _request(_image(50, 20, 8))])
    assert len(results) == 2
    for result in results:
        _check(result)
    assert beam.describe()["num_beams"] == 2


def test_bfloat16_captions(blip_path: Path) -> None:
    half = make_rewriter(_config(blip_path), dtype="bfloat16")
    assert half.describe()["dtype"] == "bfloat16"
    results = half([_request(_image(32, 32, 0)), _request(None)])
    _check(results[0])
    assert results[1].reason == "no-image"


def test_missing_and_bad_images_are_skipped_in_place(captioner: Captioner) -> None:
    good = _image(32, 32, 3)
    bad = [
        np.zeros((8, 8), dtype=np.uint8),  # no channel axis
        np.zeros((8, 8, 4), dtype=np.uint8),  # RGBA
        np.zeros((8, 8, 3), dtype=np.float32),  # not uint8
        np.zeros((0, 8, 3), dtype=np.uint8),  # empty
    ]
    results = captioner([_request(None), _request(good), *[_request(image) for image in bad]])
    assert results[0] == RewriteResult(text=None, reason="no-image")
    assert results[1] == captioner([_request(good)])[0]
    assert [result.reason for result in results[2:]] == ["bad-image"] * len(bad)
    assert all(result.text is None for result in results[2:])


def test_only_missing_images_never_runs_the_model(captioner: Captioner) -> None:
    assert (
        captioner([_request(None), _request(None)])
        == [RewriteResult(text=None, reason="no-image")] * 2
    )
    assert captioner([]) == []


def test_empty_caption_has_a_reason(tmp_path: Path) -> None:
    path = build_tiny_blip(tmp_path / "silent-blip", empty_captions=True)
    results = make_rewriter(_config(path))([_request(_image(32, 32, 0))])
    assert results == [RewriteResult(text=None, reason="empty-caption")]


def test_nonexistent_model_path_raises(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ValueError, match="no-such-model"):
        make_rewriter(_config(missing))


def test_folder_without_a_model_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="could not load image captioner"):
        make_rewriter(_config(tmp_path))


@pytest.mark.parametrize(
    ("overrides", "runtime", "message"),
    [
        ({"max_new_tokens": 0}, {}, "max_new_tokens"),
        ({"num_beams": 0}, {}, "num_beams"),
        ({}, {"dtype": "float64"}, "dtype 'float64'"),
        ({}, {"batch_size": 0}, "batch_size must be >= 1"),
        ({}, {"device": "gpu-please"}, "not a torch device"),
    ],
)
def test_bad_generation_options_raise(
    blip_path: Path, overrides: dict[str, int], runtime: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Captioner(_config(blip_path, **overrides), **runtime)  # type: ignore[arg-type]
