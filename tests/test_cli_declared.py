"""Every command's options are declarations (``counterfactual.options``) that
``cli/options.py`` turns into the parser: no hand-written ``add_argument`` is left in ``cli/``
but the ones argparse's own machinery needs, and the parsers built from the declarations
refuse what the hand-written ones refused, with the same line (the real command, a process)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import counterfactual.cli

CLI = Path(counterfactual.cli.__file__).parent

LEFT = {
    "__init__.py": 3,  # --debug on every parser (SUPPRESS below the top) and --version's action
    "options.py": 1,  # the one call that adds a declared option
}
"""The files of ``cli/`` that still call ``add_argument``, and how often at most."""


def _add_argument_calls() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text("utf-8"))
        n = sum(
            1
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        )
        if n:
            found[path.name] = n
    return found


def test_no_hand_written_add_argument_is_left() -> None:
    found = _add_argument_calls()
    extra = {name: n for name, n in found.items() if n > LEFT.get(name, 0)}
    assert extra == {}, f"declare these options instead (counterfactual.options): {extra}"


def _run(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ("mix", "--synthetic", "syn.tar", "--ratio", "0.1"),
            "counterfactual mix: error: one of the arguments --original --unpair is required",
        ),
        (
            ("audit", "oov", "--eval", "e.jsonl", "--train", "t.jsonl", "--vocab", "v.txt"),
            "counterfactual audit oov: error: argument --vocab: not allowed with argument --train",
        ),
        (
            ("experiment", "--out", "x", "--ratio", "0.1", "--natural-ratio"),
            "counterfactual experiment: error: argument --natural-ratio: not allowed with "
            "argument --ratio",
        ),
        (
            ("world", "--out", "w", "--pair", "dog"),
            "counterfactual world: error: argument --pair: expected ANCHOR:PARTNER, got 'dog'",
        ),
        (
            ("report",),
            "counterfactual report: error: the following arguments are required: OUT_DIR",
        ),
    ],
    ids=["mix-side", "oov-source", "experiment-ratio", "world-pair", "report-positional"],
)
def test_a_declared_option_refuses_as_before(argv, line, tmp_path) -> None:
    """A required exclusive pair, two exclusive options (a const among them), a parse function
    and a positional: one line, a pointer to --help, exit 2, nothing written."""
    proc = _run(*argv, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [line, f"Try '{line.split(': error')[0]} --help'."]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_caption_takes_its_declared_positional(tmp_path) -> None:
    """The caption is a declared positional argument; ``--no-repair-captions`` a declared
    ``bool`` option, the paper's exact cut (spaCy's small English pipeline, shipped as a
    package)."""
    caption = "Two dogs fighting over a frisbee"
    proc = _run("caption", "--remove", "frisbee", caption, cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, "Two dogs fighting"), proc.stderr
    proc = _run("caption", "--remove", "frisbee", "--no-repair-captions", caption, cwd=tmp_path)
    assert (proc.returncode, proc.stdout.strip()) == (0, "Two dogs fighting over"), proc.stderr
