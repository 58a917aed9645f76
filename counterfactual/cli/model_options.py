"""The synth options that decide which models a run loads, and the ``counterfactual models
pull`` line that fetches what a synth command line needs. Its own module so that ``synth``
(which names the line in its preflight) and ``models`` (which builds synth's parser) do not
import each other."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

MODEL_OPTIONS = {
    "--dataset": True,
    "--boxes": True,
    "--detector-model": True,
    "--image-method": True,
    "--inpaint-backend": True,
    "--inpaint-model": True,
    "--dtype": True,
    "--text-method": True,
    "--captioner-model": True,
    "--verify-model": True,
    "--candidates": True,
    "--verify": False,
    "--no-verify": False,
    "--filter": False,
    "--no-filter": False,
}
"""The synth options that decide which models a run loads (``True``: it takes a value)."""


def pull_command(config: str | Path | None, argv: Sequence[str] = ()) -> str:
    """The ``counterfactual models pull`` line that fetches what a synth command line needs:
    its config and the options of ``argv`` that decide the models (:data:`MODEL_OPTIONS`)."""
    words = ["counterfactual", "models", "pull"]
    if config is not None:
        words += ["--config", str(config)]
    extra: list[str] = []
    it = iter(argv)
    for token in it:
        option = token.split("=", 1)[0]
        if option not in MODEL_OPTIONS or option == "--config":
            continue
        extra.append(token)
        if MODEL_OPTIONS[option] and "=" not in token:
            extra.append(next(it, ""))
    if extra:
        words += ["--", *extra]
    return shlex.join(words)
