"""The ``selection`` section of ``make bench``: images/s of the vectorised rules at COCO statistics, and one image at a time."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import Arg, Section, best_rate

from counterfactual.method.selection import SelectionConfig, select, select_many
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco


def bench_selection(work: Path, n: int) -> dict[str, float]:
    files = generate_coco(work / "sel", n, seed=0, write_images=False)
    records = read_coco(files.instances, files.captions, files.images).records
    config = SelectionConfig()
    batch = 1024
    fast = best_rate(
        len(records),
        lambda: [
            select_many(records[i : i + batch], config) for i in range(0, len(records), batch)
        ],
    )
    few = records[: n // 5]
    one = best_rate(len(few), lambda: [select(r, config) for r in few])
    boxes = np.mean([len(r.objects) for r in records])
    classes = np.mean([len(r.classes) for r in records])
    return {
        "selection_images_per_s": fast,
        "selection_one_at_a_time_images_per_s": one,
        "selection_batch_speedup": fast / one,
        "selection_boxes_per_image": float(boxes),
        "selection_classes_per_image": float(classes),
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_selection(work, args.images)


SECTION = Section(
    "selection",
    run,
    args=(Arg("--images", {"type": int, "default": 10_000, "help": "images for selection"}),),
    targets={
        "selection_images_per_s": 20_000,
    },
)
