"""``counterfactual select``: removal plans of a dataset as JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from counterfactual.cli.common import add_selection_args, selection_config
from counterfactual.cooccurrence import CooccurrenceStats
from counterfactual.readers.coco import read_coco
from counterfactual.records import ImageRecord
from counterfactual.selection import SelectionConfig, candidates_many, select_many

CHUNK = 4096
"""Images selected together: the batched rules are fast on a few thousand at a time, and the
plans of one chunk are written with one call."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "select",
        help="pick removable classes per image (alpha rules) and write the plans",
        description="Write one JSON object per plan: image_id, target, removed, kept, kind "
        "(single/multi), valid, rejected_by, and the evidence (each ratio with its threshold).",
    )
    p.add_argument(
        "--dataset",
        choices=("coco",),
        default="coco",
        help="format of --annotations (default: %(default)s)",
    )
    p.add_argument("--annotations", type=Path, required=True, help="COCO instances_*.json")
    add_selection_args(p)
    p.add_argument(
        "--rejected", action="store_true", help="also write rejected candidates, with the rule"
    )
    p.add_argument("--out", type=Path, default=None, help="PLANS.jsonl (default: stdout)")
    p.set_defaults(func=run)


def write_plans(
    records: Sequence[ImageRecord],
    config: SelectionConfig,
    out: TextIO,
    stats: CooccurrenceStats | None = None,
    rejected: bool = False,
    ids: Mapping[str, int | str] | None = None,
) -> tuple[int, int]:
    """Write each record's chosen plans (and with ``rejected`` then its refused candidates) as
    one JSON object per line, in record order; ``image_id`` is ``ids[record id]`` when given
    (the id as the input file has it). Returns ``(plans, rejected candidates)``."""
    encode = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
    plans = refused = 0
    for start in range(0, len(records), CHUNK):
        batch = records[start : start + CHUNK]
        chosen = select_many(batch, config, stats)
        every = candidates_many(batch, config) if rejected else None
        lines = []
        for i, selection in enumerate(chosen):
            rows = list(selection.plans)
            plans += len(rows)
            if every is not None:
                bad = [c for c in every[i].candidates if not c.valid]
                rows += bad
                refused += len(bad)
            for plan in rows:
                row = plan.to_dict()
                if ids is not None:
                    row["image_id"] = ids.get(plan.image_id, plan.image_id)
                lines.append(encode(row))
        if lines:
            out.write("\n".join(lines) + "\n")
    return plans, refused


def run(args: argparse.Namespace) -> int:
    config = selection_config(args)
    ids: dict[str, int | str] = {}
    dataset = read_coco(args.annotations, None, args.annotations.parent, original_ids=ids)
    stats = None
    if config.policy == "spurious":  # PMI over the whole file, before any image is chosen
        stats = CooccurrenceStats.from_records(dataset.records)
    out = open(args.out, "w", encoding="utf-8") if args.out else sys.stdout  # noqa: SIM115
    try:
        plans, rejected = write_plans(dataset.records, config, out, stats, args.rejected, ids)
    finally:
        if args.out:
            out.close()
    print(
        f"{len(dataset.records)} images, {plans} plans"
        + (f", {rejected} rejected candidates" if args.rejected else "")
        + f", {len(dataset.failures)} unreadable images",
        file=sys.stderr,
    )
    return 0
