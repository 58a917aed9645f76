"""``counterfactual configs``: the synth configs bundled with the package, by name, with what
each is for; ``--config NAME`` (synth, models) reads one."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from counterfactual.cli.config import bundled_configs, describe
from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigsOptions:
    """``counterfactual configs``'s option."""

    paths: bool = declare(
        False, help="print each config's file instead of its description", kind="flag"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "configs",
        help="list the bundled synth configs (`--config NAME` uses one)",
        description="The synth configs that ship with the package: one line each, its name (what "
        "`counterfactual synth --config NAME` and `make synth DATASET=NAME` take) and what it is "
        "for. Every key of a config is a synth option; options given on the command line win.",
    )
    add_options(p, declared(ConfigsOptions))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    configs = bundled_configs()
    width = max(map(len, configs), default=0)
    for name, path in configs.items():
        print(f"{name:<{width}}  {path if args.paths else describe(path)}")
    return 0
