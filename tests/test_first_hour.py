"""A newcomer's first hour (issue 32): no silent caption miss (``edit()`` and ``synth`` with a
class outside COCO's 80), options never guessed, the CPU recipe of ``coco.yaml`` offline, the
install hints and license files, and the leftovers (no empty OUT after a failed start, paths
named with where they came from, ``check`` of ``mix --unpair``'s folder, ``--dry-run`` naming
the missing models). Each scenario a user types runs the real CLI in a process."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import counterfactual
from counterfactual.readers.generate import generate_coco

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "counterfactual" / "pipelines" / "configs"
TRIPOD = "tripod"
"""A class outside COCO's 80 (one of the demo's own)."""


def _cli(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m counterfactual ARGV`` as a user runs it: offline, an empty model cache."""
    full = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    full |= {
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(cwd / "hf-home"),
        "RAY_USAGE_STATS_ENABLED": "0",
        **(env or {}),
    }
    cmd = [sys.executable, "-m", "counterfactual", *argv]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=300, cwd=cwd)


def _coco_root(root: Path, n: int = 4, rename: str | None = None) -> tuple[Path, list[str]]:
    """A COCO 2017 layout under ``root`` (``annotations/``, ``train2017/``) of ``n`` generated
    images; ``rename``: the first used category is called that. Returns the root and the
    used classes."""
    files = generate_coco(root / "gen", n, seed=1, size=(64, 48))
    (root / "annotations").mkdir(parents=True)
    inst = json.loads(files.instances.read_text())
    used = {a["category_id"] for a in inst["annotations"]}
    if rename is not None:
        first = next(c for c in inst["categories"] if c["id"] in used)
        first["name"] = rename
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(inst))
    files.captions.rename(root / "annotations" / "captions_train2017.json")
    files.images.rename(root / "train2017")
    names = sorted(c["name"] for c in inst["categories"] if c["id"] in used)
    return root, names


def _status(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


# --- 1. no silent caption miss ----------------------------------------------------------


PICTURE = np.full((120, 160, 3), 128, np.uint8)
BOXES = [(TRIPOD, (10, 10, 40, 60)), ("person", (90, 20, 40, 80))]
CAPTION = "A man stands beside a tripod."


def test_edit_refuses_a_class_the_caption_vocabulary_lacks():
    with pytest.raises(counterfactual.EditError) as err:
        counterfactual.edit(PICTURE, BOXES, CAPTION, remove=TRIPOD)
    assert err.value.reason == "class-not-in-vocabulary"
    message = str(err.value)
    assert "\n" not in message and len(message) <= 400
    assert "COCO's 80 classes" in message and f"for the class to remove: {TRIPOD};" in message
    assert "vocabulary='FILE'" in message
    assert [p.target for p in err.value.candidates] == [TRIPOD]


def test_edit_with_a_vocabulary_that_lists_the_class_cuts_it(tmp_path):
    words = tmp_path / "words.txt"
    words.write_text("person, man, men\ntripod, tripods, camera stand\n")
    result = counterfactual.edit(PICTURE, BOXES, CAPTION, remove=TRIPOD, vocabulary=str(words))
    assert result.caption == "A man stands."
    assert result.removed_phrases == ("a tripod",) and result.still_named == ()


def test_edit_of_a_coco_class_is_unchanged_by_the_check():
    result = counterfactual.edit(
        PICTURE, [("dog", (10, 10, 40, 60)), ("person", (90, 20, 40, 80))],
        "A man walks his dog.", remove="dog",
    )  # fmt: skip
    assert "dog" not in result.caption and result.removed == ("dog",)


def test_the_demo_vocabulary_covers_the_demo_classes():
    """The demo (its config, and synth's default for --dataset demo) uses a vocabulary with
    words for each of its classes, camera, tripod, flag and rocket included."""
    from counterfactual.cli.synth import default_vocabulary
    from counterfactual.vocab import load_vocabulary

    data = REPO / "counterfactual" / "data"
    classes = {
        c["name"] for c in json.loads((data / "demo_instances.json").read_text())["categories"]
    }
    assert {"camera", TRIPOD, "flag", "rocket"} <= classes
    path = default_vocabulary(argparse.Namespace(vocabulary=None, dataset="demo"))
    assert Path(path).name == "demo_synonyms.txt"
    assert load_vocabulary(path).lacking(classes) == ()
    assert {"camera", "flag", "rocket", TRIPOD} <= set(load_vocabulary(None).lacking(classes))


@pytest.mark.slow
def test_synth_with_a_class_outside_coco_warns_first_and_records_each_sample(tmp_path):
    root, classes = _coco_root(tmp_path / "coco", rename=TRIPOD)
    out = tmp_path / "out"
    args = ("synth", "--dataset", "coco", "--root", str(root), "--out", str(out))
    done = _cli(*args, "--policy", "all", "--contact-sheet", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warning = done.stderr.splitlines()[0]  # one line, before the run starts
    assert warning.startswith(
        "counterfactual synth: warning: the caption vocabulary (COCO's 80 classes, the default) "
        f"has no words for 1 of the dataset's classes: {TRIPOD};"
    )
    assert "--vocabulary FILE" in warning and "class-not-in-vocabulary" in warning
    rows = _status(out)
    missed = [r for r in rows if r["reason"] == "class-not-in-vocabulary"]
    assert missed and all(r["target"] == TRIPOD and r["status"] == "failed" for r in missed)
    assert all(TRIPOD in r["detail"] for r in missed)
    written = [r for r in rows if r["status"] == "written"]
    assert written and all(r["target"] != TRIPOD for r in written)
    # the same run with a vocabulary that lists every class: no warning, no such row
    words = tmp_path / "words.txt"
    words.write_text("".join(f"{c}, {c}s\n" for c in classes))
    again = _cli(*args[:-1], str(tmp_path / "out2"), "--policy", "all", "--contact-sheet", "0",
                 "--vocabulary", str(words), cwd=tmp_path)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "warning" not in again.stderr
    rows = _status(tmp_path / "out2")
    assert not any(r["reason"] == "class-not-in-vocabulary" for r in rows)
    assert any(r["status"] == "written" and r["target"] == TRIPOD for r in rows)


# --- 2. options never guessed -----------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_no_parser_takes_an_abbreviation():
    from counterfactual.cli import build_parser

    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 20
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize(
    ("typed", "line"),
    [
        (
            "--image-methd",
            "unrecognized arguments: --image-methd blur; did you mean --image-method?",
        ),
        ("--image-meth", "unrecognized arguments: --image-meth blur; did you mean --image-method?"),
    ],
)
def test_a_mistyped_option_is_refused_with_the_one_it_meant(typed, line, tmp_path):
    out = tmp_path / "out"
    done = _cli("synth", typed, "blur", "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"counterfactual synth: error: {line}",
        "Try 'counterfactual synth --help'.",
    ]
    assert not out.exists()


def test_no_verify_is_its_own_option_not_no_verify_text():
    from counterfactual.cli import build_parser
    from counterfactual.cli.synth import build_config

    parser = build_parser()
    off = build_config(parser.parse_args(["synth", "--no-verify"]))
    assert off.verify.mode == "off" and off.verify.text_check  # the text check untouched
    on = build_config(parser.parse_args(["synth", "--verify"]))
    assert on.verify.mode == "record"
    both = build_config(parser.parse_args(["synth", "--filter", "--no-verify"]))
    assert both.verify.mode == "off"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_boolean_a_config_sets_can_be_turned_off(path):
    import yaml

    from counterfactual.cli import build_parser

    (synth,) = [p for p in _parsers(build_parser()) if p.prog == "counterfactual synth"]
    flags = synth._option_string_actions
    booleans = [k for k, v in yaml.safe_load(path.read_text()).items() if isinstance(v, bool)]
    for key in booleans:
        name = key.replace("_", "-")
        assert f"--{name}" in flags and f"--no-{name}" in flags, key
        args = synth.parse_args([f"--no-{name}"])
        assert getattr(args, flags[f"--{name}"].dest) is False


def _cpu_recipe(config: Path) -> list[str]:
    """The ARGS of the config's own CPU-only recipe, as its comments write it."""
    found = re.search(r'ARGS="([^"]+)"', config.read_text().split("On a CPU-only machine")[1])
    assert found, config
    return shlex.split(found.group(1))


def test_the_coco_config_cpu_recipe_runs_offline_as_written(tmp_path):
    recipe = _cpu_recipe(CONFIGS / "coco.yaml")
    assert recipe == ["--device", "cpu", "--inpaint-backend", "opencv", "--no-verify"]
    root, _ = _coco_root(tmp_path / "data")
    out = tmp_path / "out"
    run = ("synth", "--config", "coco", "--root", str(root), "--runner", "local")
    done = _cli(*run, "--out", str(out), "--contact-sheet", "0", *recipe, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert any(r["status"] == "written" for r in _status(out))
    assert (out / "shard-000000.tar").is_file()
    # without --no-verify the config's verifier is needed: one line says so, no OUT left
    refused = _cli(*run, "--out", str(tmp_path / "out2"), *recipe[:-1], cwd=tmp_path)
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert "verifier openai/clip-vit-large-patch14 (--verify-model)" in line
    assert not (tmp_path / "out2").exists()


# --- 4. install hints and license files -------------------------------------------------


def test_the_install_hint_names_the_clone():
    from counterfactual import _lazy

    assert _lazy.extra_hint("models") == f"pip install -e '{REPO}[models]'"


def test_an_installed_copy_names_an_install_from_the_clone(monkeypatch):
    from counterfactual import _lazy

    monkeypatch.setattr(_lazy, "checkout_root", lambda: None)
    assert _lazy.extra_hint("models") == (
        "pip install '.[models]' in your clone of counterfactual-vl (not on a package index yet)"
    )
    with pytest.raises(_lazy.MissingExtra, match=re.escape("pip install '.[tools]' in your")):
        _lazy.require("no_such_module_for_this_test", "tools")


def test_license_and_notice():
    import tomllib

    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX" in text
    notice = (REPO / "NOTICE").read_text()
    assert "Copyright The counterfactual authors" in notice
    assert "Rohrbach" in notice and "BSD 2-Clause" in notice
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE", "NOTICE"]


@pytest.mark.slow
def test_the_sdist_and_the_wheel_ship_license_and_notice(tmp_path):
    import tarfile
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "counterfactual", src / "counterfactual", ignore=ignore)
    dist = tmp_path / "dist"
    code = (
        "import sys; from setuptools import build_meta as b; "
        "to = sys.argv[1]; b.build_sdist(to); b.build_wheel(to)"  # setup() rewrites sys.argv
    )
    subprocess.run([sys.executable, "-c", code, str(dist)], cwd=src, check=True,
                   capture_output=True, timeout=300)  # fmt: skip
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    in_sdist = {Path(n).name for n in tarfile.open(sdist).getnames() if n.count("/") == 1}
    assert {"LICENSE", "NOTICE"} <= in_sdist
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    info = f"counterfactual_vl-{counterfactual.__version__}.dist-info/licenses"
    assert {f"{info}/LICENSE", f"{info}/NOTICE"} <= in_wheel


# --- 7. leftovers -----------------------------------------------------------------------


def test_a_failed_start_leaves_no_empty_out_and_names_where_the_path_came_from(tmp_path):
    out = tmp_path / "runs" / "first"  # neither folder exists: both are the run's
    root = tmp_path / "coco"
    done = _cli("synth", "--dataset", "coco", "--root", str(root), "--out", str(out), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"counterfactual synth: error: --instances (from --root {root}) "
        f"{root}/annotations/instances_train2017.json: no such file"
    ]
    assert not (tmp_path / "runs").exists()
    # a folder the user made stays, and so does what it holds
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    empty = tmp_path / "empty"
    empty.mkdir()
    for folder in (mine, empty):
        again = _cli("synth", "--dataset", "coco", "--root", str(root), "--out", str(folder),
                     cwd=tmp_path)  # fmt: skip
        assert again.returncode == 2
    assert (mine / "notes.txt").read_text() == "mine" and empty.is_dir()


def test_an_option_the_user_gave_is_named_as_given(tmp_path):
    root, _ = _coco_root(tmp_path / "coco")
    done = _cli("synth", "--dataset", "coco", "--root", str(root), "--images", "nowhere",
                "--out", str(tmp_path / "out"), cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "counterfactual synth: error: --images nowhere: no such folder"
    ]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_check_understands_mix_unpair_output(tmp_path):
    root, _ = _coco_root(tmp_path / "coco")
    pairs, orig = tmp_path / "pairs", tmp_path / "orig"
    made = _cli("synth", "--dataset", "coco", "--root", str(root), "--out", str(pairs),
                "--pairs", "--contact-sheet", "0", cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    mixed = _cli("mix", "--synthetic", str(pairs), "--unpair", str(orig), "--ratio", "0.5",
                 cwd=tmp_path)  # fmt: skip
    assert mixed.returncode == 0, mixed.stderr
    assert (orig / "orig-000000.tar").is_file()
    checked = _cli("check", str(orig), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    (line,) = checked.stdout.splitlines()
    shards = len(list(orig.glob("orig-*.tar")))  # at least --min-shards, fewer with fewer originals
    assert (
        line.startswith(f"{orig}: {shards} shards, ")
        and "intact (mix --unpair's originals)" in line
    )
    # damage is still found, and the fix names the command that made the folder
    tar = orig / "orig-000000.tar"
    tar.write_bytes(tar.read_bytes()[:-512])
    damaged = _cli("check", str(orig), cwd=tmp_path)
    assert damaged.returncode == 1
    lines = damaged.stdout.splitlines()
    assert lines[0].startswith("orig-000000.tar: damaged: ")
    assert lines[-1].endswith("rerun the mix --unpair command to make damaged shards again")


@pytest.mark.slow
def test_dry_run_names_the_missing_models(tmp_path):
    """``--dry-run`` of the coco config on a machine without its models: the layout on stdout,
    then one line naming each missing model and the pull command, exit 1."""
    pytest.importorskip("ray")
    done = _cli("synth", "--config", "coco", "--dry-run", "--device", "cpu", "--num-cpus", "1",
                "--no-dashboard", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["cpus"] == 1
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("counterfactual synth:")]
    assert line.startswith("counterfactual synth: dry run: models not available: ")
    assert "inpainter models/big-lama.pt (--inpaint-model): file not found" in line
    assert "verifier openai/clip-vit-large-patch14 (--verify-model)" in line
    assert line.endswith("Fetch with `counterfactual models pull --config coco`")
