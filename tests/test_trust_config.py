"""A config or a command line handed in cannot make a long or slow error (issue 31): YAML
aliases are refused before any expands (the "billion laughs"), deep nesting and huge values are
one short line, and a ``mix`` error over 10,000 shards names a count and a few of them. Each
scenario runs the real CLI in a process: exit 2, one line on stderr, at most 400 characters."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from counterfactual.messages import MAX_LINE

REPO = Path(__file__).resolve().parents[1]

LAUGHS = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "alpha1: [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)
"""About 350 bytes, 9**9 strings once expanded, under keys a synth config does not know."""

KNOWN_KEY = (
    "image_method: &x [paint, paint, paint, paint, paint, paint, paint, paint]\n"
    "image_method: &y [*x, *x, *x, *x, *x, *x, *x, *x]\n"
    "image_method: &z [*y, *y, *y, *y, *y, *y, *y, *y]\n"
    "image_method: [*z, *z, *z, *z, *z, *z, *z, *z, *z, *z, *z, *z, *z, *z, *z, *z]\n"
)
"""Under 300 bytes, a known key whose expanded value a message would quote: 34.7 MB once."""


def cli(*argv: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, time.monotonic() - start


def one_error_line(done: subprocess.CompletedProcess, command: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"counterfactual {command}: error: ")
    assert len(lines[0]) <= MAX_LINE + len(f"counterfactual {command}: error: ")
    return lines[0]


def synth_with(config: Path, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    return cli(
        *("synth", "--config", str(config), "--dataset", "coco", "--root", str(cwd)),
        *("--out", str(cwd / "out")),
        cwd=cwd,
    )


@pytest.mark.parametrize(("content", "line"), [(LAUGHS, 2), (KNOWN_KEY, 2)])
def test_a_yaml_alias_bomb_is_one_short_line_at_once(tmp_path, content, line):
    config = tmp_path / "bomb.yaml"
    config.write_text(content)
    assert len(content.encode()) < 400
    done, seconds = synth_with(config, tmp_path)
    error = one_error_line(done, "synth")
    assert f"bomb.yaml: line {line}: YAML aliases (*" in error
    assert "not allowed in a config" in error
    assert not (tmp_path / "out").exists()
    # the refusal is before any expansion: the time is the interpreter's start and imports
    assert seconds < 30


def test_one_alias_is_refused_too(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("image_method: &m blur\ntext_method: *m\n")
    done, _ = synth_with(config, tmp_path)
    assert "config.yaml: line 2: YAML aliases (*m) are not allowed" in one_error_line(done, "synth")


def test_a_deeply_nested_config_is_one_line(tmp_path):
    config = tmp_path / "deep.yaml"
    config.write_text("alpha1: " + "[" * 100_000 + "\n")
    done, _ = synth_with(config, tmp_path)
    assert one_error_line(done, "synth").endswith("deep.yaml: not valid YAML: nested too deeply")


def test_a_huge_config_file_is_refused_unread(tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("# " + "x" * (2 << 20) + "\n")
    done, _ = synth_with(config, tmp_path)
    assert "big.yaml: larger than 1,048,576 bytes" in one_error_line(done, "synth")


def test_a_huge_value_in_a_config_is_quoted_short(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"image_method: {'x' * 100_000}\n")
    done, _ = synth_with(config, tmp_path)
    error = one_error_line(done, "synth")
    assert "config.yaml: image_method: 'xxx" in error and "is not one of" in error


def test_a_huge_command_line_value_is_one_short_line(tmp_path):
    done, _ = cli("synth", "--dataset", "coco", "--alpha1", "9" * 100_000, cwd=tmp_path)
    assert done.returncode == 2
    first = done.stderr.splitlines()[0]  # argparse's line, then the pointer to --help
    assert first.startswith("counterfactual synth: error: argument --alpha1: 999")
    assert len(first) <= MAX_LINE + len("counterfactual synth: error: ")


@pytest.mark.slow
def test_a_mix_error_over_10000_shards_names_a_count_and_a_few(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for i in range(10_000):
        (empty / f"shard-{i:06d}.tar").write_bytes(b"\0" * 1024)  # a tar with no member
    synthetic = tmp_path / "syn.tar"
    synthetic.write_bytes(b"\0" * 1024)
    done, _ = cli(
        "mix",
        "--original",
        str(empty),
        "--synthetic",
        str(synthetic),
        "--ratio",
        "0.1",
        cwd=tmp_path,
    )
    error = one_error_line(done, "mix")
    assert "the original shards hold no samples: 10,000 shards (" in error
    assert "shard-000000.tar" in error and "shard-009999.tar" not in error
