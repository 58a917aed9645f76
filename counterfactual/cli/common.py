"""Argument groups shared by subcommands, and the config built from them."""

from __future__ import annotations

import argparse

from counterfactual.selection import POLICIES, SelectionConfig


def add_selection_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("selection (SPEC 1.1)")
    g.add_argument("--alpha1", type=float, default=0.4, help="keep rule threshold (default 0.4)")
    g.add_argument("--alpha2", type=float, default=0.8, help="co-removal threshold (default 0.8)")
    g.add_argument("--alpha3", type=float, default=0.7, help="size rule threshold (default 0.7)")
    g.add_argument("--policy", choices=POLICIES, default="uniform", help="plans kept per image")
    g.add_argument("--seed", type=int, default=0, help="seed of every random choice")


def selection_config(args: argparse.Namespace) -> SelectionConfig:
    return SelectionConfig(
        alpha1=args.alpha1,
        alpha2=args.alpha2,
        alpha3=args.alpha3,
        policy=args.policy,
        seed=args.seed,
    )
