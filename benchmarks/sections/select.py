"""The ``select`` section of ``make bench``: ``counterfactual select`` end to end (JSON read, rules, plan writing) on 100,000
images at COCO statistics, beside the one-image-at-a-time path it replaced;
spaCy's own parse rate on the same captions.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import Arg, Section, coco_statistics_json, seconds_of

from counterfactual.method.selection import SelectionConfig, select
from counterfactual.readers.coco import read_coco


def _select_one_at_a_time(instances: Path, out: Path, config: SelectionConfig) -> None:
    """``counterfactual select`` before it used the batched rules: one image at a time, one
    ``json.dumps`` per plan (ids written as the records' strings)."""
    dataset = read_coco(instances, None, instances.parent)
    with open(out, "w", encoding="utf-8") as fh:
        for record in dataset.records:
            for plan in select(record, config).plans:
                fh.write(json.dumps(plan.to_dict()) + "\n")


def bench_select(work: Path, n: int, repeat: int = 2) -> dict[str, float]:
    """``counterfactual select`` end to end (JSON read, selection, plan writing), in process,
    with its default workers and with one process, against the one-image-at-a-time path it
    replaced, alternated; and ``json.loads`` alone."""
    from contextlib import redirect_stderr
    from io import StringIO

    from counterfactual.cli import main as cli_main
    from counterfactual.cli.select import usable_cores

    instances = coco_statistics_json(work / "select" / "instances.json", n)
    new_out, one_out = work / "select" / "new.jsonl", work / "select" / "one.jsonl"
    old_out = work / "select" / "old.jsonl"
    argv = ["select", "--annotations", str(instances), "--out", str(new_out)]
    one_argv = ["select", "--annotations", str(instances), "--out", str(one_out), "--workers", "1"]
    new, one, old, floor = [], [], [], []
    for _ in range(repeat):
        with redirect_stderr(StringIO()):
            new.append(seconds_of(lambda: cli_main(argv)))
            one.append(seconds_of(lambda: cli_main(one_argv)))
        old.append(seconds_of(lambda: _select_one_at_a_time(instances, old_out, SelectionConfig())))
        floor.append(seconds_of(lambda: json.loads(instances.read_bytes())))
    plans_new = [json.loads(line) for line in new_out.read_text().splitlines()]
    plans_old = [json.loads(line) for line in old_out.read_text().splitlines()]
    return {
        "select_images": float(n),
        "select_workers": float(usable_cores()),
        "select_images_per_s": n / min(new),
        "select_one_process_images_per_s": n / min(one),
        "select_one_at_a_time_images_per_s": n / min(old),
        "select_speedup": min(old) / min(new),
        "select_json_load_images_per_s": n / min(floor),
        "select_plans_per_image": len(plans_new) / n,
        "select_same_plans": float(
            plans_new == plans_old and one_out.read_bytes() == new_out.read_bytes()
        ),
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_select(work, args.select_images)


SECTION = Section(
    "select",
    run,
    args=(
        Arg(
            "--select-images",
            {"type": int, "default": 100_000, "help": "images for `counterfactual select`"},
        ),
    ),
    note="`counterfactual select` as a user runs it (main(argv) in process, imports done): "
    "read an instances file of select_images images at generate_coco's statistics (boxes "
    "only, integer ids; about 0.9 KB an image) as a BoxTable, the alpha rules (uniform "
    "policy) on even chunks of at most 16,384 images in select_workers processes (the default: one per "
    "usable core), one JSON line per plan. one_process: the same with --workers 1. "
    "one_at_a_time: the path it replaced (read_coco, select() per image, json.dumps per "
    "plan), on the same file, alternated; same_plans: 1 when all three wrote the same "
    "plans in the same order (ids compared as integers; the two select runs byte for "
    "byte). json_load: json.loads of the file alone. Best of `repeat`.",
    targets={
        "select_images_per_s": 20_000,
    },
)
