"""Several ``counterfactual`` commands in one child process (:func:`main_in_one_child`): one
interpreter start and one import of the package for all of them, for tests that check each
command's exit code and what it wrote rather than the process itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DRIVER = """\
import json, sys
from counterfactual.cli import main
codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps(codes))
"""


def main_in_one_child(
    argvs: list[list[str]], env: dict[str, str], cwd: Path, timeout: float = 600
) -> tuple[list[int], str]:
    """``counterfactual.cli.main(ARGV)`` for each of ``argvs`` in turn, in one child process
    started with ``env`` in ``cwd``: each command's exit code, and the child's stderr."""
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(argvs)],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr
