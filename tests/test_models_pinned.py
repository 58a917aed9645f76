"""Models pinned and found (issue 35 point 4): one weight-variant rule for pull, load and the
manifest; a pipeline's download limited to what ``model_index.json`` names; the cache's pinned
commit passed at load; local model paths made absolute in the driver and looked at on every
node; RORem's mask growth at the working size. Real diffusers loading of a tiny pipeline saved
to disk, a real two-node Ray, the CLI as a user types it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_models_hub import SHA, fake_cache

from counterfactual.image import DiffusersConfig, ImageConfig
from counterfactual.models.hub import (
    Located,
    ModelRef,
    RepoInfo,
    chosen_variant,
    locate,
    pipeline_components,
    pull,
    select_files,
    weight_variant,
)
from counterfactual.synth.models import (
    absolute_models,
    local_model_paths,
    missing_models,
    needed_models,
)
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.run import check_entry
from counterfactual.synth.staging import SetupError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("dtype", "variant"), [("float16", "fp16"), ("bfloat16", "fp16"), ("float32", None)]
)
def test_one_variant_rule_for_pull_and_load(dtype, variant):
    assert weight_variant(dtype) == variant
    config = SynthConfig(image=ImageConfig(method="inpaint", backend="diffusers"))
    (ref,) = needed_models(config, Runtime(dtype=dtype))
    assert ref.variant == variant  # what pull downloads


@pytest.mark.parametrize(
    ("files", "recorded"),
    [
        (("unet/diffusion_pytorch_model.fp16.safetensors", "unet/config.json"), "fp16"),
        (("unet/diffusion_pytorch_model.safetensors", "unet/config.json"), "plain"),
    ],
)
def test_the_manifest_records_the_variant_that_loads(files, recorded):
    ref = ModelRef("inpainter", "--inpaint-model", "hub", "org/sd", "fp16")
    located = Located(ref, "cache", "/x", SHA, None, files)
    assert located.to_dict()["variant"] == recorded
    assert chosen_variant(files, "fp16") == (None if recorded == "plain" else "fp16")


INDEX = {
    "_class_name": "StableDiffusionInpaintPipeline",
    "_diffusers_version": "0.30.0",
    "unet": ["diffusers", "UNet2DConditionModel"],
    "vae": ["diffusers", "AutoencoderKL"],
    "text_encoder": ["transformers", "CLIPTextModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"],
    "scheduler": ["diffusers", "PNDMScheduler"],
    "safety_checker": [None, None],
    "requires_safety_checker": False,
}
REPO_FILES = (
    "model_index.json",
    "README.md",
    "unet/config.json",
    "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.fp16.safetensors",
    "vae/config.json",
    "vae/diffusion_pytorch_model.safetensors",
    "text_encoder/config.json",
    "text_encoder/model.safetensors",
    "tokenizer/vocab.json",
    "scheduler/scheduler_config.json",
    "safety_checker/config.json",
    "safety_checker/model.safetensors",
    "unet_ema/diffusion_pytorch_model.safetensors",
    "v1-5-pruned.safetensors",
)


def test_pipeline_components_are_what_model_index_names():
    assert pipeline_components(INDEX) == ("scheduler", "text_encoder", "tokenizer", "unet", "vae")


def test_a_pipelines_download_is_its_named_components_only(tmp_path):
    calls: list[tuple[str, ...]] = []

    def snapshot(repo_id, *, revision, allow_patterns, cache_dir=None, local_dir=None):
        assert revision == SHA
        calls.append(tuple(allow_patterns))
        folder = Path(local_dir)
        for name in allow_patterns:
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(INDEX) if name == "model_index.json" else "{}")
        return str(folder)

    ref = ModelRef("inpainter", "--inpaint-model", "hub", "org/sd", "fp16")
    found = pull(ref, tmp_path, repo_info=lambda r: RepoInfo(SHA, REPO_FILES), snapshot=snapshot)
    assert calls[0] == ("model_index.json",)
    assert set(calls[1]) == {
        "model_index.json",
        "unet/config.json",
        "unet/diffusion_pytorch_model.fp16.safetensors",
        "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors",
        "text_encoder/config.json",
        "text_encoder/model.safetensors",
        "tokenizer/vocab.json",
        "scheduler/scheduler_config.json",
    }
    assert found.revision == SHA
    # without the index every folder's safetensors would come
    assert "safety_checker/model.safetensors" in select_files(REPO_FILES, "fp16")


@pytest.fixture(scope="module")
def tiny_sd(tmp_path_factory):
    pytest.importorskip("diffusers")
    from counterfactual.testing import build_tiny_inpaint_pipeline

    return build_tiny_inpaint_pipeline(tmp_path_factory.mktemp("sd") / "pipeline")


@pytest.fixture(scope="module")
def tiny_sd_fp16(tiny_sd, tmp_path_factory):
    from diffusers import StableDiffusionInpaintPipeline

    folder = tmp_path_factory.mktemp("sd16") / "pipeline"
    pipe = StableDiffusionInpaintPipeline.from_pretrained(tiny_sd, safety_checker=None)
    pipe.save_pretrained(folder, variant="fp16")
    return folder


@pytest.mark.slow
@pytest.mark.parametrize(("which", "variant"), [("tiny_sd", ""), ("tiny_sd_fp16", "fp16")])
def test_load_reads_the_variant_the_files_have(request, which, variant):
    from counterfactual.image.diffusion import load_pipeline

    folder = request.getfixturevalue(which)
    _, loaded = load_pipeline(str(folder), "bfloat16")
    assert loaded == variant
    ref = ModelRef("inpainter", "--inpaint-model", "hub", str(folder), weight_variant("bfloat16"))
    assert locate(ref).to_dict()["variant"] == (variant or "plain")  # the manifest agrees


PINNED_PIPELINE = """
from counterfactual.image.diffusion import _variants, load_pipeline
print(_variants('org/tiny-sd', 'float32'))
pipeline, variant = load_pipeline('org/tiny-sd', 'float32')
print(type(pipeline).__name__, repr(variant))
"""

PINNED_LOADERS = """
import json
from counterfactual.models import hf
seen = []
at = hf._at
hf._at = lambda revision: seen.append(revision) or at(revision)
from counterfactual.method.detect import DetectConfig, Detector
from counterfactual.models.embed import load_embedder
from counterfactual.text import TextConfig
from counterfactual.text.captioner import Captioner
from counterfactual.vocab import ClassVocabulary
out = {}
load_embedder("hf-clip:org/tiny-clip", device="cpu", dtype="float32")
out["verifier"], seen[:] = sorted(set(seen)), []
Detector(DetectConfig(model="org/tiny-owl"), ClassVocabulary({"dog": []}), "cpu", "float32")
out["detector"], seen[:] = sorted(set(seen)), []
Captioner(TextConfig(method="captioner", model="org/tiny-blip", max_new_tokens=2))
out["captioner"], seen[:] = sorted(set(seen)), []
out["folder"] = hf.pinned_revision("/nowhere/tiny-clip")
out["absent"] = hf.pinned_revision("org/not-pulled")
print(json.dumps(out))
"""

BETWEEN = "--- the transformers loaders ---"


@pytest.fixture(scope="module")
def pinned_loads(tiny_sd, tmp_path_factory) -> tuple[list[str], list[str]]:
    """A cache that ``models pull`` wrote (``refs/main``: the commit) holding the tiny
    inpainting pipeline, a CLIP, an OWLv2 and a BLIP, loaded for real, offline, in one process
    of its own (huggingface_hub reads ``HF_HUB_CACHE`` at import): the stdout lines of
    :data:`PINNED_PIPELINE` and of :data:`PINNED_LOADERS`, run in turn."""
    from tiny_captioner import build_tiny_blip
    from tiny_clip import build_tiny_clip

    from counterfactual.testing import build_tiny_owlv2

    root = tmp_path_factory.mktemp("pinned")
    cache = root / "hub"
    fake_cache(cache, "org/tiny-sd", tiny_sd)
    fake_cache(cache, "org/tiny-clip", build_tiny_clip(root / "clip"))
    fake_cache(cache, "org/tiny-owl", build_tiny_owlv2(root / "owl"))
    fake_cache(cache, "org/tiny-blip", build_tiny_blip(root / "blip"))
    code = f"{PINNED_PIPELINE}\nprint({BETWEEN!r})\n{PINNED_LOADERS}"
    env = os.environ | {"PYTHONPATH": str(ROOT), "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    pipeline, loaders = done.stdout.split(f"{BETWEEN}\n")
    return pipeline.splitlines(), loaders.splitlines()


@pytest.mark.slow
def test_load_passes_the_commit_the_cache_pins(pinned_loads):
    """A hub id in the cache loads at the commit ``models pull`` wrote to ``refs/main``
    (``revision=`` that commit, offline; in a process of its own, since huggingface_hub reads
    ``HF_HUB_CACHE`` at import)."""
    assert pinned_loads[0] == [
        f"[('', '{SHA}')]",
        "StableDiffusionInpaintPipeline ''",
    ]


@pytest.mark.slow
def test_every_transformers_loader_passes_the_commit_the_cache_pins(pinned_loads):
    """The verifier (hf-clip), the detector (OWLv2) and the captioner (BLIP) load a hub id of
    the cache at the commit ``models pull`` wrote to ``refs/main``, as the inpainter does: every
    ``from_pretrained`` gets ``revision=`` that commit (real loading, offline, in a process of
    its own); a folder or a model not in the cache gets none."""
    assert json.loads(pinned_loads[1][-1]) == {
        "verifier": [SHA],
        "detector": [SHA],
        "captioner": [SHA],
        "folder": None,
        "absent": None,
    }


def test_a_named_revision_wins_over_the_pinned_one(tmp_path, monkeypatch):
    """A caller that names a revision loads that one; without one, the cache's commit."""
    from tiny_clip import build_tiny_clip

    from counterfactual.models import hf

    cache = tmp_path / "hub"
    fake_cache(cache, "org/tiny-clip", build_tiny_clip(tmp_path / "clip"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert hf.pinned_revision("org/tiny-clip") == SHA
    assert hf.pinned_revision(str(tmp_path / "clip")) is None  # a folder: as saved
    assert hf._revision("org/tiny-clip", None) == SHA
    assert hf._revision("org/tiny-clip", "v2") == "v2"


def lama_config(model: str) -> SynthConfig:
    image = ImageConfig(method="inpaint", backend="lama")
    return SynthConfig(
        image=dataclasses.replace(image, lama=dataclasses.replace(image.lama, model=model))
    )


def test_local_model_paths_are_absolute_in_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = lama_config("models/big-lama.pt")  # reads like a hub id ORG/NAME: it is not one
    assert local_model_paths(config) == {"--inpaint-model": str(tmp_path / "models/big-lama.pt")}
    assert absolute_models(config).image.lama.model == str(tmp_path / "models/big-lama.pt")
    assert config.fingerprint() == lama_config("models/big-lama.pt").fingerprint()
    with pytest.raises(SetupError) as err:  # a library run: local paths only
        check_entry(tmp_path / "out", config, Runtime())
    assert str(err.value) == (
        f"Inpaint: the model {tmp_path}/models/big-lama.pt does not exist; pass --inpaint-model "
        "a hub id or an existing folder or file"
    )
    assert not (tmp_path / "out").exists()  # the models are checked before OUT is made
    (tmp_path / "models").mkdir()
    (tmp_path / "models/big-lama.pt").write_bytes(b"x")
    check_entry(tmp_path / "out", config, Runtime())
    assert not missing_models(config, hub=False)


@pytest.mark.slow
def test_a_relative_model_missing_here_is_named_by_the_dry_run(tmp_path):
    """A relative model file of the user's (no published one, so no pull can fetch it), run
    from a folder without it: the dry run prints the layout, then names it in the one line of
    what is missing (exit 1). (A missing ``models/big-lama.pt`` is named with the pull command
    instead: test_first_hour.)"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [sys.executable, "-m", "counterfactual", "synth", "--config", "coco", "--dry-run"]
    cmd += ["--inpaint-model", "models/mine.pt", "--no-verify", "--num-cpus", "1"]
    cmd += ["--no-dashboard", "--device", "cpu"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["cpus"] == 1
    assert done.stderr.splitlines()[-1] == (
        f"counterfactual synth: dry run: Inpaint: the model {tmp_path}/models/mine.pt does not "
        "exist; pass --inpaint-model a hub id or an existing folder or file"
    )


@pytest.mark.slow
def test_every_node_is_asked_whether_it_sees_the_models(tmp_path):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from counterfactual.pipelines.session import check_model_paths

    present = tmp_path / "big-lama.pt"
    present.write_bytes(b"x")
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1, num_gpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        assert len(check_model_paths({"--inpaint-model": str(present)}, False, 60)) == 2
        assert len(check_model_paths({"--inpaint-model": str(present)}, True, 60)) == 1
        gone = str(tmp_path / "gone.pt")
        with pytest.raises(SetupError) as err:
            check_model_paths({"--inpaint-model": gone}, False, 60)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert str(err.value).startswith(f"--inpaint-model {gone}: not on node ")
    assert "(2 of 2 nodes lack it); put the models on storage every node mounts" in str(err.value)


def test_rorem_grows_its_mask_at_the_working_size():
    from counterfactual.image.diffusion import RECIPES, grow_mask

    assert RECIPES["rorem"]["grow"] == 20
    assert DiffusersConfig.from_recipe("rorem").grow == 20
    mask = np.zeros((512, 512), np.uint8)
    mask[200:260, 300:340] = 255  # 60 x 40
    grown = grow_mask(mask, 20)
    rows, cols = np.nonzero(grown)
    assert (rows.max() - rows.min() + 1, cols.max() - cols.min() + 1) == (79, 59)  # + 20 - 1
    with pytest.raises(ValueError, match="grow"):
        DiffusersConfig(grow=-1)


@pytest.mark.slow
def test_the_grown_region_is_what_is_repainted(tiny_sd):
    from counterfactual.image import EditRequest
    from counterfactual.image.diffusion import DiffusionInpainter, grown_region

    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)
    mask = np.zeros((128, 128), np.uint8)
    mask[48:80, 48:80] = 255
    changed = {}
    for grow in (0, 8):
        config = DiffusersConfig(model=str(tiny_sd), steps=2, resolution=64, grow=grow)
        (out,) = DiffusionInpainter(config)([EditRequest(image=image, mask=mask, seed=1)])
        changed[grow] = np.any(out != image, axis=2)
    assert not changed[0][mask == 0].any()
    # an 8 x 8 kernel at 64 px is 16 px at the picture's 128: the ring outside the mask changes
    ring = changed[8] & (mask == 0)
    assert ring.any()
    rows, cols = np.nonzero(ring)
    assert rows.min() >= 48 - 8 * 2 and rows.max() < 80 + 8 * 2
    # what the sample records is the region repainted: every changed pixel lies inside it
    recorded = grown_region(DiffusersConfig(model=str(tiny_sd), resolution=64, grow=8), mask)
    assert not changed[8][recorded == 0].any() and (recorded > 0).sum() > (mask > 0).sum()


def test_the_recorded_mask_is_the_grown_one_only_with_grow():
    """With ``grow`` the sample records the grown region (the paste mask the inpainter uses,
    in place in the whole picture); without, the very mask it was given (runs without
    ``--inpaint-grow`` write the same bytes as before)."""
    from counterfactual.image import ImageConfig, recorded_mask
    from counterfactual.image.diffusion import working_masks

    mask = np.zeros((240, 320), np.uint8)
    mask[100:140, 150:200] = 255
    for image in (
        ImageConfig(method="inpaint", backend="diffusers"),
        ImageConfig(method="inpaint", backend="lama"),
        ImageConfig(method="blur"),
    ):
        assert recorded_mask(image, mask) is mask
    grown = ImageConfig(method="inpaint", backend="diffusers", diffusers=DiffusersConfig(grow=20))
    recorded = recorded_mask(grown, mask)
    assert recorded.dtype == np.uint8 and set(np.unique(recorded)) == {0, 255}
    assert (recorded[mask > 0] == 255).all()  # the mask itself stays in
    rows, cols = np.nonzero(recorded)
    # 20 px at the 512 px working size; the crop (crop_padding 0.25 of 50 x 40, square) is
    # scaled up about 512 / 63 = 8x, so the ring is about 20 / 8 / 2 = 1-2 px at the picture
    assert 96 <= rows.min() < 100 and 140 < rows.max() + 1 <= 144
    assert 146 <= cols.min() < 150 and 200 < cols.max() + 1 <= 204
    x0, y0, x1, y1 = 0, 0, 320, 240
    assert working_masks(mask[y0:y1, x0:x1], (320, 240), 0)[1] is None


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("/models/clip", True),
        ("./clip", True),
        ("~/clip", True),
        ("gpt2", False),  # a hub id without an org, or a test's scripted backend
        ("org/name/sub", True),  # no hub id holds two slashes
        ("org\\name", True),  # nor a backslash
        ("scripted", False),
        ("openai/clip-vit-large-patch14", False),
    ],
)
def test_only_a_certain_path_is_made_absolute_and_checked(name, path):
    from counterfactual.models.hub import is_local

    assert is_local(name) is path
