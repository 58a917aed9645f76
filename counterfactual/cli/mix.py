"""``counterfactual mix``: shard list and sampling weights for original + synthetic at a ratio."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.train.mix import MixPlan, plan_mix
from counterfactual.train.pairs import MIN_SHARDS

_PAPER_RANGE = (0.08, 0.2)  # synthetic per original in the paper (Kim et al. 2023)
_LONG_FLAGS = 4000  # characters; above this, with --out, the flags are left to the JSON


@dataclass(frozen=True, slots=True, kw_only=True)
class MixOptions:
    """``counterfactual mix``'s options: exactly one of ``original`` and ``unpair``."""

    original: list[str] = declare(
        help="original shards", nargs="+", metavar="SPEC", exclusive="side"
    )
    unpair: Path = declare(
        help="no original shards: the synthetic ones were made with synth --pairs, so their "
        "originals (orig.jpg with the original caption, each image and caption once) are "
        "written into DIR as the original side (DIR/orig-NNNNNN.tar with stats files and "
        "sizes.json): D ∪ D' without the source dataset; train reads DIR as --original",
        kind="path",
        metavar="DIR",
        exclusive="side",
    )
    min_shards: int = declare(
        MIN_SHARDS,
        help="with --unpair: from fewer pair shards than N, split the originals evenly over N "
        "shards (fewer when there are fewer originals), so that N DataLoader workers each "
        "read one; from N or more, one originals shard per pair shard (default: %(default)s)",
        kind="positive_int",
        metavar="N",
    )
    synthetic: list[str] = declare(help="synthetic shards", nargs="+", metavar="SPEC")
    ratio: float = declare(
        help="synthetic samples per original sample (the paper: about 0.08-0.2)",
        kind="float",  # plan_mix refuses <= 0 and not finite (one line, exit 2)
    )
    out: Path | None = declare(
        None, help="write the plan as JSON to this file (default: printed only)", kind="path"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "mix",
        help="weights that mix original and synthetic shards at a ratio (open_clip flags)",
        description="Count the samples of both shard lists and print the upsampling weights "
        "that give RATIO synthetic samples per original one when shards are drawn with "
        "replacement (open_clip --dataset-resampled), and open_clip's flags: each side as one "
        "brace pattern with one weight (--train-data 'ORIG::SYN' "
        "--train-data-upsampling-factors '1::W'). A SPEC is a brace pattern "
        "(data/{00000..00009}.tar), a glob, a directory (its *.tar) or a path; '::' separates "
        "several. Counts come from each shard's <stem>_stats.json ('successes' or 'count') or "
        "from reading the tar.",
    )
    add_options(p, declared(MixOptions))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    original = args.original
    if args.unpair is not None:
        from counterfactual.train.pairs import write_originals

        unpaired = write_originals(args.synthetic, args.unpair, args.min_shards)
        print(
            f"{unpaired.originals} originals of {unpaired.pairs} pair samples written to "
            f"{args.unpair} in {len(unpaired.shards)} shard"
            f"{'' if len(unpaired.shards) == 1 else 's'}"
        )
        original = [str(args.unpair)]
    plan = plan_mix(original, args.synthetic, args.ratio)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(plan.to_dict(), indent=1) + "\n", encoding="utf-8")
    print(render(plan, args.out))
    return 0


def render(plan: MixPlan, out: Path | None = None) -> str:
    """The human summary: a table per side, the ratios, repeats and the open_clip flags."""
    rows = [("", "shards", "samples", "weight", "per epoch")]
    for name, side in (("original", plan.original), ("synthetic", plan.synthetic)):
        rows.append(
            (
                name,
                str(len(side.shards)),
                str(side.samples),
                f"{side.weight:.6g}",
                f"{side.weight * side.samples:.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.append(
        f"expected synthetic per original: {plan.expected_ratio:.4g} "
        f"(synthetic share {plan.synthetic_fraction:.2%}); "
        f"all shards concatenated without weights: {plan.concat_ratio:.4g}"
    )
    repeats = plan.synthetic_repeats
    if repeats > 1:
        what = f"fewer synthetic samples than ratio x original: each repeats {repeats:.3g}x"
    else:
        what = f"each synthetic sample is drawn {repeats:.3g}x on average"
    lines.append(f"per epoch of {plan.samples_per_epoch} samples, {what}")
    low, high = _PAPER_RANGE
    if not low <= plan.ratio <= high:
        lines.append(f"note: the paper mixed {low}-{high} synthetic per original")
    if out is not None:
        lines.append(f"plan written to {out}")
    flags = plan.open_clip_flags()  # long only where shard names are not numbered in runs
    if out is not None and len(flags) > _LONG_FLAGS:
        lines.append(f"open_clip flags ({len(flags)} characters): see open_clip.args in {out}")
    else:
        lines.append("open_clip flags:")
        lines.append("  " + flags)
    return "\n".join(lines)
