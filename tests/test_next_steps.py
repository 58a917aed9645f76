"""After a run, the last lines on stderr say what to do next: look at the shards (``report``),
check them (``check``), load them (``counterfactual.load.webdataset``). Each scenario runs the
real CLI in a process, as a user types it, and then the commands the lines name."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from counterfactual.cli.synth import next_steps
from counterfactual.readers.generate import CocoFiles, generate_coco
from tests.bad_coco import synth_args

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> CocoFiles:
    return generate_coco(tmp_path_factory.mktemp("coco"), 6, seed=1, size=(160, 120))


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )


def synth(files: CocoFiles, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = synth_args(files, out, "--image-method", "blur", "--contact-sheet", "0", *extra)
    return cli(*argv)


def steps(stderr: str) -> list[str]:
    """The lines from "next steps:" to the end of stderr."""
    lines = stderr.rstrip().splitlines()
    at = lines.index("next steps:")
    return lines[at:]


def test_a_run_ends_with_the_next_steps_and_each_works(coco, tmp_path):
    out = tmp_path / "run 1"  # a space: the printed commands are quoted for the shell
    done = synth(coco, out, "--images-per-shard", "2")
    assert done.returncode == 0, done.stderr
    assert "next steps" not in done.stdout  # stdout: the summary table only
    quoted = shlex.quote(str(out))
    assert steps(done.stderr) == [
        "next steps:",
        f"  counterfactual report {quoted}   # look at them: open {out}/report/index.html",
        f"  counterfactual check {quoted}    # verify every shard against its records",
        f"  counterfactual.load.webdataset({str(out)!r})   # train on them (docs/training.md: "
        "Load the shards)",
    ]
    # each step as printed: the shell commands, then the Python call
    for line in steps(done.stderr)[1:3]:
        argv = shlex.split(line.split("#")[0])
        assert argv[0] == "counterfactual"
        ran = cli(*argv[1:])
        assert ran.returncode == 0, ran.stderr
    assert (out / "report" / "index.html").is_file()
    written = sum(json.loads((out / "sizes.json").read_text()).values())
    call = steps(done.stderr)[3].split("#")[0].strip()
    script = f"import counterfactual.load\nprint(sum(1 for _ in {call}))"
    loaded = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert loaded.returncode == 0, loaded.stderr
    assert int(loaded.stdout.strip()) == written > 0


def test_a_run_that_wrote_no_sample_prints_no_next_steps(coco, tmp_path):
    out = tmp_path / "out"
    done = synth(coco, out, "--alpha3", "0.000001")  # no removed object is that small
    assert done.returncode == 0, done.stderr
    assert sum(json.loads((out / "sizes.json").read_text()).values()) == 0
    assert "next steps" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("out", "report"),
    [
        ("out/demo", True),
        ("/data/run 2", True),
        ("s3://bucket/run", False),  # report reads a local folder
    ],
)
def test_next_steps_name_the_folder_as_given(out, report):
    text = next_steps(out)
    lines = text.splitlines()
    assert lines[0] == "next steps:" and 3 <= len(lines) <= 4
    assert any(line.startswith("  counterfactual report ") for line in lines) is report
    assert f"  counterfactual check {shlex.quote(out)} " in text
    assert f"counterfactual.load.webdataset({out!r})" in text


@pytest.mark.slow
def test_a_dry_run_prints_its_layout_and_no_next_steps(tmp_path):
    done = cli("synth", "--dry-run", "--num-cpus", "2", "--no-dashboard", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout.strip().splitlines()[-1])
    assert "next steps" not in done.stderr + done.stdout
