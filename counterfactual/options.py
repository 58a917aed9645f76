"""Command-line options declared on config fields, as plain data.

A config dataclass declares the option of a field in the field's metadata, next to its
default::

    seed: int = declare(0, help="seed of every random choice", kind="nonnegative_int")

:mod:`counterfactual.cli.options` adds the arguments (flag, type, choices, default, help) to
a parser and builds the config from the parsed options with these declarations; the YAML
configs' keys are the options' names, so they follow too. The library holds no argparse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

KINDS = (
    "text",
    "path",
    "int",
    "float",
    "flag",
    "no-flag",
    "bool",
    "const",
    "positive_int",
    "nonnegative_int",
    "positive_float",
    "nonnegative_float",
    "positive_fraction",
    "unit_interval",
    "open_unit_interval",
    "gpu_share",
    "finite_float",
    "cosine",
)
"""What an option's value is: ``text`` (a string); ``path`` (a :class:`~pathlib.Path`); ``int``
(any whole number); ``float`` (any number); ``flag`` (``--x`` sets ``True``);
``no-flag`` (``--no-x`` sets ``False``); ``bool`` (``--x`` and ``--no-x``); ``const`` (``--x``
sets the option's ``const``); or a number in a
range (``positive_int``: > 0, ``nonnegative_int``: >= 0, ``positive_float``: finite > 0,
``nonnegative_float``: finite >= 0, ``positive_fraction``: (0, 1], ``unit_interval``:
[0, 1], ``open_unit_interval``: (0, 1), ``gpu_share``: (0, 8], ``finite_float``: any
finite number, ``cosine``: [-1, 1])."""

_KEY = "counterfactual.option"


@dataclass(frozen=True, slots=True)
class CliOption:
    """How users name and set one config field.

    ``help`` may use argparse's ``%(default)s``; ``flags`` are its flags in the order ``--help``
    shows them (default: ``--`` and the field's name with dashes); ``dest`` its key in the
    parsed options and in YAML configs (default: the first long flag's name with
    underscores); ``unset``: not given, it is ``None`` and whoever builds the config decides
    (a default that depends on other options). ``nargs`` (``"+"``, ``"*"``): a list of values,
    stored as a tuple; ``"?"``: one value or none; ``"..."``: every word that follows, as they
    are; ``metavar``: the value's name in the usage. A field without a default is a required
    option. A flag without a leading ``-`` makes a positional argument.

    What only a command's own options need: ``parse``, a function that reads the value
    instead of ``kind`` (a ``ValueError`` names the bad value); ``repeat``: the option may be
    given again, each value added to a list; ``exclusive``: the name of a group of options of
    which at most one may be given (exactly one when one of them is required); ``const``: the
    value a ``const`` option sets."""

    help: str
    kind: str = "text"
    choices: tuple[Any, ...] = ()
    flags: tuple[str, ...] = ()
    dest: str = ""
    unset: bool = False
    nargs: str = ""
    metavar: str = ""
    parse: Callable[[str], Any] | None = None
    repeat: bool = False
    exclusive: str = ""
    const: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"option kind {self.kind!r} is not one of {', '.join(KINDS)}")


def option(help: str, **kwargs: Any) -> dict[str, CliOption]:
    """The field metadata that declares a field's option (:class:`CliOption`'s arguments)."""
    return {_KEY: CliOption(help, **kwargs)}


def declare(
    default: Any = MISSING,
    *,
    help: str,
    metadata: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """A dataclass field with ``default`` (none: a required option) that declares its
    option: ``field(default=default, metadata=option(help, **kwargs))``; a list default is
    copied for each instance (``default_factory``). ``metadata``: more of the field's metadata,
    for its other readers (how an eraser's runs record it:
    :func:`counterfactual.image.base.recorded`)."""
    more = {**option(help, **kwargs), **(metadata or {})}
    if isinstance(default, list):
        return field(default_factory=default.copy, metadata=more)
    return field(default=default, metadata=more)


@dataclass(frozen=True, slots=True)
class Declared:
    """A declared option as the command line adds it: the config's ``field``, its ``option``,
    and the field's ``default``."""

    field: str
    option: CliOption
    default: Any
    """The field's default; :data:`dataclasses.MISSING` when it has none."""

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def flags(self) -> tuple[str, ...]:
        return self.option.flags or ("--" + self.field.replace("_", "-"),)

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")

    @property
    def dest(self) -> str:
        if self.option.dest:
            return self.option.dest
        if self.positional:
            return self.flags[0]
        long = next(f for f in self.flags if f.startswith("--"))
        return long[2:].replace("-", "_")


def declared(cls: type, *names: str) -> list[Declared]:
    """The options ``cls`` declares: those of ``names`` in that order (each must declare
    one), else every one in field order."""
    found: dict[str, Declared] = {}
    for f in fields(cls):
        spec = f.metadata.get(_KEY) if isinstance(f.metadata, Mapping) else None
        if spec is None:
            continue
        default = f.default
        if default is MISSING and f.default_factory is not MISSING:
            default = f.default_factory()
        found[f.name] = Declared(f.name, spec, default)
    if not names:
        return list(found.values())
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"{cls.__name__} declares no option for {', '.join(missing)}")
    return [found[n] for n in names]
