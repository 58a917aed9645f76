"""The ``corpus`` section of ``make bench``: the whole corpus path (WebDataset shards, tiny detector, caption-aware selection)
against the COCO path (annotated boxes) on the same pictures, in process on one core, with
each step's worker seconds and the readers' own rates.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from common import Arg, Section, side_by_side

from counterfactual.image import (
    ImageConfig,
)
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco
from counterfactual.records import Dataset
from counterfactual.synth.run import RunResult
from counterfactual.testing import (
    build_tiny_owlv2,
)
from counterfactual.testing.corpora import write_wds
from counterfactual.text import TextConfig


def _read_and_run(read: Callable[[], Dataset], out: Path, config) -> tuple[float, RunResult]:
    """Seconds to read a dataset and run it in process into ``out``, and the run's result."""
    from counterfactual.synth.runner import run_local

    start = time.perf_counter()
    dataset = read()
    result = run_local(dataset.records, out, config, failures=dataset.failures)
    return time.perf_counter() - start, result


def bench_corpus(work: Path, n: int, repeat: int = 2) -> dict[str, float]:
    """The corpus path (WebDataset shards, tiny OWLv2, caption-aware selection) against the
    COCO path (annotated boxes) on the same ``n`` generated pictures, blur, np-removal, the
    in-process runner on one core, reading included; the two runs alternate."""
    import torch

    from counterfactual.method.detect import DetectConfig
    from counterfactual.readers.corpus import read_wds
    from counterfactual.synth.plan import SynthConfig

    torch.set_num_threads(1)

    print(
        "corpus: one torch thread; the tests' tiny random OWLv2: a 32 px network, but its "
        "processor still filters each full-size picture down (detect_tiny_preprocess_*)"
    )
    files = generate_coco(work / f"corpus{n}", n, seed=3, size=(640, 480))

    def read_annotated() -> Dataset:
        return read_coco(files.instances, files.captions, files.images)

    def read_shards() -> Dataset:
        return read_wds(pattern)

    samples = [
        (r.image_id, (r.root / r.file).read_bytes(), r.captions[0].text, {})
        for r in read_annotated().records
        if r.root is not None
    ]
    pattern = write_wds(samples, work / f"wds{n}", per_shard=100)
    owl = build_tiny_owlv2(work / "owl-corpus", grid_boxes=True)
    configs = {
        "coco": (read_annotated, SynthConfig(image=ImageConfig(method="blur"))),
        "wds": (
            read_shards,
            SynthConfig(
                image=ImageConfig(method="blur"),
                detect=DetectConfig(model=str(owl), score_threshold=0.0, queries="caption"),
                text=TextConfig(skip_unchanged=True),
            ),
        ),
    }
    runs: dict[str, list[tuple[float, RunResult]]] = {name: [] for name in configs}
    for i in range(repeat):  # alternated, so both paths see the same machine load
        for name, (read, config) in configs.items():
            runs[name].append(_read_and_run(read, work / f"corpus-{name}{i}", config))
    out: dict[str, float] = {"corpus_images": float(n)}
    rates = {}
    for name, done in runs.items():
        seconds, result = min(done, key=lambda run: run[0])
        rates[name] = n / seconds
        out[f"corpus_{name}_images_per_s"] = rates[name]
        for outcome, count in result.counts().items():  # written, skipped:REASON, failed:REASON
            out[f"corpus_{name}_{outcome.replace(':', '_').replace('-', '_')}"] = float(count)
        for step, step_seconds in sorted(result.stage_seconds.items()):
            out[f"corpus_{name}_seconds_{step}"] = step_seconds
    out["corpus_wds_vs_coco"] = rates["wds"] / rates["coco"]
    read_coco_rate, read_wds_rate = side_by_side(n, read_annotated, read_shards, repeat=3)
    out["corpus_read_coco_images_per_s"] = read_coco_rate
    out["corpus_read_wds_images_per_s"] = read_wds_rate
    out["corpus_read_wds_vs_coco"] = read_wds_rate / read_coco_rate
    return out


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_corpus(work, args.corpus_images)


SECTION = Section(
    "corpus",
    run,
    args=(Arg("--corpus-images", {"type": int, "default": 300}),),
    note="The same generated 640x480 pictures through the in-process runner on one core (one "
    "torch thread), blur, np-removal: coco = COCO annotations and boxes; wds = the pictures "
    "and first captions as WebDataset shards (100 per shard), boxes from the tests' tiny "
    "OWLv2 (random weights, grid boxes, threshold 0, queries 'caption'), caption-aware "
    "selection. images_per_s: input images per second, reading and model loading included, "
    "best of two alternated runs; written, skipped_*, failed_*: that run's status counts; "
    "seconds_<step>: worker seconds per step of that run; "
    "read_*: the readers alone (read_wds reads tar headers only). With a trained, "
    "base-size OWLv2 the detect step would cost what the detect section measures per "
    "image, and the boxes, so the selections and samples, would differ.",
)
