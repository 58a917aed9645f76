"""YAML configs for subcommands: a mapping of long option names to values.

Keys may be written with ``_`` or ``-`` (``image_method`` or ``image-method``). A config sets
the defaults of the subcommand's parser, so an option given on the command line still wins.
Unknown keys and values outside an option's choices are errors that name them.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def load_config(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The defaults that ``path`` sets on ``parser``, checked against its options."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config", "func")}
    out: dict[str, Any] = {}
    unknown = []
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        action = actions.get(dest)
        if action is None:
            unknown.append(str(key))
            continue
        if value is not None and action.choices is not None and value not in action.choices:
            raise ValueError(
                f"{path}: {key}: {value!r} is not one of {', '.join(map(str, action.choices))}"
            )
        if value is not None and action.type is not None and not isinstance(value, bool):
            value = action.type(str(value)) if isinstance(value, str | int | float) else value
        out[dest] = value
    if unknown:
        raise ValueError(
            f"{path}: unknown option(s) {', '.join(sorted(unknown))}; see `counterfactual "
            f"{parser.prog.split()[-1]} --help`"
        )
    return out
