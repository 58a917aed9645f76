"""The command line of the options that configs declare on their fields
(:mod:`counterfactual.options`): :func:`add_options` adds them to a parser or group,
:func:`build` makes a config from the parsed options."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from counterfactual.cli.common import (
    cosine,
    finite_float,
    gpu_share,
    nonnegative_float,
    nonnegative_int,
    open_unit_interval,
    positive_float,
    positive_fraction,
    positive_int,
    unit_interval,
)
from counterfactual.options import Declared, declared

TYPES: dict[str, Callable[[str], Any]] = {
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
    default is a required option."""
    for d in options:
        spec = d.option
        kwargs: dict[str, Any] = {"dest": d.dest, "help": spec.help}
        if d.required:
            kwargs["required"] = True
        else:
            kwargs["default"] = None if spec.unset else d.default
        if spec.nargs:
            kwargs["nargs"] = spec.nargs
        if spec.metavar:
            kwargs["metavar"] = spec.metavar
        if spec.kind in _ACTIONS:
            kwargs["action"] = _ACTIONS[spec.kind]
        elif spec.kind in TYPES:
            kwargs["type"] = TYPES[spec.kind]
        if spec.choices:
            kwargs["choices"] = spec.choices
        group.add_argument(*d.flags, **kwargs)


def build(cls: type[Config], args: argparse.Namespace, **given: Any) -> Config:
    """``cls`` from the parsed options of the fields it declares (a list as a tuple: configs
    are frozen), and ``given`` (the fields whose value the command decides: a nested config, a
    default that depends on others)."""
    values = {d.field: getattr(args, d.dest) for d in declared(cls) if d.field not in given}
    lists = {k: tuple(v) for k, v in values.items() if isinstance(v, list)}
    return cls(**{**values, **lists}, **given)
