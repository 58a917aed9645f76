"""``counterfactual cooccurrence``: class co-occurrence heat-maps of a dataset before and after
adding the synthetic samples of a ``synth`` run (``D`` and ``D ∪ D'``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from counterfactual.cli.common import add_data_args
from counterfactual.cli.options import add_options
from counterfactual.method.cooccurrence import (
    MEASURES,
    CooccurrenceStats,
    heatmap,
    report,
)
from counterfactual.options import declare, declared
from counterfactual.shards.samples import synthetic_class_sets

if TYPE_CHECKING:
    from counterfactual.readers.spec import DataSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class CooccurrenceOptions:
    """``counterfactual cooccurrence``'s options besides the data ones (``add_data_args``)."""

    synthetic: Path = declare(
        help="output folder of a synth run (its shard-*.tar are read)", kind="path"
    )
    out: Path = declare(help="heat-map PNG", kind="path")
    json: Path | None = declare(None, help="matrices (default: OUT with .json)", kind="path")
    top: int = declare(
        20,
        help="classes shown: the N most frequent in the dataset (default: %(default)s)",
        kind="positive_int",
    )
    measure: str = declare(
        "pmi",
        help="pmi: smoothed pointwise mutual information; frequency: p(a, b), the share of "
        "images holding both classes (default: %(default)s)",
        choices=MEASURES,
    )
    smoothing: float = declare(
        1.0,
        help="PMI pseudo-count added to the observed and expected pair counts, >= 0 (0: none; "
        "default: %(default)s)",
        kind="nonnegative_float",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "cooccurrence",
        help="co-occurrence heat-maps of the top classes before and after adding D'",
        description="Count image-level class co-occurrence over the dataset (the same data "
        "options as synth) and over the dataset plus the synthetic images of a synth run (each "
        "contains its plan's kept classes), and draw both and their difference as a PNG; the "
        "counts and the plotted matrices go to a JSON file beside it.",
    )
    add_data_args(p)
    add_options(p, declared(CooccurrenceOptions))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from counterfactual.readers.spec import read_dataset

    if args.top < 1:
        raise ValueError(f"--top must be >= 1, got {args.top}")
    if args.smoothing < 0:
        raise ValueError(f"--smoothing must be >= 0, got {args.smoothing}")
    dataset = read_dataset(_spec(args))
    records = dataset.records if args.limit is None else dataset.records[: max(args.limit, 0)]
    sets, samples = synthetic_class_sets(args.synthetic)
    before = CooccurrenceStats.from_records(records)
    after = before.combined(CooccurrenceStats.from_class_sets(sets))
    classes = before.top_classes(args.top)
    if not classes:
        raise ValueError(f"{dataset.name}: no annotated objects, nothing to draw")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    heatmap(before, after, classes, args.out, args.measure, args.smoothing)
    out_json = args.json or args.out.with_suffix(".json")
    data = report(before, after, classes, args.measure, args.smoothing, samples)
    out_json.write_text(json.dumps(data, indent=1), encoding="utf-8")
    print(
        f"{dataset.name}: {before.n_images} images + {len(sets)} synthetic ({samples} samples), "
        f"{len(classes)} classes -> {args.out}, {out_json}",
        file=sys.stderr,
    )
    return 0


def _spec(args: argparse.Namespace) -> DataSpec:
    """The data options; without ``--root``, the data spec the run recorded in its manifest."""
    from counterfactual import fs
    from counterfactual.cli.common import data_spec
    from counterfactual.readers.spec import DataSpec

    manifest = fs.join(args.synthetic, "manifest.json")
    if args.root is None and args.instances is None and fs.exists(manifest):
        recorded = json.loads(fs.read_text(manifest)).get("data")
        if isinstance(recorded, dict):
            return DataSpec.from_dict({**recorded, "limit": args.limit})
    from counterfactual.readers.demo import demo_cache_dir

    return data_spec(args, str(demo_cache_dir()))
