"""``counterfactual select``: removal plans of a dataset as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from counterfactual.cli.common import add_selection_args, selection_config
from counterfactual.readers.coco import read_coco
from counterfactual.selection import candidates, select


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "select",
        help="pick removable classes per image (alpha rules) and write the plans",
        description="Write one JSON object per plan: image_id, target, removed, kept, kind "
        "(single/multi), valid, rejected_by, and the evidence (each ratio with its threshold).",
    )
    p.add_argument("--dataset", choices=("coco",), default="coco")
    p.add_argument("--annotations", type=Path, required=True, help="COCO instances_*.json")
    add_selection_args(p)
    p.add_argument(
        "--rejected", action="store_true", help="also write rejected candidates, with the rule"
    )
    p.add_argument("--out", type=Path, default=None, help="PLANS.jsonl (default: stdout)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = selection_config(args)
    dataset = read_coco(args.annotations, None, args.annotations.parent)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    plans = rejected = images = 0
    stats = None
    if config.policy == "spurious":  # PMI over the whole file, before any image is chosen
        from counterfactual.cooccurrence import CooccurrenceStats

        stats = CooccurrenceStats.from_records(dataset.records)
    try:
        for record in dataset.records:
            images += 1
            sel = select(record, config, stats)
            rows = list(sel.plans)
            if args.rejected:
                refused = [c for c in candidates(record, config).candidates if not c.valid]
                rows += refused
                rejected += len(refused)
            for p in rows:
                out.write(json.dumps(p.to_dict()) + "\n")
            plans += len(sel.plans)
    finally:
        if args.out:
            out.close()
    print(
        f"{images} images, {plans} plans"
        + (f", {rejected} rejected candidates" if args.rejected else "")
        + f", {len(dataset.failures)} unreadable images",
        file=sys.stderr,
    )
    return 0
