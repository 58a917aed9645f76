"""The GPU smoke check (``make gpu-check``): every model path on CUDA with the tiny models, and,
when real weights are named, a 50-image COCO-format run with its images/s per GPU.

Skipped without CUDA. Needs no network: the tiny models are built, saved and loaded back here;
real weights come from a local folder or the Hugging Face cache (set ``CF_GPU_INPAINT_MODEL``:
a diffusers folder or a cached hub id, or a ``.pt`` with ``CF_GPU_INPAINT_BACKEND=lama``;
``CF_GPU_RECIPE``: e.g. ``rorem``). Run with ``python -m pytest -m gpu tests/test_gpu.py -s`` to
see the figures.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arrays import random_image, rect_mask

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

torch = pytest.importorskip("torch")
for _name in ("diffusers", "transformers"):  # looked up, not imported: no import at collection
    if importlib.util.find_spec(_name) is None:
        pytest.skip(f"{_name} is not installed", allow_module_level=True)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from counterfactual.image import (  # noqa: E402
    DiffusersConfig,
    EditRequest,
    ImageConfig,
    LamaConfig,
    make_editor,
)
from counterfactual.image.best_of_n import BestOfN  # noqa: E402
from counterfactual.imageio import SampleError  # noqa: E402

HALF = ("float16", "bfloat16")


def _requests(n: int, height: int = 96, width: int = 128) -> list[EditRequest]:
    out = []
    for i in range(n):
        y0, x0 = 8 + 3 * i, 10 + 5 * i
        mask = rect_mask(height, width, y0, y0 + 20 + 4 * i, x0, x0 + 30 + 2 * i)
        out.append(EditRequest(random_image(height, width, i), mask, ("dog",), ("cat",), i))
    return out


def _check(requests: list[EditRequest], outputs: list[Any], allow_failed: bool = False) -> None:
    assert len(outputs) == len(requests)
    pictures = 0
    for request, out in zip(requests, outputs, strict=True):
        if isinstance(out, SampleError):
            assert allow_failed and out.reason in ("non-finite-output", "blank-output"), out
            continue
        pictures += 1
        assert out.shape == request.image.shape and out.dtype == np.uint8
        outside = request.mask == 0
        np.testing.assert_array_equal(out[outside], request.image[outside])
    assert pictures, "no request gave a picture"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tiny_captioner import build_tiny_blip
    from tiny_clip import build_tiny_clip
    from tiny_lama import build_tiny_lama

    from counterfactual.testing import (
        build_tiny_inpaint_pipeline,
        build_tiny_owlv2,
        build_tiny_sdxl_inpaint_pipeline,
    )

    root = tmp_path_factory.mktemp("gpu-models")
    return {
        "sd": build_tiny_inpaint_pipeline(root / "sd"),
        "sdxl": build_tiny_sdxl_inpaint_pipeline(root / "sdxl"),
        "lama": build_tiny_lama(root / "lama.pt"),
        "clip": build_tiny_clip(root / "clip"),
        "blip": build_tiny_blip(root / "blip"),
        "owlv2": build_tiny_owlv2(root / "owlv2"),
    }


def _diffusers(path: Path, **options: Any) -> ImageConfig:
    config = DiffusersConfig(model=str(path), steps=2, resolution=64, **options)
    return ImageConfig(backend="diffusers", diffusers=config)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("family", ["sd", "sdxl"])
def test_diffusers_batches_on_cuda(models: dict[str, Path], family: str, dtype: str) -> None:
    editor = make_editor(_diffusers(models[family]), device="cuda", dtype=dtype, batch_size=4)
    info = editor.describe()
    assert info["dtype"] == dtype
    assert next(editor._pipeline.unet.parameters()).device.type == "cuda"  # type: ignore[attr-defined]
    requests = _requests(6)
    _check(requests, editor(requests), allow_failed=True)


def test_compile_and_channels_last_on_cuda(models: dict[str, Path]) -> None:
    config = _diffusers(models["sd"], compile=True, channels_last=True)
    editor = make_editor(config, device="cuda", dtype="float16", batch_size=4)
    requests = _requests(4)
    first = time.perf_counter()
    _check(requests, editor(requests), allow_failed=True)  # compiles
    compiled = time.perf_counter() - first
    start = time.perf_counter()
    _check(requests, editor(requests), allow_failed=True)
    print(f"\ncompile: first batch {compiled:.1f} s, next {time.perf_counter() - start:.2f} s")


@pytest.mark.parametrize("dtype", HALF)
def test_best_of_n_with_the_verifier_on_cuda(models: dict[str, Path], dtype: str) -> None:
    from counterfactual.method.verify import RemovalScorer, Verifier, VerifyConfig
    from counterfactual.vocab import coco_vocabulary

    verifier = Verifier(
        VerifyConfig(mode="record", model=f"hf-clip:{models['clip']}", k=40, retention_k=40),
        coco_vocabulary(),
        device="cuda",
        batch_size=8,
    )
    inner = make_editor(_diffusers(models["sd"]), device="cuda", dtype=dtype, batch_size=6)
    editor = BestOfN(inner, 3, RemovalScorer(verifier))
    requests = _requests(2)
    _check(requests, editor(requests), allow_failed=True)
    assert all(len(choice["scores"]) == 3 for choice in editor.choices)


def test_verify_on_cuda(models: dict[str, Path]) -> None:
    from counterfactual.method.verify import Verifier, VerifyConfig, VerifyRequest
    from counterfactual.vocab import coco_vocabulary

    verifier = Verifier(
        VerifyConfig(mode="record", model=f"hf-clip:{models['clip']}", k=40, retention_k=40),
        coco_vocabulary(),
        device="cuda",
        batch_size=4,
    )
    image = random_image(96, 128, 1)
    requests = [
        VerifyRequest(
            image,
            random_image(96, 128, i),
            {"dog": [(10, 10, 40, 40)]},
            {"cat": [(60, 20, 40, 50)]},
            ("dog",),
            ("cat",),
            "a cat",
        )
        for i in range(5)
    ]
    results = verifier(requests)
    assert len(results) == 5


def test_lama_on_cuda(models: dict[str, Path]) -> None:
    config = ImageConfig(backend="lama", lama=LamaConfig(model=str(models["lama"]), feather=2))
    editor = make_editor(config, device="cuda", batch_size=4)
    requests = _requests(5)
    outputs = editor(requests)
    assert len(outputs) == 5 and all(isinstance(o, np.ndarray) for o in outputs)


@pytest.mark.parametrize("dtype", HALF)
def test_captioner_on_cuda(models: dict[str, Path], dtype: str) -> None:
    from counterfactual.text import RewriteRequest, TextConfig, make_rewriter

    config = TextConfig(method="captioner", model=str(models["blip"]), max_new_tokens=5)
    rewriter = make_rewriter(config, None, device="cuda", dtype=dtype, batch_size=4)
    requests = [
        RewriteRequest("a dog on grass", ("dog",), image=random_image(64, 80, i)) for i in range(5)
    ]
    assert len(rewriter(requests)) == 5


@pytest.mark.parametrize("dtype", HALF)
def test_detector_on_cuda(models: dict[str, Path], dtype: str) -> None:
    from counterfactual.method.detect import DetectConfig, Detector
    from counterfactual.vocab import ClassVocabulary

    vocabulary = ClassVocabulary({"dog": [], "cat": [], "bird": []})
    detector = Detector(
        DetectConfig(model=str(models["owlv2"]), score_threshold=0.0),
        vocabulary,
        device="cuda",
        dtype=dtype,
        batch_size=3,
    )
    images = [random_image(40 + 8 * i, 60, i) for i in range(4)]
    found = detector(images, ["a dog and a cat", "birds", "a cat", "a dog"])
    assert len(found) == 4 and any(found)


REAL = os.environ.get("CF_GPU_INPAINT_MODEL", "")


@pytest.mark.skipif(not REAL, reason="set CF_GPU_INPAINT_MODEL to real weights")
def test_a_coco_run_with_real_weights(tmp_path: Path) -> None:
    """50 COCO-format images (readers/generate.py) through ``counterfactual synth`` on this GPU,
    with the inpainter the environment names; prints images/s per GPU."""
    from counterfactual.cli import main
    from counterfactual.readers.generate import generate_coco

    files = generate_coco(tmp_path / "coco", 50)
    backend = os.environ.get("CF_GPU_INPAINT_BACKEND", "diffusers")
    recipe = os.environ.get("CF_GPU_RECIPE", "")
    batch = os.environ.get("CF_GPU_BATCH", "8")
    argv = ["synth", "--dataset", "coco", "--instances", str(files.instances)]
    argv += ["--captions", str(files.captions), "--images", str(files.images)]
    argv += ["--out", str(tmp_path / "out"), "--device", "cuda", "--dtype", "float16"]
    argv += ["--inpaint-backend", backend, "--inpaint-model", REAL, "--inpaint-batch-size", batch]
    argv += ["--contact-sheet", "0"] + (["--inpaint-recipe", recipe] if recipe else [])
    start = time.perf_counter()
    assert main(argv) == 0
    seconds = time.perf_counter() - start
    rows = (tmp_path / "out" / "status.jsonl").read_text().splitlines()
    written = sum('"written"' in row for row in rows)
    print(
        f"\n{backend} {REAL} {recipe}: {written} samples written of 50 images in {seconds:.1f} s: "
        f"{50 / seconds:.2f} images/s per GPU ({torch.cuda.get_device_name()})"
    )
    assert written > 0
