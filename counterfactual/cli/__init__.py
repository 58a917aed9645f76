"""The ``counterfactual`` command. Each subcommand lives in its own module with
``register(subparsers)``, which adds a parser whose ``func(args) -> int`` does the work.
``main(argv)`` takes an argument list so tests call it directly."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

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
    "eval",
    "report",
    "cooccurrence",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="counterfactual",
        description="Counterfactual image-text data against spurious object correlations.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"counterfactual.cli.{name.replace('-', '_')}")
        module.register(subparsers)
    parser.set_defaults(_subcommands=subparsers.choices)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "config", None) is not None:
            from counterfactual.cli.config import load_config

            sub = args._subcommands[args.command]
            sub.set_defaults(**load_config(args.config, sub))
            args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:
        print(f"counterfactual {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `counterfactual select ... | head`: the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
