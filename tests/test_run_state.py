"""What a run leaves behind and what a rerun is told (issue 22, points 4, 5 and 8): ``run.json``
is written when the first shard starts, a refused rerun names each option that differs, a file
shipped with the package is fingerprinted by name and content, OUT holds only the run's
outputs (no Ray files, no demo pictures), nothing is left in the system temp dir, a run without
samples still opens and says why, ``select`` and shards name images by the same string.

The CLI runs as a user runs it, in a child process, where the message or the temp dir matters."""

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
import webdataset as wds
import yaml

from counterfactual.cli import main
from counterfactual.readers.demo import demo_vocabulary_path, prepare_demo
from counterfactual.synth.plan import SynthConfig, bundled_form, fingerprint_diff

ROOT = Path(__file__).resolve().parents[1]
BASE = ("synth", "--dataset", "demo", "--contact-sheet", "0")
DEMO = (*BASE, "--image-method", "blur")
OUTPUTS = {
    "README.md",
    "manifest.json",
    "run.json",
    "status.jsonl",
    "sizes.json",
    "shardindex.json",
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The demo's pictures in a cache of this test's own (not the user's)."""
    where = tmp_path / "cache"
    monkeypatch.setenv("COUNTERFACTUAL_CACHE", str(where))
    return where


@pytest.fixture
def short_tmp():
    """A fresh, empty system temp dir short enough for Ray's sockets (as ``/tmp`` is)."""
    where = Path(tempfile.mkdtemp(prefix="cft-", dir="/tmp"))
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _child_env(tmp: Path, cache: Path) -> dict[str, str]:
    """The environment of a child run: this checkout first on the path, ``TMPDIR`` ``tmp``."""
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "TMPDIR": str(tmp),
        "COUNTERFACTUAL_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def _cli(*args: str, tmp: Path, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m counterfactual ARGS`` in a child process whose ``TMPDIR`` is ``tmp``."""
    env = _child_env(tmp, cache)
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp.parent,
    )


END = "cf-test: exit code"
DRIVER = f"""
import json, sys
from counterfactual.cli import main
for line in sys.stdin:
    code = main(json.loads(line))
    sys.stderr.flush()
    print("\\n{END}", code, flush=True)
"""
"""``python -m counterfactual`` for each line of stdin (a JSON list of ARGS): ``main(ARGS)``,
then a line with its exit code on stdout."""


@contextlib.contextmanager
def _one_process(tmp: Path, cache: Path, timeout: float = 600):
    """A child process as :func:`_cli` starts it, which runs one command after the other:
    yields ``run(*ARGS) -> (exit code, its stderr)``, which returns while the process lives on
    (paying Python's and the package's start-up once); the process exits 0 at the end."""
    env = _child_env(tmp, cache)
    log = tmp.parent / f"{tmp.name}.stderr"  # outside TMPDIR
    with open(log, "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=err, text=True, env=env, cwd=tmp.parent,
        )  # fmt: skip
    watchdog = threading.Timer(timeout, child.kill)
    watchdog.start()
    read = 0

    def run(*args: str) -> tuple[int, str]:
        nonlocal read
        child.stdin.write(json.dumps(args) + "\n")
        child.stdin.flush()
        for line in child.stdout:
            if line.startswith(END):
                text = log.read_text()
                text, read = text[read:], len(text)
                return int(line.split()[-1]), text
        raise AssertionError(f"the child ended: {log.read_text()[-3000:]}")

    try:
        yield run
        child.stdin.close()
        child.stdout.read()
        assert child.wait() == 0, log.read_text()[-3000:]
    finally:
        watchdog.cancel()
        child.kill()
        child.wait()
        log.unlink(missing_ok=True)


def _outputs(out: Path) -> set[str]:
    return {p.name for p in out.iterdir()}


# --- run.json: when it is written, what a refusal says ------------------------------------------


def test_a_run_that_fails_before_its_first_shard_leaves_no_run_json(tmp_path, cache, capsys):
    out, bad = tmp_path / "out", tmp_path / "bad.pt"
    bad.write_bytes(b"not a TorchScript file")
    argv = [*BASE, "--out", str(out), "--inpaint-backend", "lama", "--inpaint-model", str(bad)]
    assert main(argv) == 2
    assert "Inpaint could not start" in capsys.readouterr().err
    assert not out.exists()  # no run.json, no shard: the OUT it made, left empty, is removed
    # the corrected rerun (another config) is not refused
    assert main([*DEMO, "--out", str(out)]) == 0
    recorded = json.loads((out / "run.json").read_text())
    assert recorded["config"]["image"] == {"method": "blur"}


def test_a_refused_rerun_names_each_option_that_differs(tmp_path, cache):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    first = _cli(*DEMO, "--out", str(out), tmp=tmp, cache=cache)
    assert first.returncode == 0, first.stderr
    again = _cli(
        *BASE, "--image-method", "zero", "--seed", "3", "--dilate", "2", "--out", str(out),
        tmp=tmp, cache=cache,
    )  # fmt: skip
    assert again.returncode == 2
    (line,) = [ln for ln in again.stderr.splitlines() if "error" in ln]
    assert line == (
        f"counterfactual synth: error: {out} holds a run with different config "
        '(mask.dilate: default 0 -> 2; image.method: "blur" -> "zero"; seed: default 0 -> 3); '
        "resuming it would mix two runs. Use another --out, or delete the folder to start over"
    )
    assert os.listdir(tmp) == []


def test_fingerprint_diff_names_parts_switched_on_and_off():
    off = SynthConfig().fingerprint()
    from counterfactual.method.verify import VerifyConfig

    on = SynthConfig(verify=VerifyConfig(mode="record", k=3)).fingerprint()
    assert fingerprint_diff(off, on) == ['verify: off -> {"mode": "record", "k": 3}']
    assert fingerprint_diff(on, off) == ['verify: {"mode": "record", "k": 3} -> off']
    assert fingerprint_diff(on, on) == []


# --- a bundled file by name and content ---------------------------------------------------------


def test_the_demo_vocabulary_is_fingerprinted_by_name_and_content(tmp_path, cache):
    out = tmp_path / "out"
    assert main([*DEMO, "--out", str(out)]) == 0
    text = (out / "run.json").read_text()
    digest = hashlib.sha256(demo_vocabulary_path().read_bytes()).hexdigest()
    vocabulary = json.loads(text)["config"]["text"]["vocabulary"]
    assert vocabulary == f"bundled:demo_synonyms.txt@sha256:{digest}"
    package = str(demo_vocabulary_path().parents[1])
    assert package not in text and str(ROOT) not in text  # no install-dependent path


def test_the_same_file_in_another_install_has_the_same_fingerprint(tmp_path):
    here = SynthConfig(vocabulary=str(demo_vocabulary_path())).fingerprint()
    other = tmp_path / "venv" / "site-packages" / "counterfactual" / "data"
    other.mkdir(parents=True)
    shutil.copy(demo_vocabulary_path(), other / "demo_synonyms.txt")
    there = SynthConfig(vocabulary=str(other / "demo_synonyms.txt")).fingerprint()
    assert there == here
    (other / "demo_synonyms.txt").write_text("person\n")  # same name, other words
    changed = SynthConfig(vocabulary=str(other / "demo_synonyms.txt")).fingerprint()
    assert changed != here and fingerprint_diff(here, changed)[0].startswith("text.vocabulary:")
    # a user's own file keeps its path; so does a file the package does not ship
    mine = tmp_path / "counterfactual" / "data" / "my_words.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("person\n")
    assert bundled_form(str(mine)) == str(mine)
    assert bundled_form("words.txt") == "words.txt"


def test_an_out_recorded_with_the_installed_path_resumes(tmp_path, cache, capsys, monkeypatch):
    """run.json of earlier versions held the absolute path of the installed file, here another
    venv's that no longer exists: the rerun resumes; another word list is refused, saying so.
    (Run from ``tmp_path`` with relative names, so the refusal's line stays whole under
    ``MAX_LINE`` however deep pytest's temporary folder is.)"""
    monkeypatch.chdir(tmp_path)
    out = Path("out")
    assert main([*DEMO, "--out", str(out)]) == 0
    run_file = out / "run.json"
    old = json.loads(run_file.read_text())
    gone = "/gone/venv/lib/python3.11/site-packages/counterfactual/data/demo_synonyms.txt"
    old["config"]["text"]["vocabulary"] = gone
    run_file.write_text(json.dumps(old, indent=1))
    tars = {p: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    assert main([*DEMO, "--out", str(out)]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")} == tars
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards_resumed"] == manifest["shards"] == 1
    words = Path("words.txt")
    words.write_text(demo_vocabulary_path().read_text())
    assert main([*DEMO, "--out", str(out), "--vocabulary", str(words)]) == 2
    err = capsys.readouterr().err
    assert '(text.vocabulary: "bundled:demo_synonyms.txt@sha256:' in err
    assert f'-> "{words}")' in err


# --- OUT holds the outputs; the temp dir is left empty ------------------------------------------


def test_a_local_run_leaves_nothing_in_the_temp_dir_nor_demo_pictures_in_out(tmp_path):
    tmp, cache = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    out = tmp_path / "out"
    done = _cli(*DEMO, "--out", str(out), tmp=tmp, cache=cache)
    assert done.returncode == 0, done.stderr
    assert _outputs(out) == OUTPUTS | {"shard-000000.tar", "shard-000000_stats.json"}
    assert os.listdir(tmp) == []
    assert sorted(p.name for p in (cache / "demo" / "images").iterdir())[:2] == [
        "astronaut.jpg", "camera.jpg",
    ]  # fmt: skip
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["root"] == str(cache / "demo")


@pytest.mark.slow
def test_a_ray_run_keeps_its_files_outside_out_and_removes_them(tmp_path, short_tmp):
    """Three runs on Ray, one after the other in one child process (each starts a Ray of its
    own and stops it); the temp dir is looked at after each, and after the process exits."""
    tmp, cache = short_tmp, tmp_path / "cache"
    ray = ("--runner", "ray", "--num-cpus", "2", "--no-dashboard", "--cpu-actors", "1")
    out = tmp_path / "out"  # (the demo is one shard: one shard worker)
    with _one_process(tmp, cache) as run:
        code, err = run(*DEMO, "--out", str(out), *ray)
        assert code == 0, err
        assert _outputs(out) == OUTPUTS | {"shard-000000.tar", "shard-000000_stats.json"}
        assert os.listdir(tmp) == []  # Ray's session folder was in it, and is gone
        # kept on request: the run says where, the manifest too
        kept = tmp_path / "kept"
        code, err = run(*DEMO, "--out", str(kept), *ray, "--keep-ray-logs")
        assert code == 0, err
        (line,) = [ln for ln in err.splitlines() if ln.startswith("Ray's logs: ")]
        logs = Path(line.removeprefix("Ray's logs: "))
        assert logs.is_dir() and any(logs.iterdir()) and logs.is_relative_to(tmp)
        assert json.loads((kept / "manifest.json").read_text())["ray"]["logs"] == str(logs)
        assert _outputs(kept) == _outputs(out)
        shutil.rmtree(tmp / logs.relative_to(tmp).parts[0])
        # a run that fails (a model that does not load in its actor) leaves nothing either
        bad = tmp_path / "bad.pt"
        bad.write_bytes(b"not a TorchScript file")
        code, err = run(
            *BASE, "--out", str(tmp_path / "failed"), *ray, "--inpaint-backend", "lama",
            "--inpaint-model", str(bad), "--model-actors", "1",
        )  # fmt: skip
        assert code == 2, err
        assert "Inpaint" in err
        assert os.listdir(tmp) == [] and not (tmp_path / "failed" / "run.json").exists()
    assert os.listdir(tmp) == []  # nor at the process's exit


# --- a run without samples ----------------------------------------------------------------------


def test_a_run_without_samples_opens_empty_and_says_why(tmp_path, cache, capsys):
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "out"
    assert main([*DEMO, "--out", str(out), "--alpha3", "0.01"]) == 0  # nothing small enough
    capsys.readouterr()
    text = (out / "README.md").read_text()
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["configs"][0]["data_files"] == [{"split": "train", "path": ["shard-000000.tar"]}]
    assert [f["name"] for f in meta["dataset_info"]["features"]] == [
        "jpg", "txt", "__key__", "__url__"
    ]  # fmt: skip
    why = (
        "No samples: none of the 8 input images made one; status.jsonl says why: 6 skipped "
        "no-removable-class (no class passes the alpha rules"
    )
    assert why in text
    ds = datasets.load_dataset(str(out), streaming=True, cache_dir=str(tmp_path / "hf"))
    assert list(ds["train"]) == []
    assert main(["report", str(out)]) == 0
    err = capsys.readouterr().err
    assert why in err and "2 skipped fewer-than-two-classes" in err
    assert why in (out / "report" / "index.html").read_text()
    assert main(["check", str(out)]) == 0


# --- one id type --------------------------------------------------------------------------------


def test_select_and_the_shards_name_images_by_the_same_string(tmp_path, cache):
    files = prepare_demo(tmp_path / "demo")
    plans = tmp_path / "plans.jsonl"
    argv = ["select", "--annotations", str(files.instances), "--out", str(plans)]
    assert main(argv) == 0
    selected = {p["image_id"] for p in map(json.loads, plans.read_text().splitlines())}
    assert selected and all(type(i) is str for i in selected)
    out = tmp_path / "out"
    assert main([*DEMO, "--out", str(out), "--root", str(tmp_path / "demo")]) == 0
    shards = [str(p) for p in sorted(out.glob("shard-*.tar"))]
    metas = [s["json"] for s in wds.WebDataset(shards, shardshuffle=False).decode()]
    assert metas and all(type(m["image_id"]) is str for m in metas)
    assert {m["image_id"] for m in metas} == selected
    status = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert all(type(s["image_id"]) is str for s in status)
