"""The ``counterfactual`` command. Each subcommand lives in its own module with
``register(subparsers)``, which adds a parser whose ``func(args) -> int`` does the work.
``main(argv)`` takes an argument list so tests call it directly.

A bad setup (options, config, input or output files, a full disk, an object store that is
down, stalled, or lacks credentials or the bucket) ends with one line,
``counterfactual CMD: error: MESSAGE``, and exit code 2; ``--debug`` (before or after the
subcommand) shows the traceback instead. An option that does not parse prints its line and a
pointer to ``--help`` (argparse's ``SystemExit(2)``). A run stopped by a signal
(:class:`~counterfactual.synth.signals.Interrupted`) prints one line and exits with 128 + the
signal's number (130 for Ctrl-C)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from counterfactual import fs
from counterfactual._lazy import MissingExtra
from counterfactual.messages import one_line
from counterfactual.synth.runlock import LockLost

SUBCOMMANDS = (
    "select",
    "caption",
    "synth",
    "score-boxes",
    "perturb",
    "filter-captions",
    "heuristics",
    "audit",
    "mix",
    "train",
    "data",
    "models",
    "configs",
    "eval",
    "report",
    "check",
    "cooccurrence",
    "world",
    "experiment",
)


class CliParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and a pointer to ``--help`` (exit 2),
    instead of the whole usage; every subcommand's parser is one too (``add_parser`` makes
    the parent's class). Options are never guessed: ``allow_abbrev=False`` (``--no-verify``
    is not ``--no-verify-text``), and an unknown option names the closest one
    (:meth:`unknown`)."""

    def __init__(self, *args: Any, allow_abbrev: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def unknown(self, extra: Sequence[str]) -> NoReturn:
        """The error for arguments this parser does not know: each unknown option with the
        closest of this parser's options, ``--image-methd`` -> ``did you mean
        --image-method?``."""
        hints = []
        for word in extra:
            name = word.split("=", 1)[0]
            if not name.startswith("-"):
                continue
            close = difflib.get_close_matches(name, self._option_string_actions, n=1, cutoff=0.75)
            if close:
                hints.append((name, close[0]))
        tail = ""
        if len(hints) == 1:
            tail = f"; did you mean {hints[0][1]}?"
        elif hints:
            tail = "; did you mean " + ", ".join(f"{b} for {a}" for a, b in hints) + "?"
        self.error(f"unrecognized arguments: {' '.join(extra)}{tail}")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\nTry '{self.prog} --help'.\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``command``'s alone: what ``main`` builds when
    the arguments name one (each subcommand's module imports the library parts it needs, so
    ``counterfactual synth`` does not import eval's, train's or report's)."""
    parser = CliParser(
        prog="counterfactual",
        description="Counterfactual image-text data against spurious object correlations.",
    )
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    parser.add_argument("--version", "-V", action=_Version)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS if command is None else (command,):
        module = importlib.import_module(f"counterfactual.cli.{name.replace('-', '_')}")
        module.register(subparsers)
    _add_debug(parser, set())
    parser.set_defaults(_subcommands=subparsers.choices)
    return parser


class _Version(argparse.Action):
    """``--version``: :func:`version_line` as it is (argparse's own action wraps it at the
    terminal's width), then exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(
            option_strings,
            dest,
            nargs=0,
            default=argparse.SUPPRESS,
            help="print the version, the distribution and where the package is, and exit",
        )

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        print(version_line())
        parser.exit()


def version_line() -> str:
    """What ``--version`` prints: the version, the distribution and where the package is."""
    import counterfactual

    where = os.path.dirname(counterfactual.__file__)
    return f"counterfactual {counterfactual.__version__} ({counterfactual.DISTRIBUTION}, {where})"


def _add_debug(parser: argparse.ArgumentParser, seen: set[int]) -> None:
    """``--debug`` on every (nested) subcommand's parser too; ``SUPPRESS``: a subcommand
    without it leaves the flag given before it as it was."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in action.choices.values():
            if id(sub) not in seen:  # aliases share a parser
                seen.add(id(sub))
                sub.add_argument(
                    "--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP
                )
                _add_debug(sub, seen)


_DEBUG_HELP = "on a setup error, show the traceback instead of one line"

SETUP_ERRORS: tuple[type[BaseException], ...] = (ValueError, OSError, MissingExtra, LockLost)
"""What ends a command as a setup error (one line, exit 2): bad options, configs and inputs
(``ValueError``, with ``UnicodeDecodeError``, ``json.JSONDecodeError``, ``SetupError`` and
``LockHeld`` among them), files that cannot be read or written (``OSError``: missing,
unreadable, a folder, disk full), an extra that is not installed (``MissingExtra``, which
names it) and a run's lock removed or taken over by another driver (``LockLost``)."""


def setup_error(err: BaseException) -> BaseException | None:
    """The setup error ``err`` is, or wraps (a Ray worker's exception comes back as a
    ``RayTaskError`` whose ``cause`` is the original); ``None`` for anything else."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException) and cause is not err:
        found = setup_error(cause)
        if found is not None:
            return found
    if isinstance(err, BrokenPipeError):
        return None
    store = fs.store_error(err)  # an object store down, stalled, without credentials or bucket
    if store is not None:
        return store
    return err if isinstance(err, SETUP_ERRORS) else None


def error_message(err: BaseException) -> str:
    """A setup error as one line that names its file: an ``OSError`` as ``FILE: reason``."""
    if isinstance(err, OSError) and err.strerror and err.filename is not None:
        where = os.fsdecode(err.filename)
        if err.filename2 is not None:
            where += f" -> {os.fsdecode(err.filename2)}"
        return one_line(f"{where}: {err.strerror}")
    return one_line(str(err)) or type(err).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a setup error ends it with one line on stderr and exit code 2
    (``--debug``: the traceback instead)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with warnings.catch_warnings():  # a plugin skipped while the commands are imported
        warnings.formatwarning = _one_line_warning("", warnings.formatwarning)
        parser = build_parser(_command(argv))
    args = _parse(parser, argv)
    with warnings.catch_warnings():
        if not args.debug:
            warnings.formatwarning = _one_line_warning(args.command, warnings.formatwarning)
        return _run(parser, argv, args)


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option; the top-level
    options take no value), or ``None`` when it names none or an unknown one: then every
    subcommand's parser is built, for the list of commands or the "invalid choice" error."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in SUBCOMMANDS else None


def _one_line_warning(command: str, default: Callable[..., str]) -> Callable[..., str]:
    """``warnings.formatwarning`` for the CLI: the project's own warnings (an annotation entry
    that belongs to no image) as one line, ``counterfactual CMD: warning: ...``, without the
    source line Python's format adds; other warnings as Python formats them."""

    def format_(message, category, filename, lineno, line=None):  # type: ignore[no-untyped-def]
        if not str(getattr(category, "__module__", "")).startswith("counterfactual"):
            return default(message, category, filename, lineno, line)
        prefix = f"counterfactual {command}" if command else "counterfactual"
        return f"{prefix}: warning: {one_line(str(message))}\n"

    return format_


def _run(parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace) -> int:
    try:
        if getattr(args, "config", None) is not None:
            from counterfactual.cli.config import config_path, load_config

            sub = args._subcommands[args.command]
            sub.set_defaults(**load_config(config_path(args.config), sub))
            args = _parse(parser, argv)
        args._argv = argv  # what the command was given (synth names it in its fixes)
        return int(args.func(args) or 0)
    except BrokenPipeError:  # e.g. `counterfactual select ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as err:  # a synth run's Interrupted names its signal
        if args.debug:
            raise
        message = getattr(err, "message", "interrupted")
        print(f"counterfactual {args.command}: {message}", file=sys.stderr)
        return int(getattr(err, "exit_code", 130))
    except Exception as err:
        found = setup_error(err)
        if found is None or args.debug:
            raise
        print(f"counterfactual {args.command}: error: {error_message(found)}", file=sys.stderr)
        return 2


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, with unknown options reported by the innermost subcommand's
    parser (its name in the error, its options in the "did you mean", its ``--help``)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        _innermost(args._subcommands[args.command], args).unknown(extra)
    return args


def _innermost(parser: argparse.ArgumentParser, args: argparse.Namespace) -> CliParser:
    """The parser of the nested subcommand ``args`` chose (``models list``, ``audit MODE``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _innermost(chosen, args)
    assert isinstance(parser, CliParser)
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
