"""Image/text embedders for retrieval evaluation, on tiny random CLIP and BLIP retrieval models
saved and reloaded through the real loaders."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np
import pytest
from PIL import Image

from counterfactual.models import (
    BlipEmbedder,
    Embedder,
    HFClipEmbedder,
    ModelSpec,
    load_embedder,
    parse_model_spec,
    resolve_device,
    resolve_dtype,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tiny_blip_retrieval import MAX_POSITIONS, build_tiny_blip_retrieval  # noqa: E402
from tiny_captioner import build_tiny_blip  # noqa: E402
from tiny_clip import build_tiny_clip  # noqa: E402
from tiny_open_clip import EMBED_DIM as TINY_OPEN_CLIP_DIM  # noqa: E402
from tiny_open_clip import register_tiny_open_clip  # noqa: E402

TEXTS = [
    "a dog",
    "the cat sits on a red table near two small green trees in the street",
    "a man with a ball",
    "",
    "a woman runs in the field.",
]


def _images() -> list[Image.Image]:
    """Five RGB images of different sizes and contents."""
    rng = np.random.default_rng(7)
    sizes = [(32, 32), (20, 45), (64, 30), (17, 17), (40, 80)]
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_clip(tmp_path_factory.mktemp("embed") / "tiny-clip")


@pytest.fixture(scope="module")
def blip_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_blip_retrieval(tmp_path_factory.mktemp("embed") / "tiny-blip-itm")


@pytest.fixture(scope="module", params=["hf-clip", "blip"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def model_path(kind: str, clip_path: Path, blip_path: Path) -> Path:
    return clip_path if kind == "hf-clip" else blip_path


@pytest.fixture(scope="module")
def embedder(model_path: Path) -> Embedder:
    """Loaded by bare folder path: the kind comes from config.json."""
    return load_embedder(str(model_path), device="cpu")


# --- spec parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "hf-clip:openai/clip-vit-base-patch32",
            ModelSpec("hf-clip", "openai/clip-vit-base-patch32"),
        ),
        ("blip:Salesforce/blip-itm-base-coco", ModelSpec("blip", "Salesforce/blip-itm-base-coco")),
        (
            "open_clip:ViT-B-32:laion2b_s34b_b79k",
            ModelSpec("open_clip", "ViT-B-32", "laion2b_s34b_b79k"),
        ),
        (
            "open_clip:ViT-B-32:/path/to/epoch_10.pt",
            ModelSpec("open_clip", "ViT-B-32", "/path/to/epoch_10.pt"),
        ),
        (
            "open_clip:hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K",
            ModelSpec("open_clip", "hf-hub:laion/CLIP-ViT-B-32-laion2B-s34B-b79K"),
        ),
        ("hf-clip:/models/my:clip", ModelSpec("hf-clip", "/models/my:clip")),
        ("  blip:/models/itm  ", ModelSpec("blip", "/models/itm")),
    ],
)
def test_parse_model_spec(text: str, expected: ModelSpec) -> None:
    spec = parse_model_spec(text)
    assert spec == expected
    assert str(spec) == text.strip()
    assert parse_model_spec(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("openai/clip-vit-base-patch32", "hf-clip:openai/clip-vit-base-patch32"),
        ("clip:openai/clip-vit-base-patch32", "no kind prefix"),
        ("/no/such/folder", "not a local model folder"),
        ("", "no kind prefix"),
        ("hf-clip:", "empty"),
        ("blip: padded", "surrounding spaces"),
        ("open_clip:ViT-B-32", "needs a pretrained tag"),
        ("open_clip:ViT-B-32:", "needs a pretrained tag"),
        ("open_clip::laion2b_s34b_b79k", "empty"),
    ],
)
def test_parse_model_spec_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_model_spec(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("clip", "x"), "not one of"),
        (("hf-clip", "x", "openai"), "open_clip specs only"),
        (("open_clip", "hf-hub:org/name", "openai"), "drop pretrained"),
    ],
)
def test_model_spec_rejects(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelSpec(*args)


@pytest.mark.parametrize(
    ("config", "kind"), [({"model_type": "clip"}, "hf-clip"), ({"model_type": "blip"}, "blip")]
)
def test_parse_detects_folder_kind(tmp_path: Path, config: dict[str, str], kind: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    spec = parse_model_spec(str(tmp_path))
    assert spec == ModelSpec(kind, str(tmp_path))
    assert parse_model_spec(str(spec)) == spec


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no config.json"),
        (json.dumps({"model_type": "bert"}), "model_type 'bert'"),
        (json.dumps({}), "model_type None"),
        ("not json", "cannot read model_type"),
        ("[1, 2]", "cannot read model_type"),
    ],
)
def test_parse_rejects_folder(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        parse_model_spec(str(tmp_path))


# --- device and dtype defaults --------------------------------------------------------------


def test_default_device_and_dtype() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None).type == expected
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype(None, torch.device("cuda")) == torch.float16
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert resolve_dtype(torch.float16, torch.device("cpu")) == torch.float16
    with pytest.raises(ValueError, match="dtype 'int8'"):
        resolve_dtype("int8", torch.device("cpu"))
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        resolve_dtype(torch.float64, torch.device("cpu"))
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("gpu-please")


# --- loading --------------------------------------------------------------------------------


@pytest.mark.slow
def test_load_by_path_and_by_prefix(kind: str, model_path: Path, embedder: Embedder) -> None:
    expected = ModelSpec(kind, str(model_path))
    assert embedder.spec == expected
    assert isinstance(embedder, HFClipEmbedder if kind == "hf-clip" else BlipEmbedder)
    assert isinstance(embedder, Embedder)
    assert embedder.dim == 16
    by_prefix = load_embedder(f"{kind}:{model_path}", device="cpu", batch_size=2)
    assert by_prefix.spec == expected
    assert embedder.describe() == {  # type: ignore[attr-defined]
        "model": f"{kind}:{model_path}",
        "dim": 16,
        "device": "cpu",
        "dtype": "float32",
    }
    texts = embedder.embed_texts(TEXTS)
    np.testing.assert_allclose(by_prefix.embed_texts(TEXTS), texts, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(load_embedder(expected, device="cpu").embed_texts(TEXTS), texts)


def test_load_missing_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    for kind in ("hf-clip", "blip"):
        with pytest.raises(FileNotFoundError, match=f"spec '{kind}:{missing}'"):
            load_embedder(f"{kind}:{missing}", device="cpu")


def test_load_unknown_hub_id_offline() -> None:
    with pytest.raises(ValueError, match="cannot load 'hf-clip:nobody/no-such-clip'"):
        load_embedder("hf-clip:nobody/no-such-clip", device="cpu")


@pytest.mark.slow
def test_load_wrong_model_type(clip_path: Path, blip_path: Path) -> None:
    with pytest.raises(ValueError, match="is a 'blip' model, not 'clip'"):
        load_embedder(f"hf-clip:{blip_path}", device="cpu")
    with pytest.raises(ValueError, match="is a 'clip' model, not 'blip'"):
        load_embedder(f"blip:{clip_path}", device="cpu")


@pytest.mark.slow
def test_load_blip_captioner_is_not_retrieval(tmp_path: Path) -> None:
    """A BLIP captioning checkpoint has model_type 'blip' too but no ITC projections."""
    captioner = build_tiny_blip(tmp_path / "captioner")
    with pytest.raises(ValueError, match="not a BlipForImageTextRetrieval checkpoint"):
        load_embedder(str(captioner), device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 2.0}, "batch_size"),
        ({"dtype": "float64"}, "dtype 'float64'"),
        ({"device": "nowhere"}, "not a torch device"),
    ],
)
def test_load_rejects_options(clip_path: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_embedder(str(clip_path), **options)  # type: ignore[arg-type]


def test_open_clip_missing_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "open_clip", None)  # import open_clip -> ImportError
    with pytest.raises(ImportError, match="pip install open_clip_torch"):
        load_embedder("open_clip:ViT-B-32:laion2b_s34b_b79k", device="cpu")


# --- embeddings -----------------------------------------------------------------------------


def _check_unit_rows(vectors: np.ndarray, count: int, dim: int) -> None:
    assert vectors.shape == (count, dim)
    assert vectors.dtype == np.float32
    assert np.all(np.isfinite(vectors))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
def test_shapes_norms_dtype(embedder: Embedder) -> None:
    images = embedder.embed_images(_images())
    texts = embedder.embed_texts(TEXTS)
    _check_unit_rows(images, 5, embedder.dim)
    _check_unit_rows(texts, 5, embedder.dim)
    # Different inputs give different rows (the models are random but not constant).
    assert len({row.tobytes() for row in images}) == 5
    assert len({row.tobytes() for row in texts}) == 5
    assert np.abs(texts @ texts.T - np.eye(5)).max() > 1e-3


@pytest.mark.slow
def test_empty_inputs(embedder: Embedder) -> None:
    for empty in (embedder.embed_images([]), embedder.embed_texts([]), embedder.embed_texts(())):
        assert empty.shape == (0, embedder.dim)
        assert empty.dtype == np.float32


@pytest.mark.slow
def test_batch_size_invariance(model_path: Path) -> None:
    one = load_embedder(str(model_path), device="cpu", batch_size=1)
    three = load_embedder(str(model_path), device="cpu", batch_size=3)
    # 5 inputs in batches of 3: a full batch and a partial one, padded to different lengths.
    np.testing.assert_allclose(
        one.embed_images(_images()), three.embed_images(_images()), rtol=0, atol=1e-5
    )
    np.testing.assert_allclose(one.embed_texts(TEXTS), three.embed_texts(TEXTS), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_deterministic(embedder: Embedder) -> None:
    np.testing.assert_array_equal(
        embedder.embed_images(_images()), embedder.embed_images(_images())
    )
    np.testing.assert_array_equal(embedder.embed_texts(TEXTS), embedder.embed_texts(TEXTS))
    # Order in, order out: reversing the input reverses the rows.
    np.testing.assert_allclose(
        embedder.embed_texts(TEXTS[::-1]), embedder.embed_texts(TEXTS)[::-1], rtol=0, atol=1e-5
    )


@pytest.mark.slow
def test_clip_matches_model_forward(clip_path: Path) -> None:
    """Our rows are the ``image_embeds`` / ``text_embeds`` that ``CLIPModel.forward`` returns."""
    embedder = load_embedder(f"hf-clip:{clip_path}", device="cpu")
    model = transformers.CLIPModel.from_pretrained(clip_path).eval()
    processor = transformers.AutoProcessor.from_pretrained(clip_path)
    images = _images()
    inputs = processor(text=TEXTS, images=images, padding=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**inputs)
    np.testing.assert_allclose(
        embedder.embed_images(images), out.image_embeds.numpy(), rtol=0, atol=1e-5
    )
    np.testing.assert_allclose(
        embedder.embed_texts(TEXTS), out.text_embeds.numpy(), rtol=0, atol=1e-5
    )
    logits = out.logits_per_image.numpy() / model.logit_scale.exp().item()
    np.testing.assert_allclose(
        embedder.embed_images(images) @ embedder.embed_texts(TEXTS).T, logits, rtol=0, atol=1e-5
    )


@pytest.mark.slow
def test_blip_matches_itc_scores(blip_path: Path) -> None:
    """Our cosines are ``model(..., use_itm_head=False).itm_score`` (BLIP's ITC similarity)."""
    embedder = load_embedder(f"blip:{blip_path}", device="cpu", batch_size=2)
    model = transformers.BlipForImageTextRetrieval.from_pretrained(blip_path).eval()
    processor = transformers.AutoProcessor.from_pretrained(blip_path)
    images = _images()
    inputs = processor(images=images, text=TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        scores = model(**inputs, use_itm_head=False).itm_score.numpy()
    assert scores.shape == (5, 5)
    ours = embedder.embed_images(images) @ embedder.embed_texts(TEXTS).T
    np.testing.assert_allclose(ours, scores, rtol=0, atol=1e-5)
    assert np.ptp(scores) > 1e-2  # the check would catch swapped or constant embeddings


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "1", "I;16", "CMYK"])
def test_image_modes_convert_to_rgb(embedder: Embedder, mode: str) -> None:
    rgb = _images()[2]
    other = rgb.convert(mode)
    got = embedder.embed_images([other])
    _check_unit_rows(got, 1, embedder.dim)
    np.testing.assert_array_equal(got, embedder.embed_images([other.convert("RGB")]))


@pytest.mark.slow
def test_grayscale_differs_from_colour(embedder: Embedder) -> None:
    rgb = _images()[0]
    gray, colour = embedder.embed_images([rgb.convert("L"), rgb])
    assert np.abs(gray - colour).max() > 1e-4


@pytest.mark.slow
def test_long_caption_is_truncated(kind: str, embedder: Embedder) -> None:
    long = " ".join(["a small dog runs on the green grass near the red bus"] * 60)
    rows = embedder.embed_texts([long, long + " with two cats", "a dog"])
    _check_unit_rows(rows, 3, embedder.dim)
    # Both are cut to the model's context (77 for CLIP, MAX_POSITIONS here for BLIP) before the
    # tail, so the tail cannot change the embedding; a short caption does differ.
    np.testing.assert_allclose(rows[0], rows[1], rtol=0, atol=1e-6)
    assert np.abs(rows[0] - rows[2]).max() > 1e-3
    expected = 77 if kind == "hf-clip" else MAX_POSITIONS
    assert embedder.max_text_length == expected  # type: ignore[attr-defined]


@pytest.mark.slow
def test_rejects_wrong_input_types(embedder: Embedder) -> None:
    with pytest.raises(TypeError, match="not one string"):
        embedder.embed_texts("a dog")
    with pytest.raises(TypeError, match="text 1 is a int"):
        embedder.embed_texts(["a dog", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="image 0 is a ndarray"):
        embedder.embed_images([np.zeros((8, 8, 3), dtype=np.uint8)])  # type: ignore[list-item]


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_half_matches_cpu(model_path: Path) -> None:
    cpu = load_embedder(str(model_path), device="cpu")
    cuda = load_embedder(str(model_path))  # defaults: cuda, float16
    assert cuda.describe()["dtype"] == "float16"  # type: ignore[attr-defined]
    for method, inputs in (("embed_images", _images()), ("embed_texts", TEXTS)):
        got = getattr(cuda, method)(inputs)
        _check_unit_rows(got, 5, cuda.dim)
        np.testing.assert_allclose(got, getattr(cpu, method)(inputs), rtol=0, atol=2e-2)


# --- open_clip (only where it is installed) ---------------------------------------------------


def test_open_clip_checkpoint_roundtrip(tmp_path: Path) -> None:
    """A random open_clip model saved as a training checkpoint and loaded by path (the tiny
    architecture of ``tiny_open_clip``, registered as open_clip lets users add their own)."""
    open_clip = pytest.importorskip("open_clip")
    arch = register_tiny_open_clip(tmp_path / "configs")
    torch.manual_seed(0)
    model = open_clip.create_model(arch)
    checkpoint = tmp_path / "epoch_1.pt"
    torch.save({"epoch": 1, "state_dict": model.state_dict()}, checkpoint)
    embedder = load_embedder(f"open_clip:{arch}:{checkpoint}", device="cpu", batch_size=2)
    assert embedder.spec == ModelSpec("open_clip", arch, str(checkpoint))
    assert embedder.dim == TINY_OPEN_CLIP_DIM
    images = embedder.embed_images(_images()[:3])
    texts = embedder.embed_texts(TEXTS[:3] + ["dog " * 200])
    _check_unit_rows(images, 3, TINY_OPEN_CLIP_DIM)
    _check_unit_rows(texts, 4, TINY_OPEN_CLIP_DIM)
    _, _, preprocess = open_clip.create_model_and_transforms(arch)
    tokenizer = open_clip.get_tokenizer(arch)
    model.eval()
    with torch.inference_mode():
        direct_images = model.encode_image(torch.stack([preprocess(i) for i in _images()[:3]]))
        direct_texts = model.encode_text(tokenizer(TEXTS[:3]))
    direct_images = torch.nn.functional.normalize(direct_images, dim=-1).numpy()
    direct_texts = torch.nn.functional.normalize(direct_texts, dim=-1).numpy()
    np.testing.assert_allclose(images, direct_images, rtol=0, atol=1e-4)
    np.testing.assert_allclose(texts[:3], direct_texts, rtol=0, atol=1e-4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_embedder(f"open_clip:{arch}:{tmp_path / 'missing' / 'epoch_2.pt'}", device="cpu")
