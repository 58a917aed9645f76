"""YAML configs for subcommands: a mapping of long option names to values.

A config is a file, or the name of one bundled with the package (``coco`` or ``coco.yaml``:
``counterfactual/pipelines/configs/coco.yaml``, package data); ``counterfactual configs`` lists
them. A bundled
config's first line is a comment that says what it is for, in one line.

Keys may be written with ``_`` or ``-`` (``image_method`` or ``image-method``). A config sets
the defaults of the subcommand's parser, so an option given on the command line still wins.
Every value is checked as the command line checks it (type, range, choices); a file that
cannot be read, is not UTF-8 YAML or not a mapping, an unknown key and a bad value are
``ValueError``s that name the file (and the key).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from counterfactual.messages import cut, one_line, short

_FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse.BooleanOptionalAction)
_KINDS = {int: "a whole number", float: "a number"}


def bundled_configs() -> dict[str, Path]:
    """The configs that ship with the package, by name (file name without ``.yaml``)."""
    import counterfactual.pipelines

    folder = Path(counterfactual.pipelines.__file__).parent / "configs"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def config_path(name: str | Path) -> Path:
    """``name`` as a config file: a path (a file, or anything with a folder in it, which
    :func:`load_config` then reads or says why it cannot), else a bundled config's name (with
    or without ``.yaml``); ``ValueError`` listing the bundled names when it is neither."""
    path = Path(name).expanduser()
    if path.exists() or path.name != str(name):
        return path
    bundled = bundled_configs()
    found = bundled.get(str(name).removesuffix(".yaml"))
    if found is None:
        raise ValueError(
            f"config {str(name)!r} is neither a file nor a bundled config "
            f"({', '.join(bundled)}; `counterfactual configs` describes them)"
        )
    return found


def describe(path: Path) -> str:
    """A config's one-line description: its first line, a comment (empty when it has none)."""
    with open(path, encoding="utf-8") as file:
        first = file.readline().strip()
    return first.removeprefix("#").strip() if first.startswith("#") else ""


def load_config(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The defaults that ``path`` sets on ``parser``, checked against its options."""
    import yaml

    try:
        raw = _read_bounded(Path(path))
    except IsADirectoryError:
        raise ValueError(f"{path}: is a folder, not a YAML config file") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot read the config ({err.strerror or err})") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{path}: not a UTF-8 text file (byte {err.start}); a config is YAML text"
        ) from None
    try:
        data = yaml.load(text, Loader=_loader())  # noqa: S506  (a SafeLoader without aliases)
    except _AliasError as err:
        raise ValueError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {one_line(err)}") from None
    except RecursionError:
        raise ValueError(f"{path}: not valid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a mapping of option names to values, got a {type(data).__name__}"
        )
    actions = {a.dest: a for a in parser._actions if a.dest not in ("help", "config", "debug")}
    out: dict[str, Any] = {}
    unknown = []
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        action = actions.get(dest)
        if action is None or not action.option_strings:
            unknown.append(str(key))
            continue
        out[dest] = _value(path, key, value, action)
    if unknown:
        raise ValueError(
            f"{path}: unknown option(s) {cut(', '.join(sorted(unknown)), 200)}; see `counterfactual "
            f"{parser.prog.split()[-1]} --help`"
        )
    return out


MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read (a bundled one is under 2 KiB)."""


def _read_bounded(path: Path) -> bytes:
    with open(path, "rb") as file:
        raw = file.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: larger than {MAX_CONFIG_BYTES:,} bytes; a config is a few lines")
    return raw


class _AliasError(ValueError):
    """A YAML alias (``*name``) in a config: refused, as a few of them nested expand to more
    values than memory holds (the "billion laughs")."""


def _loader() -> type:
    """PyYAML's ``SafeLoader`` that refuses aliases before expanding any."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise _AliasError(
                    f"line {event.start_mark.line + 1}: YAML aliases (*{cut(str(event.anchor), 40)}) "
                    "are not allowed in a config; write the value out"
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def _value(path: Path, key: Any, value: Any, action: argparse.Action) -> Any:
    """``value`` as the command line would give ``action`` (``null``: the option unset)."""
    if value is None:
        return None
    where = f"{path}: {cut(str(key), 80)}"
    if isinstance(action, _FLAGS):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {short(value)} is not true or false")
        return value
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        items = value if isinstance(value, list) else [value]
        if action.nargs == "+" and not items:
            raise ValueError(f"{where}: expected at least one value")
        return [_scalar(where, item, action) for item in items]
    return _scalar(where, value, action)


def _scalar(where: str, value: Any, action: argparse.Action) -> Any:
    if isinstance(value, bool | list | dict):
        raise ValueError(f"{where}: {short(value)} is not {_expected(action)}")
    convert: Callable[[str], Any] | None = action.type  # type: ignore[assignment]
    if convert is not None:
        try:
            value = convert(str(value))
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"{where}: {err}") from None
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {short(value)} is not {_expected(action)}") from None
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise ValueError(f"{where}: {short(value)} is not one of {choices}")
    return value


def _expected(action: argparse.Action) -> str:
    if action.choices is not None:
        return f"one of {', '.join(map(str, action.choices))}"
    if action.type in _KINDS:
        return _KINDS[action.type]  # type: ignore[index]
    if action.type is None or action.type is Path:
        return "a text" if action.type is None else "a path"
    name = getattr(action.type, "__name__", "a value").replace("_", " ")
    return name if name.startswith("a") else f"a {name}"
