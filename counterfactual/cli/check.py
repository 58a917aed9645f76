"""``counterfactual check``: verify a synth run folder; exit 1 when anything is damaged or its
records disagree with its shards."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.shards.check import check_run


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckOptions:
    """``counterfactual check``'s options."""

    out_dir: str = declare(
        help="the --out folder or URL of the run (or --unpair's)",
        flags=("out_dir",),
        metavar="OUT_DIR",
    )
    sizes_only: bool = declare(
        False,
        help="compare sizes only, without reading the shards (fast on an object store)",
        kind="flag",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check",
        help="verify a synth run: every shard against its stats file, the records against the "
        "shards (exit 1 on damage)",
        description="Verify every committed shard of a synth run folder (its size and SHA-256 "
        "against its stats file; shards of older runs without a recorded hash: their tar is "
        "read and its samples compared) and that status.jsonl, manifest.json and the dataset "
        "card agree with the shards. Prints one line per problem and a summary; exits 1 when "
        "there is any (rerun the synth command to make damaged shards again), else 0. Changes "
        "nothing. A folder of `mix --unpair` (orig-*.tar) is checked the same way, its shards "
        "and sizes.json only.",
    )
    add_options(p, declared(CheckOptions))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    result = check_run(args.out_dir, content=not args.sizes_only)
    for line in result.problems:
        print(line)
    print(result.summary())
    return 0 if result.ok else 1
