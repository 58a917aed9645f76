"""A model folder is data: nothing in it runs, and a model that does not load is one line.

Each scenario runs the real CLI in a process with ``y`` waiting on stdin (what transformers'
``Do you wish to run the custom code? [y/N]`` would read) and a fresh ``HF_HOME`` and
``HF_MODULES_CACHE``: a folder whose config names code (``auto_map``, a ``model_index.json``
naming a custom pipeline or component) is refused with one line naming the file, exit 2; the
folder's module never runs (no marker file) and nothing is copied into the modules cache.
Weights torch refuses to unpickle, a corrupt safetensors file, a diffusers pipeline class
diffusers does not have and a Ray that does not start are one line too. ``models list`` and
``models pull`` check a known file against its published checksum.

Each family keeps its processes: a folder's code (a verifier's ``config.json``, a diffusers
custom pipeline), weights torch refuses (the verifier's, open_clip's), a Ray that does not
start, ``models list``. The other cases (the detector, captioner and eval model folders, the
second config of a verifier, the other ``model_index.json`` edits, a diffusers component, a
corrupt detector safetensors, a diffusers pickle) call ``main`` in this process instead
(:func:`cli_here`), with the same ``y`` on stdin and transformers' and diffusers' modules cache
pointed at a fresh folder: the same line, exit code and checks, without another interpreter
start.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_models_hub import _serve_lama, file_server  # noqa: F401  (the local file server)

from counterfactual.cli import main
from counterfactual.testing.corpora import demo_samples, write_wds

REPO = Path(__file__).resolve().parents[1]
PREFIX = "counterfactual {}: error: "

EVIL = """\
from pathlib import Path
Path({marker!r}).write_text("ran")
raise SystemExit("the folder's code ran")
"""


def poison(folder: Path, marker: Path, config: str = "config.json") -> Path:
    """``folder``'s ``config`` given an ``auto_map`` naming ``evil.py``, which writes
    ``marker`` when imported."""
    path = folder / config
    data = json.loads(path.read_text())
    data["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    path.write_text(json.dumps(data))
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    return path


def cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """``python -m counterfactual ARGS`` as a user runs it, ``y`` on stdin; its exit code and
    stderr lines."""
    environ = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        input="y\ny\n",
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
        cwd=tmp_path,
    )
    return done.returncode, done.stderr.strip().splitlines()


def cli_here(tmp_path: Path, monkeypatch, capsys, *args: str) -> tuple[int, list[str]]:
    """:func:`cli` in this process: ``main(ARGS)`` in ``tmp_path`` with ``y`` on stdin and
    transformers' and diffusers' modules cache (where a folder's code would be copied) in
    ``tmp_path / "modules"``; its exit code and stderr lines."""
    import diffusers.utils.dynamic_modules_utils as diffusers_modules
    import transformers.dynamic_module_utils as transformers_modules

    modules = str(tmp_path / "modules")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_MODULES_CACHE", modules)
    monkeypatch.setattr(transformers_modules, "HF_MODULES_CACHE", modules)
    monkeypatch.setattr(diffusers_modules, "HF_MODULES_CACHE", modules)
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\n"))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = main(list(args))
    return code, capsys.readouterr().err.strip().splitlines()


def error_line(command: str, code: int, lines: list[str]) -> str:
    """The one error line a setup error ends in (a run may print its plan line first)."""
    text = "\n".join(lines)
    assert code == 2, text
    assert "Traceback" not in text and "[y/N]" not in text, text
    errors = [line for line in lines if line.startswith(PREFIX.format(command))]
    assert len(errors) == 1 and errors[0] == lines[-1], text
    assert len(errors[0]) <= 400 + len(PREFIX.format(command)), errors[0]
    return errors[0]


def nothing_ran(tmp_path: Path, marker: Path) -> None:
    assert not marker.exists(), "the model folder's code ran"
    cached = list((tmp_path / "modules").rglob("evil*")) if (tmp_path / "modules").exists() else []
    assert cached == [], cached


def demo_synth(out: Path, *extra: str) -> list[str]:
    return ["synth", "--dataset", "demo", "--out", str(out), "--contact-sheet", "0", *extra]


# --- the model folders, built once and copied per test ------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    from tiny_captioner import build_tiny_blip
    from tiny_clip import build_tiny_clip

    from counterfactual.testing import build_tiny_inpaint_pipeline, build_tiny_owlv2

    root = tmp_path_factory.mktemp("models")
    return {
        "clip": build_tiny_clip(root / "clip"),
        "owlv2": build_tiny_owlv2(root / "owlv2"),
        "blip": build_tiny_blip(root / "blip"),
        "sd": build_tiny_inpaint_pipeline(root / "sd"),
    }


def copy(built: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built[name], tmp_path / name))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("corpus")
    return write_wds(demo_samples(root / "pictures")[:3], root / "wds", per_shard=3)


# --- code a folder brings never runs -----------------------------------------------------------


def test_a_detector_folder_with_code_is_refused(built, corpus, tmp_path, monkeypatch, capsys):
    folder = copy(built, "owlv2", tmp_path)
    marker = tmp_path / "MARKER"
    config = poison(folder, marker)
    args = ["synth", "--dataset", "wds", "--root", corpus, "--out", str(tmp_path / "out")]
    args += ["--detector-model", str(folder), "--image-method", "blur"]
    code, lines = cli_here(tmp_path, monkeypatch, capsys, *args)
    line = error_line("synth", code, lines)
    assert f"{config}: auto_map names code the folder brings" in line, line
    assert "evil.py" in line and "trust_remote_code=False" in line, line
    nothing_ran(tmp_path, marker)


@pytest.mark.parametrize("config", ["config.json", "tokenizer_config.json"])
def test_a_verifier_folder_with_code_is_refused(built, tmp_path, monkeypatch, capsys, config):
    """``config.json`` in a process, ``tokenizer_config.json`` in this one."""
    folder = copy(built, "clip", tmp_path)
    marker = tmp_path / "MARKER"
    named = poison(folder, marker, config)
    out = tmp_path / "out"
    args = demo_synth(
        out, "--image-method", "blur", "--verify", "--verify-model", f"hf-clip:{folder}"
    )
    if config == "config.json":
        code, lines = cli(tmp_path, *args)
    else:
        code, lines = cli_here(tmp_path, monkeypatch, capsys, *args)
    line = error_line("synth", code, lines)
    assert f"{named}: auto_map names code the folder brings" in line, line
    nothing_ran(tmp_path, marker)
    assert not list(out.glob("shard-*.tar"))


def test_a_captioner_folder_with_code_is_refused(built, tmp_path, monkeypatch, capsys):
    folder = copy(built, "blip", tmp_path)
    marker = tmp_path / "MARKER"
    config = poison(folder, marker)
    args = demo_synth(tmp_path / "out", "--image-method", "blur", "--text-method", "captioner")
    code, lines = cli_here(tmp_path, monkeypatch, capsys, *args, "--captioner-model", str(folder))
    line = error_line("synth", code, lines)
    assert f"{config}: auto_map names code the folder brings" in line, line
    nothing_ran(tmp_path, marker)


def test_an_eval_model_folder_with_code_is_refused(built, tmp_path, monkeypatch, capsys):
    folder = copy(built, "clip", tmp_path)
    marker = tmp_path / "MARKER"
    config = poison(folder, marker)
    queries = tmp_path / "queries"
    assert main(demo_synth(queries, "--image-method", "blur")) == 0
    args = ["eval", "--queries", str(queries), "--out", str(tmp_path / "report")]
    code, lines = cli_here(tmp_path, monkeypatch, capsys, *args, "--model", f"hf-clip:{folder}")
    line = error_line("eval", code, lines)
    assert f"{config}: auto_map names code the folder brings" in line, line
    nothing_ran(tmp_path, marker)


def _inpaint(folder: Path, out: Path) -> list[str]:
    args = ["--image-method", "inpaint", "--inpaint-backend", "diffusers"]
    return demo_synth(out, *args, "--inpaint-model", str(folder), "--steps", "1")


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("_class_name", ["evil", "EvilPipeline"], "names a custom pipeline"),
        ("unet", ["evil", "EvilUNet"], "component 'unet' comes from 'evil'"),
        ("_class_name", "NoSuchPipeline", "is not a pipeline class of diffusers"),
    ],
)
def test_a_diffusers_folder_naming_code_or_an_unknown_class_is_refused(
    built, tmp_path, monkeypatch, capsys, key, value, says
):
    """The custom pipeline in a process, the other two in this one."""
    folder = copy(built, "sd", tmp_path)
    marker = tmp_path / "MARKER"
    index = folder / "model_index.json"
    data = json.loads(index.read_text())
    data[key] = value
    index.write_text(json.dumps(data))
    (folder / "evil.py").write_text(EVIL.format(marker=str(marker)))
    args = _inpaint(folder, tmp_path / "out")
    if key == "_class_name" and value == ["evil", "EvilPipeline"]:
        code, lines = cli(tmp_path, *args)
    else:
        code, lines = cli_here(tmp_path, monkeypatch, capsys, *args)
    line = error_line("synth", code, lines)
    assert f"{index}: " in line and says in line, line
    nothing_ran(tmp_path, marker)


def test_a_diffusers_component_with_code_is_refused(built, tmp_path, monkeypatch, capsys):
    """In this process (the diffusers folders' process is the custom pipeline's)."""
    folder = copy(built, "sd", tmp_path)
    marker = tmp_path / "MARKER"
    config = poison(folder / "text_encoder", marker)
    code, lines = cli_here(tmp_path, monkeypatch, capsys, *_inpaint(folder, tmp_path / "out"))
    line = error_line("synth", code, lines)
    assert f"{config}: auto_map names code the folder brings" in line, line
    nothing_ran(tmp_path, marker)


# --- weights that do not load: one line naming the file -----------------------------------------


def evil_pickle(path: Path, marker: Path) -> Path:
    """A torch checkpoint whose unpickling would run a command that writes ``marker``."""
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"weight": Evil()}, path)
    return path


def test_a_verifier_pickle_torch_refuses_is_one_line(built, tmp_path):
    folder = copy(built, "clip", tmp_path)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "PICKLED"
    weights = evil_pickle(folder / "pytorch_model.bin", marker)
    out = tmp_path / "out"
    args = demo_synth(
        out, "--image-method", "blur", "--verify", "--verify-model", f"hf-clip:{folder}"
    )
    code, lines = cli(tmp_path, *args)
    line = error_line("synth", code, lines)
    assert f"{weights}: torch refused to unpickle it (weights_only" in line, line
    assert "posix.system" in line, line
    assert not marker.exists()


def test_a_corrupt_detector_safetensors_is_one_line(built, corpus, tmp_path, monkeypatch, capsys):
    folder = copy(built, "owlv2", tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\xff" * 64)
    args = ["synth", "--dataset", "wds", "--root", corpus, "--out", str(tmp_path / "out")]
    args += ["--detector-model", str(folder), "--image-method", "blur"]
    code, lines = cli_here(tmp_path, monkeypatch, capsys, *args)
    line = error_line("synth", code, lines)
    assert f"{weights}: not a readable safetensors file" in line, line


def test_a_diffusers_pickle_torch_refuses_is_one_line(built, tmp_path, monkeypatch, capsys):
    folder = copy(built, "sd", tmp_path)
    (folder / "unet" / "diffusion_pytorch_model.safetensors").unlink()
    marker = tmp_path / "PICKLED"
    weights = evil_pickle(folder / "unet" / "diffusion_pytorch_model.bin", marker)
    code, lines = cli_here(tmp_path, monkeypatch, capsys, *_inpaint(folder, tmp_path / "out"))
    line = error_line("synth", code, lines)
    assert str(weights) in line and "torch refused to unpickle it" in line, line
    assert not marker.exists()


@pytest.mark.slow
def test_an_open_clip_pickle_torch_refuses_is_one_line(tmp_path):
    pytest.importorskip("open_clip")
    marker = tmp_path / "PICKLED"
    weights = evil_pickle(tmp_path / "epoch_1.pt", marker)
    queries = tmp_path / "queries"
    assert main(demo_synth(queries, "--image-method", "blur")) == 0
    args = ["eval", "--queries", str(queries), "--out", str(tmp_path / "report")]
    code, lines = cli(tmp_path, *args, "--model", f"open_clip:RN50:{weights}")
    line = error_line("eval", code, lines)
    assert f"{weights}: torch refused to unpickle it (weights_only" in line, line
    assert not marker.exists()


# --- Ray -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["env", "option"])
def test_a_ray_that_does_not_start_is_one_line(tmp_path, how):
    """No cluster where one is named (``auto`` finds none): one line with the cause and the
    fix, no Ray traceback."""
    pytest.importorskip("ray")
    from ray._private.services import find_gcs_addresses

    find_gcs_addresses.cache_clear()
    if find_gcs_addresses():  # ``auto`` joins any Ray running on this machine
        pytest.skip(
            f"a Ray runs on this machine ({', '.join(find_gcs_addresses())}): auto finds it"
        )
    args = demo_synth(tmp_path / "out", "--image-method", "blur", "--runner", "ray")
    # ``auto`` also reads the address of a Ray this user started last from RAY_TMPDIR: an
    # empty one, so the address file of a Ray that has stopped is not found either
    alone = {"RAY_TMPDIR": str(tmp_path / "ray-tmp")}
    if how == "option":
        code, lines = cli(tmp_path, *args, "--ray-address", "auto", env=alone)
        named = "--ray-address"
    else:
        code, lines = cli(tmp_path, *args, env={**alone, "RAY_ADDRESS": "auto"})
        named = "RAY_ADDRESS"
    line = error_line("synth", code, lines)
    assert f"Ray did not start: cannot join the cluster at 'auto' ({named}): " in line, line
    assert "ConnectionError: Could not find any running Ray instance" in line, line
    assert line.endswith(f"or unset {named} to start a local Ray"), line


# --- models list / pull check a known file's checksum ----------------------------------------


def test_models_list_calls_a_garbage_lama_damaged(tmp_path):
    target = tmp_path / "models" / "big-lama.pt"
    target.parent.mkdir()
    target.write_bytes(b"not a TorchScript file")
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", "models", "list", "--config", "coco"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_CACHE": str(tmp_path / "hub")},
    )
    assert done.returncode == 1, done.stderr
    [row] = [line for line in done.stdout.splitlines() if line.startswith("inpainter")]
    assert " ok " not in row and "damaged: its MD5 is " in row, row
    assert "not the published e3aa4aaa15225a33ec84f9f4bc47e500" in row, row
    assert done.stderr.strip().startswith("2 missing or damaged: counterfactual models pull")


def test_models_pull_fetches_a_damaged_lama_again(
    tmp_path,
    file_server,  # noqa: F811
    monkeypatch,
    capsys,
):
    root, base = file_server
    data = _serve_lama(monkeypatch, root, base)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    target = tmp_path / "models" / "big-lama.pt"
    target.parent.mkdir()
    target.write_bytes(b"garbage")
    assert main(["models", "list", "--config", "coco", "--json"]) == 1
    [record] = [json.loads(x) for x in capsys.readouterr().out.splitlines() if "lama" in x]
    assert record["problem"].startswith("damaged: its MD5 is ")
    assert main(["models", "pull", "--config", "coco"]) == 2  # the CLIP cannot be had offline
    assert target.read_bytes() == data
    rows = capsys.readouterr().out.splitlines()
    assert any(r.startswith("inpainter") and " ok " in r for r in rows), rows
