"""A run's entry checks run once and early (issue 34 point 2): OUT, the models and the device
are checked before the input is read (reading COCO's annotations takes seconds), each failing
in the one line it always had; the models a run lacks are found in one pass that a real run
stops on and a dry run prints in full; one rule says whether a model name is a path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.cli import main
from counterfactual.readers.generate import CocoFiles, generate_coco

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> CocoFiles:
    return generate_coco(tmp_path_factory.mktemp("coco"), 4, seed=3, size=(96, 72))


@pytest.fixture
def unreadable(coco, tmp_path) -> CocoFiles:
    """The dataset with annotations that are not JSON: a run that reads them fails on them, so
    a line about anything else shows it was found before the input was read."""
    instances = tmp_path / "instances.json"
    instances.write_text("{ not json")
    return CocoFiles(instances, coco.captions, coco.images)


@pytest.fixture
def reads(monkeypatch) -> list[object]:
    """Every time the CLI opens a run's input, counted."""
    import counterfactual.cli.synth as cli_synth

    seen: list[object] = []
    real = cli_synth.open_input

    def counted(spec, images_per_shard):
        seen.append(spec)
        return real(spec, images_per_shard)

    monkeypatch.setattr(cli_synth, "open_input", counted)
    return seen


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    env["HF_HUB_CACHE"] = str(cwd / "empty-hub-cache")
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def only_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# --- OUT: checked before the input is read ------------------------------------------------------


def test_an_out_that_cannot_be_made_fails_before_the_input_is_read(unreadable, tmp_path):
    """As a user types it: the annotations are broken too, but the line is OUT's (the input
    was never read), the line it was before the refactor."""
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out"
    done = cli(*synth_args(unreadable, out, "--image-method", "blur"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = only_line(done.stderr)
    assert line.startswith(f"counterfactual synth: error: --out {out}: cannot create the folder ")
    assert "Not a directory" in line


def test_an_out_that_is_a_file_is_refused_without_reading(coco, tmp_path, capsys, reads):
    out = tmp_path / "out"
    out.write_text("mine")
    assert main(synth_args(coco, out, "--image-method", "blur")) == 2
    assert only_line(capsys.readouterr().err) == (
        f"counterfactual synth: error: --out {out}: is a file, not a folder"
    )
    assert reads == [] and out.read_text() == "mine"


def test_a_good_run_reads_its_input_once(coco, tmp_path, capsys, reads):
    out = tmp_path / "out"
    argv = synth_args(coco, out, "--image-method", "blur", "--contact-sheet", "0")
    assert main(argv) == 0
    assert len(reads) == 1
    assert (out / "status.jsonl").is_file()


# --- the device: one line up front with the local runner ---------------------------------------


def test_cuda_without_cuda_is_one_line_before_the_input_is_read(coco, tmp_path, capsys, reads):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    out = tmp_path / "out"
    argv = synth_args(coco, out, "--image-method", "inpaint", "--inpaint-backend", "opencv")
    assert main([*argv, "--device", "cuda"]) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("counterfactual synth: error: --device cuda: "), line
    assert "could not start" not in line
    assert reads == [] and not out.exists()


# --- the models: one pass, a real run stops on it, a dry run prints it ------------------------


def test_a_run_names_every_missing_model_in_one_line_before_reading(unreadable, tmp_path):
    """A local model file of the user's (no pull fetches it) and a hub model not in the cache
    (offline): one line names both, with the pull command; OUT is not made."""
    out = tmp_path / "out"
    argv = synth_args(unreadable, out, "--image-method", "inpaint", "--inpaint-backend", "lama")
    argv += ["--inpaint-model", "models/mine.pt", "--verify"]
    done = cli(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    line = only_line(done.stderr)
    assert line.startswith(
        f"counterfactual synth: error: Inpaint: the model {tmp_path}/models/mine.pt does not "
        "exist; pass --inpaint-model a hub id or an existing folder or file; model not "
        "available: verifier openai/clip-vit-base-patch32 (--verify-model): offline "
    ), line
    assert line.endswith("--inpaint-model models/mine.pt --verify`"), line  # the pull command
    assert not out.exists()


def test_missing_models_is_one_pass_over_paths_and_hub_models(tmp_path, monkeypatch):
    from counterfactual.image import ImageConfig, LamaConfig
    from counterfactual.method.verify import VerifyConfig
    from counterfactual.models.hub import ModelUnavailable
    from counterfactual.synth.models import missing_models
    from counterfactual.synth.plan import SynthConfig
    from counterfactual.synth.staging import SetupError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    lama = ImageConfig(
        method="inpaint", backend="lama", lama=LamaConfig(model=str(tmp_path / "x.pt"))
    )
    config = SynthConfig(image=lama, verify=VerifyConfig(mode="record", model="hf-clip:org/clip"))
    missing = missing_models(config)
    assert [p.option for p in missing.paths] == ["--inpaint-model"]
    assert [m.ref.name for m in missing.unavailable] == ["org/clip"]
    assert isinstance(missing.error("fix"), ModelUnavailable)
    local_only = missing_models(config, hub=False)  # a library run: the steps load the rest
    assert local_only.unavailable == () and len(local_only.paths) == 1
    assert isinstance(local_only.error("fix"), SetupError)
    (tmp_path / "x.pt").write_bytes(b"x")
    assert not missing_models(config, hub=False)
    assert not missing_models(SynthConfig())  # blur: no model


@pytest.mark.slow
def test_a_dry_run_prints_every_missing_model(tmp_path):
    done = cli("synth", "--config", "coco", "--dry-run", "--device", "cpu", "--num-cpus", "1",
               "--no-dashboard", "--inpaint-model", "models/mine.pt", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["cpus"] == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(
        f"counterfactual synth: dry run: Inpaint: the model {tmp_path}/models/mine.pt does not "
        "exist; pass --inpaint-model a hub id or an existing folder or file; model not "
        "available: verifier openai/clip-vit-large-patch14 (--verify-model): "
    ), line


# --- one rule for "is this model name a path" --------------------------------------------------


def test_models_list_takes_a_bare_name_for_a_hub_id(tmp_path):
    """``gpt2`` (a hub id without an org) is looked for in the Hugging Face cache, as the run
    loads it, not as a folder of the working directory."""
    done = cli("models", "list", "--json", "--", "--text-method", "captioner",
               "--captioner-model", "gpt2", cwd=tmp_path)  # fmt: skip
    records = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    (captioner,) = [r for r in records if r.get("role") == "captioner"]
    assert captioner["name"] == "gpt2" and captioner["source"] == "missing", done.stdout
    assert "path" not in captioner  # not ./gpt2
    assert "Hugging Face cache" in captioner["problem"], captioner
