"""The command line of the options that configs declare on their fields
(:mod:`counterfactual.options`): :func:`add_options` adds them to a parser or group,
:func:`build` makes a config from the parsed options."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from counterfactual.options import Declared, declared


def _ranged(kind: type, test: Callable[[float], bool], what: str) -> Callable[[str], int | float]:
    """An argparse ``type`` that parses ``kind`` and refuses values outside a range; the error
    names the value and the range (argparse adds the option's name)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {_KIND_NAMES[kind]}") from None
        if value != value or not test(value):  # NaN fails every range
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return value

    parse.__name__ = what.replace(" ", "_")  # argparse shows it in "invalid <name> value"
    return parse


_KIND_NAMES = {int: "a whole number", float: "a number"}

positive_int = _ranged(int, lambda v: v > 0, "a whole number > 0")
"""argparse type: an int > 0 (counts, sizes, batch sizes)."""
nonnegative_int = _ranged(int, lambda v: v >= 0, "a whole number >= 0")
"""argparse type: an int >= 0 (limits where 0 means none, seeds)."""
positive_float = _ranged(float, lambda v: 0 < v < float("inf"), "a number > 0")
"""argparse type: a finite float > 0 (scales, learning rates, seconds)."""
nonnegative_float = _ranged(float, lambda v: 0 <= v < float("inf"), "a number >= 0")
"""argparse type: a finite float >= 0 (margins, thresholds on unbounded scores)."""
unit_interval = _ranged(float, lambda v: 0 <= v <= 1, "a number in [0, 1]")
"""argparse type: a float in [0, 1] (probabilities, overlap thresholds, fractions)."""
open_unit_interval = _ranged(float, lambda v: 0 < v < 1, "a number in (0, 1)")
"""argparse type: a float strictly between 0 and 1."""
positive_fraction = _ranged(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
"""argparse type: a float in (0, 1] (a threshold where 0 refuses everything)."""
gpu_share = _ranged(float, lambda v: 0 < v <= 8, "a number in (0, 8]")
"""argparse type: GPUs per actor, a fraction of one GPU up to a node's eight."""


def finite_float(text: str) -> float:
    """argparse type: any finite float (a threshold on a score of either sign)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def cosine(text: str) -> float:
    """argparse type: a cosine similarity, a float in [-1, 1]."""
    value = finite_float(text)
    if not -1.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a cosine in [-1, 1]")
    return value


TYPES: dict[str, Callable[[str], Any]] = {
    "path": Path,
    "int": int,
    "float": float,
    "positive_int": positive_int,
    "nonnegative_int": nonnegative_int,
    "positive_float": positive_float,
    "nonnegative_float": nonnegative_float,
    "positive_fraction": positive_fraction,
    "unit_interval": unit_interval,
    "open_unit_interval": open_unit_interval,
    "gpu_share": gpu_share,
    "finite_float": finite_float,
    "cosine": cosine,
}
"""The argparse type of each number kind (:data:`counterfactual.options.KINDS`)."""

_ACTIONS = {
    "flag": "store_true",
    "no-flag": "store_false",
    "bool": argparse.BooleanOptionalAction,
}

Config = TypeVar("Config")


def add_options(
    group: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Declared]
) -> None:
    """Add each declared option to ``group``; its default is the field's (``None`` for an
    option declared ``unset``), so ``%(default)s`` in its help shows it; a field without a
    default is a required option. Options declared ``exclusive`` with the same name go into
    one mutually exclusive group, required when one of them is."""
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for d in options:
        target: Any = group
        if d.option.exclusive:
            if d.option.exclusive not in exclusive:
                exclusive[d.option.exclusive] = group.add_mutually_exclusive_group(
                    required=d.required
                )
            target = exclusive[d.option.exclusive]
        target.add_argument(*_names(d), **_arguments(d, in_group=target is not group))


def _names(d: Declared) -> tuple[str, ...]:
    """A positional argument's name is its key in the parsed options."""
    return (d.dest,) if d.positional else d.flags


def _arguments(d: Declared, in_group: bool) -> dict[str, Any]:
    """``add_argument``'s keywords for one declared option (``in_group``: in a mutually
    exclusive group, which says whether one of its options is required)."""
    spec = d.option
    kwargs: dict[str, Any] = {"help": spec.help}
    if not d.positional:
        kwargs["dest"] = d.dest
    if not d.required:
        kwargs["default"] = None if spec.unset else d.default
    elif not d.positional and not in_group:
        kwargs["required"] = True
    if spec.nargs:
        kwargs["nargs"] = argparse.REMAINDER if spec.nargs == "..." else spec.nargs
    if spec.metavar:
        kwargs["metavar"] = spec.metavar
    if spec.repeat:
        kwargs["action"] = "append"
    elif spec.kind == "const":
        kwargs["action"] = "store_const"
        kwargs["const"] = spec.const
    elif spec.kind in _ACTIONS:
        kwargs["action"] = _ACTIONS[spec.kind]
    if spec.parse is not None:
        kwargs["type"] = spec.parse
    elif spec.kind in TYPES:
        kwargs["type"] = TYPES[spec.kind]
    if spec.choices:
        kwargs["choices"] = spec.choices
    return kwargs


def build(cls: type[Config], args: argparse.Namespace, **given: Any) -> Config:
    """``cls`` from the parsed options of the fields it declares (a list as a tuple: configs
    are frozen), and ``given`` (the fields whose value the command decides: a nested config, a
    default that depends on others)."""
    values = {d.field: getattr(args, d.dest) for d in declared(cls) if d.field not in given}
    lists = {k: tuple(v) for k, v in values.items() if isinstance(v, list)}
    return cls(**{**values, **lists}, **given)
