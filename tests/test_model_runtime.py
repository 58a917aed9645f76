"""One model runtime (device, dtype, batch size) and one Hugging Face loader for every backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from counterfactual.models.runtime import (
    DTYPES,
    ModelRuntime,
    check_batch_size,
    check_dtype,
)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dtype": "float64"}, "dtype 'float64' is not one of float32, float16, bfloat16"),
        ({"dtype": "fp16"}, "dtype 'fp16' is not one of float32, float16, bfloat16"),
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
        ({"batch_size": 2.0}, "batch_size must be a whole number >= 1, got 2.0"),
        ({"batch_size": True}, "batch_size must be a whole number >= 1, got True"),
        ({"device": ""}, "device must be a torch device name, got ''"),
        ({"device": "  "}, "device must be a torch device name, got '  '"),
    ],
)
def test_a_bad_runtime_names_its_value(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        ModelRuntime(**kwargs)


def test_defaults_and_auto() -> None:
    assert ModelRuntime() == ModelRuntime("cpu", "float32", 1)
    assert ModelRuntime(None, None, 4).batch_size == 4  # None: CUDA/float16 when available


def test_of_takes_torch_objects_and_names_the_batch_size() -> None:
    torch = pytest.importorskip("torch")
    runtime = ModelRuntime.of(torch.device("cpu"), torch.bfloat16, 3)
    assert runtime == ModelRuntime("cpu", "bfloat16", 3)
    assert runtime.torch_device() == torch.device("cpu")
    assert runtime.torch_dtype() is torch.bfloat16
    assert ModelRuntime.of(None, None, 1).torch_dtype(torch.device("cpu")) is torch.float32
    with pytest.raises(ValueError, match="verify batch_size must be >= 1, got -1"):
        ModelRuntime.of("cpu", None, -1, "verify batch_size")
    with pytest.raises(ValueError, match="dtype 'float64'"):
        ModelRuntime.of("cpu", torch.float64, 1)
    with pytest.raises(ValueError, match="'gpu-please' is not a torch device"):
        ModelRuntime("gpu-please").torch_device()


def test_one_dtype_list() -> None:
    from counterfactual.synth import plan

    assert DTYPES == ("float32", "float16", "bfloat16")
    assert plan.DTYPES is DTYPES
    assert [check_dtype(d) for d in DTYPES] == list(DTYPES)
    assert check_batch_size(7) == 7
    with pytest.raises(ValueError, match="dtype 'float16 ' is not"):
        plan.Runtime(dtype="float16 ")


@pytest.mark.parametrize(
    ("build", "match"),
    [
        ("captioner", "batch_size must be >= 1, got 0"),
        ("diffusers", "batch_size must be >= 1, got 0"),
        ("lama", "batch_size must be >= 1, got 0"),
        ("detector", "batch_size must be >= 1, got 0"),
        ("embedder", "batch_size must be >= 1, got 0"),
        ("captioner-dtype", "dtype 'int8' is not one of float32, float16, bfloat16"),
        ("diffusers-dtype", "dtype 'int8' is not one of float32, float16, bfloat16"),
        ("detector-dtype", "dtype 'int8' is not one of float32, float16, bfloat16"),
    ],
)
def test_every_backend_checks_its_runtime_alike(build: str, match: str, tmp_path: Path) -> None:
    """Each backend refuses a bad runtime before it loads anything (no model exists here)."""
    pytest.importorskip("torch")
    kind, _, what = build.partition("-")
    bad = {"dtype": "int8", "batch_size": 1} if what == "dtype" else {"batch_size": 0}
    with pytest.raises(ValueError, match=match):
        if kind == "captioner":
            from counterfactual.text import TextConfig
            from counterfactual.text.captioner import Captioner

            Captioner(TextConfig(method="captioner", model=str(tmp_path / "none")), **bad)
        elif kind == "diffusers":
            from counterfactual.image.diffusion import DiffusersConfig, DiffusionInpainter

            DiffusionInpainter(DiffusersConfig(model=str(tmp_path / "none")), **bad)
        elif kind == "lama":
            from counterfactual.image.lama import LamaConfig, LamaInpainter

            LamaInpainter(LamaConfig(model=str(tmp_path / "none.pt")), **bad)
        elif kind == "detector":
            from counterfactual.method.detect import DetectConfig, Detector
            from counterfactual.vocab import coco_vocabulary

            Detector(DetectConfig(model=str(tmp_path / "none")), coco_vocabulary(), **bad)
        else:
            from counterfactual.models import load_embedder

            load_embedder(f"hf-clip:{tmp_path / 'none'}", **bad)


# --- the Hugging Face loader ----------------------------------------------------------------


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tiny_clip import build_tiny_clip

    return build_tiny_clip(tmp_path_factory.mktemp("hf") / "clip")


def _words():
    from counterfactual.models.hf import Words

    return Words(no_config="no config for X", no_model="no model X", not_checkpoint="X is not")


def test_load_pretrained_reads_a_saved_folder(clip_path: Path) -> None:
    import torch

    from counterfactual.models.hf import load_config, load_pretrained

    assert load_config(str(clip_path), _words()).model_type == "clip"
    model, processor = load_pretrained(str(clip_path), "CLIPModel", _words(), dtype=torch.float16)
    assert type(model).__name__ == "CLIPModel"
    assert next(model.parameters()).dtype is torch.float16
    assert processor.tokenizer is not None and processor.image_processor is not None


def test_load_pretrained_errors_start_with_the_callers_words(
    clip_path: Path, tmp_path: Path
) -> None:
    from counterfactual.models.hf import load_config, load_pretrained

    with pytest.raises(ValueError, match="^no config for X: "):
        load_config("nobody/no-such-model-anywhere", _words())
    with pytest.raises(ValueError, match="^no model X: "):
        load_pretrained(str(tmp_path), "CLIPModel", _words())
    # A checkpoint without one weight the caller needs: named, not drawn at random.
    import shutil

    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    shutil.copytree(clip_path, partial)
    weights = load_file(partial / "model.safetensors")
    del weights["text_projection.weight"]
    save_file(weights, partial / "model.safetensors", metadata={"format": "pt"})
    model, _ = load_pretrained(str(partial), "CLIPModel", _words())  # nothing needed: loads
    with pytest.raises(ValueError, match=r"^X is not: 1 weights it needs are missing, e\.g\. "):
        load_pretrained(str(partial), "CLIPModel", _words(), needed=lambda key: True)
