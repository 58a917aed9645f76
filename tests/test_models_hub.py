"""The models a config names, found and fetched on purpose, without the network: a Hugging Face
cache laid out as huggingface_hub lays it (a tiny CLIP saved into it and loaded back offline by
transformers), the hub calls of ``pull`` replaced by functions that fill that cache, LaMa's file
served by a local HTTP server on 127.0.0.1 with its checksum, and the one line a run prints when
a model cannot be had."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.cli import main
from counterfactual.cli.models import config_models, pull_command
from counterfactual.models import hub
from counterfactual.models.hub import (
    KNOWN_FILES,
    Located,
    ModelRef,
    ModelUnavailable,
    RepoInfo,
    check_available,
    locate,
    pull,
    select_files,
)
from counterfactual.readers.download import RemoteFile
from counterfactual.readers.generate import generate_coco

REPO = Path(__file__).resolve().parent.parent
SHA = "0123456789abcdef0123456789abcdef01234567"

SD_FILES = (
    ".gitattributes",
    "README.md",
    "512-inpainting-ema.ckpt",
    "512-inpainting-ema.safetensors",
    "model_index.json",
    "scheduler/scheduler_config.json",
    "text_encoder/config.json",
    "text_encoder/model.safetensors",
    "text_encoder/model.fp16.safetensors",
    "text_encoder/pytorch_model.bin",
    "tokenizer/merges.txt",
    "tokenizer/special_tokens_map.json",
    "tokenizer/tokenizer_config.json",
    "tokenizer/vocab.json",
    "unet/config.json",
    "unet/diffusion_pytorch_model.safetensors",
    "unet/diffusion_pytorch_model.fp16.safetensors",
    "unet/diffusion_pytorch_model.non_ema.safetensors",
    "unet/diffusion_pytorch_model.bin",
    "vae/config.json",
    "vae/diffusion_pytorch_model.safetensors",
    "feature_extractor/preprocessor_config.json",
)


def test_select_files_takes_safetensors_the_variant_and_no_single_file_checkpoint():
    plain = select_files(SD_FILES)
    assert "unet/diffusion_pytorch_model.safetensors" in plain
    assert not any(f.endswith((".bin", ".ckpt")) for f in plain)
    assert "512-inpainting-ema.safetensors" not in plain  # beside the pipeline's folders
    assert "unet/diffusion_pytorch_model.fp16.safetensors" not in plain
    assert "unet/diffusion_pytorch_model.non_ema.safetensors" not in plain
    assert "README.md" not in plain and ".gitattributes" not in plain
    assert {"model_index.json", "tokenizer/vocab.json", "unet/config.json"} <= set(plain)
    fp16 = select_files(SD_FILES, "fp16")
    assert "unet/diffusion_pytorch_model.fp16.safetensors" in fp16
    assert "text_encoder/model.fp16.safetensors" in fp16
    assert "unet/diffusion_pytorch_model.safetensors" not in fp16
    # a folder without the variant keeps its plain weights
    assert "vae/diffusion_pytorch_model.safetensors" in fp16
    # a transformers repo: weights at the top
    clip = select_files(["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5"])
    assert clip == ["config.json", "model.safetensors"]


def test_a_repo_without_safetensors_is_the_wrong_format():
    with pytest.raises(ModelUnavailable, match=r"wrong format: no safetensors weights \(only"):
        select_files(["config.json", "pytorch_model.bin", "flax_model.msgpack"])


def fake_cache(cache: Path, repo_id: str, source: Path, commit: str = SHA) -> Path:
    """``source``'s files as huggingface_hub's cache holds a download of ``repo_id`` at
    ``commit``: blobs by content hash, snapshot links to them, ``refs/main``."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory):
    from tiny_clip import build_tiny_clip

    return build_tiny_clip(tmp_path_factory.mktemp("clip") / "tiny-clip")


def test_locate_finds_a_cached_snapshot_and_its_commit(tmp_path, tiny_clip):
    cache = tmp_path / "hub"
    snapshot = fake_cache(cache, "org/tiny-clip", tiny_clip)
    ref = ModelRef("verifier", "--verify-model", "hub", "org/tiny-clip")
    found = locate(ref, cache)
    assert found.present and found.source == "cache"
    assert found.revision == SHA and found.path == str(snapshot)
    assert "model.safetensors" in found.files
    missing = locate(ModelRef("verifier", "--verify-model", "hub", "org/other"), cache)
    assert not missing.present and "not in the Hugging Face cache" in missing.problem
    assert missing.to_dict()["problem"] == missing.problem


@pytest.mark.slow
def test_the_fake_cache_is_one_transformers_loads_offline(tmp_path, tiny_clip):
    """What ``locate`` calls present, transformers loads by hub id with no network, through
    the same spec the verifier takes; and ``models list`` says so."""
    cache = tmp_path / "hf" / "hub"
    fake_cache(cache, "org/tiny-clip", tiny_clip)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    code = (
        "from counterfactual.models.embed import load_embedder\n"
        "e = load_embedder('hf-clip:org/tiny-clip', device='cpu')\n"
        "print(e.embed_texts(['a dog']).shape)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("(1, ")
    config = tmp_path / "c.yaml"
    config.write_text("image_method: blur\nverify: true\nverify_model: hf-clip:org/tiny-clip\n")
    listed = subprocess.run(
        [sys.executable, "-m", "counterfactual", "models", "list", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    assert "org/tiny-clip" in listed.stdout and SHA in listed.stdout and " ok " in listed.stdout


def test_pull_downloads_the_selected_files_at_the_resolved_commit(tmp_path, tiny_clip):
    cache = tmp_path / "hub"
    calls = []
    files = tuple(p.name for p in tiny_clip.iterdir()) + ("pytorch_model.bin", "README.md")

    def repo_info(repo_id):
        calls.append(("info", repo_id))
        return RepoInfo(SHA, files)

    def snapshot(repo_id, *, revision, allow_patterns, cache_dir=None, local_dir=None):
        calls.append(("snapshot", repo_id, revision, tuple(allow_patterns), cache_dir, local_dir))
        assert revision == SHA
        if local_dir is not None:
            shutil.copytree(tiny_clip, local_dir, dirs_exist_ok=True)
            return local_dir
        snap = fake_cache(Path(cache_dir), repo_id, tiny_clip)
        (snap.parent.parent / "refs" / "main").unlink()  # a download at a commit writes no ref
        return str(snap)

    ref = ModelRef("verifier", "--verify-model", "hub", "org/tiny-clip")
    found = pull(ref, cache_dir=cache, repo_info=repo_info, snapshot=snapshot)
    assert found.present and found.revision == SHA and found.source == "cache"
    wanted = calls[1][3]
    assert "model.safetensors" in wanted and "pytorch_model.bin" not in wanted
    assert "README.md" not in wanted
    # refs/main points at the commit, so an offline from_pretrained("org/tiny-clip") finds it
    assert locate(ref, cache).revision == SHA
    # present now: a second pull asks nothing
    calls.clear()
    assert pull(ref, cache_dir=cache, repo_info=repo_info, snapshot=snapshot).revision == SHA
    assert calls == []
    # into a folder: DIR/ORG/NAME
    out = pull(ref, tmp_path / "models", repo_info=repo_info, snapshot=snapshot)
    assert out.source == "folder" and out.path == str(tmp_path / "models" / "org" / "tiny-clip")


def _response(status):
    import httpx2

    return httpx2.Response(status, request=httpx2.Request("GET", "http://127.0.0.1/api"))


@pytest.mark.parametrize(
    "error, says",
    [
        ("RepositoryNotFoundError", "not found on the Hub (404"),
        ("GatedRepoError", "gated: accept its terms"),
        ("OfflineModeIsEnabled", "offline (HF_HUB_OFFLINE=1)"),
        ("ConnectError", "no network (ConnectError"),
    ],
)
def test_pull_says_why_a_model_cannot_be_had_in_one_line(tmp_path, error, says):
    import httpx2
    from huggingface_hub import errors

    def repo_info(repo_id):
        if error == "ConnectError":
            raise httpx2.ConnectError("[Errno -2] Name or service not known")
        if error == "OfflineModeIsEnabled":
            raise errors.OfflineModeIsEnabled("offline")
        raise getattr(errors, error)("nope", response=_response(404))

    ref = ModelRef("inpainter", "--inpaint-model", "hub", "gone/model")
    with pytest.raises(ModelUnavailable) as info:
        pull(ref, cache_dir=tmp_path, repo_info=repo_info, snapshot=None)
    line = str(info.value)
    assert line.startswith("inpainter gone/model (--inpaint-model): ") and says in line
    assert "\n" not in line


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass


@pytest.fixture
def file_server(tmp_path):
    """A file server on 127.0.0.1 over ``tmp_path/www``; yields its base URL."""
    root = tmp_path / "www"
    root.mkdir()
    handler = lambda *a, **k: _Files(*a, directory=str(root), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _serve_lama(monkeypatch, root: Path, base: str, md5: str | None = None) -> bytes:
    from tiny_lama import build_tiny_lama

    data = build_tiny_lama(root / "big-lama.pt").read_bytes()
    real = KNOWN_FILES["big-lama.pt"]
    served = RemoteFile(
        name=real.name,
        url=f"{base}/big-lama.pt",
        size=None,
        sha256=None,
        md5=md5 or hashlib.md5(data).hexdigest(),
        extract_to=".",
        source_note="the test's",
        part="lama",
    )
    monkeypatch.setitem(KNOWN_FILES, "big-lama.pt", served)
    return data


def test_lama_is_fetched_checked_and_loads(tmp_path, file_server, monkeypatch):
    root, base = file_server
    data = _serve_lama(monkeypatch, root, base)
    target = tmp_path / "models" / "big-lama.pt"
    ref = ModelRef("inpainter", "--inpaint-model", "file", str(target))
    found = pull(ref)
    assert target.read_bytes() == data
    assert found.revision == f"sha256:{hashlib.sha256(data).hexdigest()}"
    assert not (target.parent / ".big-lama.pt.download").exists()
    # the file the run names loads through the lama backend
    from counterfactual.image import LamaConfig
    from counterfactual.image.lama import LamaInpainter

    assert LamaInpainter(LamaConfig(model=str(target))).describe()["model_sha256"] == (
        hashlib.sha256(data).hexdigest()
    )
    # --to DIR puts it in DIR
    moved = pull(ref, tmp_path / "elsewhere")
    assert moved.path == str(tmp_path / "elsewhere" / "big-lama.pt")


def test_a_lama_file_with_the_wrong_checksum_is_refused(tmp_path, file_server, monkeypatch):
    root, base = file_server
    _serve_lama(monkeypatch, root, base, md5="0" * 32)
    target = tmp_path / "big-lama.pt"
    with pytest.raises(ModelUnavailable, match="md5 mismatch: expected 0{32}"):
        pull(ModelRef("inpainter", "--inpaint-model", "file", str(target)))
    assert not target.exists()


def test_an_unknown_missing_file_is_not_fetched(tmp_path):
    ref = ModelRef("inpainter", "--inpaint-model", "file", str(tmp_path / "mine.pt"))
    with pytest.raises(ModelUnavailable, match="not a file this command knows how to fetch"):
        pull(ref)


def test_check_available_offline_names_each_model_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    refs = [
        ModelRef("inpainter", "--inpaint-model", "file", str(tmp_path / "big-lama.pt")),
        ModelRef("verifier", "--verify-model", "hub", "openai/clip-vit-large-patch14"),
    ]

    def no_call(repo_id):
        raise AssertionError("offline: no hub call")

    with pytest.raises(ModelUnavailable) as info:
        check_available(
            refs,
            "counterfactual models pull --config c.yaml",
            cache_dir=tmp_path,
            repo_info=no_call,
        )
    line = str(info.value)
    assert line.startswith("models not available: inpainter ")
    assert "file not found" in line and "offline (HF_HUB_OFFLINE=1)" in line
    assert line.endswith("Fetch with `counterfactual models pull --config c.yaml`")
    # online, a model the hub has is fine (its weights download as the run loads it)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    ok = check_available(
        refs[1:], "x", cache_dir=tmp_path, repo_info=lambda r: RepoInfo(SHA, ("model.safetensors",))
    )
    assert ok[0].source == "hub" and ok[0].revision == SHA


def test_each_config_names_its_models():
    coco = config_models("coco")
    assert [(r.role, r.kind, r.name) for r in coco] == [
        ("inpainter", "file", "models/big-lama.pt"),
        ("verifier", "hub", "openai/clip-vit-large-patch14"),
    ]
    rorem = config_models("coco-rorem")
    assert rorem[0] == ModelRef("inpainter", "--inpaint-model", "hub", "LetsThink/RORem", "fp16")
    wds = config_models("wds")
    assert wds[0].role == "detector" and wds[0].name == "google/owlv2-base-patch16-ensemble"
    assert [r.role for r in config_models("demo")] == []
    # synth options after `--` change them
    sd2 = config_models(
        "coco",
        ["--", "--inpaint-backend", "diffusers", "--dtype", "float32", "--filter"]
        + ["--inpaint-model", "sd2-community/stable-diffusion-2-inpainting"],
    )
    assert sd2[0] == ModelRef(
        "inpainter", "--inpaint-model", "hub", "sd2-community/stable-diffusion-2-inpainting"
    )
    captioner = config_models("demo", ["--text-method", "captioner"])
    assert [r.role for r in captioner] == ["captioner"]


def test_no_config_names_a_deleted_model():
    texts = [
        p.read_text() for p in (REPO / "counterfactual" / "pipelines" / "configs").glob("*.yaml")
    ]
    code = [p.read_text() for p in (REPO / "counterfactual").rglob("*.py")]
    assert not any("stabilityai/stable-diffusion-2-inpainting" in t for t in texts)
    deleted = [t for t in code if '"stabilityai/stable-diffusion-2-inpainting"' in t]
    assert len(deleted) == 1  # only as the retired default old runs recorded (synth/plan.py)


def test_pull_command_keeps_the_options_that_decide_the_models():
    argv = [
        "synth",
        "--config",
        "c.yaml",
        "--out",
        "o",
        "--verify-model=hf-clip:x/y",
        "--inpaint-backend",
        "diffusers",
        "--filter",
        "--runner",
        "ray",
    ]
    assert pull_command("c.yaml", argv) == (
        "counterfactual models pull --config c.yaml -- --verify-model=hf-clip:x/y "
        "--inpaint-backend diffusers --filter"
    )
    assert pull_command(None) == "counterfactual models pull"


def test_models_list_json_and_exit_code(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models", "list", "--config", "coco", "--json"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["role"] for r in rows] == ["inpainter", "verifier"]
    assert rows[0]["source"] == "missing" and rows[0]["problem"] == "file not found"
    assert main(["models", "list", "--config", "demo"]) == 0


@pytest.mark.slow
def test_synth_coco_without_weights_ends_in_one_line(tmp_path):
    """`make synth DATASET=coco` with nothing fetched: offline, an empty HF_HOME, the bundled
    config: one line naming the models, why, and the pull command; exit 2, no traceback."""
    files = generate_coco(tmp_path / "coco", 3, seed=1, size=(64, 48))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("HF_")},
        "HF_HOME": str(tmp_path / "empty-hf"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(REPO),
    }
    config = REPO / "counterfactual" / "pipelines" / "configs" / "coco.yaml"
    args = synth_args(files, tmp_path / "out", "--config", str(config), "--runner", "ray")
    proc = subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("counterfactual synth: error: models not available: "), line
    assert "inpainter models/big-lama.pt (--inpaint-model): file not found" in line
    assert "verifier openai/clip-vit-large-patch14 (--verify-model): offline" in line
    # the options of the command line that decide the models come along (here --dataset)
    fix = f"counterfactual models pull --config {config} -- --dataset coco"
    assert line.endswith(f"Fetch with `{fix}`"), line
    assert not (tmp_path / "out" / "run.lock").exists()


def test_the_manifest_records_each_models_revision(tmp_path):
    from tiny_lama import build_tiny_lama

    from counterfactual.image import ImageConfig, LamaConfig
    from counterfactual.synth.models import model_records
    from counterfactual.synth.plan import SynthConfig

    path = build_tiny_lama(tmp_path / "big-lama.pt")
    config = SynthConfig(image=ImageConfig(backend="lama", lama=LamaConfig(model=str(path))))
    [record] = model_records(config)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert record == {
        "role": "inpainter",
        "option": "--inpaint-model",
        "name": str(path),
        "source": "file",
        "revision": f"sha256:{digest}",
        "path": str(path),
    }
    assert model_records(SynthConfig(image=ImageConfig(method="blur"))) == []


def test_located_to_dict_is_json():
    loc = Located(
        ModelRef("captioner", "--captioner-model", "hub", "a/b", "fp16"), "cache", "/x", SHA
    )
    assert json.loads(json.dumps(loc.to_dict()))["variant"] == "fp16"
    assert hub.is_local("./a/b") and hub.is_local("/a") and not hub.is_local("org/name")


def test_a_cache_with_bin_weights_is_usable_but_not_what_pull_fetches(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text("{}")
    (source / "pytorch_model.bin").write_bytes(b"weights")
    fake_cache(tmp_path / "hub", "org/old", source)
    found = locate(ModelRef("verifier", "--verify-model", "hub", "org/old"), tmp_path / "hub")
    assert found.present  # transformers loads .bin: a run may use it
    with pytest.raises(ModelUnavailable, match="no safetensors"):
        select_files(found.files)
    (source / "pytorch_model.bin").unlink()
    fake_cache(tmp_path / "hub", "org/empty", source)
    empty = locate(ModelRef("verifier", "--verify-model", "hub", "org/empty"), tmp_path / "hub")
    assert empty.problem == "wrong format: no weights at all"


def test_models_pull_fetches_what_it_can_and_names_the_rest(
    tmp_path, file_server, monkeypatch, capsys
):
    """Offline (as the suite runs): LaMa comes from the local server, the verifier's CLIP
    cannot be had, and one line says so (exit 2)."""
    root, base = file_server
    _serve_lama(monkeypatch, root, base)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert main(["models", "pull", "--config", "coco"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (tmp_path / "models" / "big-lama.pt").is_file()
    assert err[-1].startswith("counterfactual models: error: verifier openai/clip-vit-large")
    assert "offline" in err[-1]


@pytest.mark.parametrize(
    "name",
    sorted(p.stem for p in (REPO / "counterfactual" / "pipelines" / "configs").glob("*.yaml")),
)
def test_every_bundled_config_loads_and_names_existing_kinds(name):
    for ref in config_models(name):
        assert ref.kind in hub.KINDS and ref.name
        assert ref.name != "stabilityai/stable-diffusion-2-inpainting"
