"""``counterfactual report``: a visual audit of a synth run (HTML page + PNG contact sheets)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.outdir import OutOptions, claim_out
from counterfactual.report import DEFAULT_N, REPORT_DIR, write_report
from counterfactual.report.write import REPORT_OUT
from counterfactual.shards.check import damaged_shards


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportOptions:
    """``counterfactual report``'s options (``--force-out`` is :class:`OutOptions`')."""

    out_dir: Path = declare(
        help="the --out folder of the run", flags=("out_dir",), kind="path", metavar="OUT_DIR"
    )
    root: Path | None = declare(
        None,
        help="folder the samples' file names are relative to (default: the dataset folders "
        "the run recorded in manifest.json, found from any working directory; the demo's "
        "pictures are made again in the user's cache when they are gone; a corpus's originals are read from its tars or "
        "tables); where no original is found, the edited picture only",
        kind="path",
    )
    n: int = declare(
        DEFAULT_N,
        help="samples to show, spread over class x image method, at least one per stratum "
        "(default: %(default)s)",
        kind="positive_int",
    )
    seed: int = declare(
        0, help="seed of the sample drawn, >= 0 (default: %(default)s)", kind="nonnegative_int"
    )
    out: Path | None = declare(
        None,
        help="report folder (default OUT_DIR/report): missing, empty or a report (rewritten); "
        "another folder is refused unless --force-out",
        kind="path",
    )
    sizes_only: bool = declare(
        False,
        help="verify the shards' sizes only, without hashing them (fast on an object store)",
        kind="flag",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report",
        help="a visual audit of a synth run: index.html and contact sheets under OUT_DIR/report",
        description="Read a synth run folder (shards, status.jsonl, manifest.json) and write "
        "report/index.html: counts by status and reason, methods and config, a per-class table, "
        "PNG contact sheets (original with the removed boxes | mask | edited | captions with "
        "the removed phrases struck | verifier scores when present) of a seeded sample "
        "stratified by removed class and image method, and every failure with its reason. The "
        "folder is self-contained (relative links, no network). Prints the path of index.html. "
        "Every committed shard is verified first, as `counterfactual check` does (its size and "
        "SHA-256 against its stats file); a damaged one is named, one line each, no report is "
        "written and the exit code is 1 (rerun the synth command to make it again).",
    )
    add_options(p, declared(ReportOptions, "out_dir", "root", "n", "seed", "out"))
    add_options(p, declared(OutOptions))
    add_options(p, declared(ReportOptions, "sizes_only"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        claim_out(args.out, REPORT_OUT, force=args.force_out)
    else:  # a link there is replaced by write_report; a folder of someone else's is refused
        default = args.out_dir / REPORT_DIR
        if not default.is_symlink():
            claim_out(default, REPORT_OUT, force=args.force_out, option="OUT_DIR/report")
    damaged = damaged_shards(args.out_dir, content=not args.sizes_only)
    if damaged:
        for line in damaged:
            print(f"counterfactual report: {line}", file=sys.stderr)
        print(
            f"counterfactual report: {len(damaged)} damaged shard(s): no report written; rerun "
            f"the synth command to make them again (`counterfactual check {args.out_dir}` "
            "checks the whole folder)",
            file=sys.stderr,
        )
        return 1
    report = write_report(args.out_dir, args.out, n=args.n, seed=args.seed, root=args.root)
    if report.missing_originals:
        print(
            f"{report.missing_originals} of {len(report.shown)} originals not found "
            "(give --root DATASET_FOLDER)",
            file=sys.stderr,
        )
    if report.empty is not None:
        print(report.empty, file=sys.stderr)
    print(report.index)
    return 0
