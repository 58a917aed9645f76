"""A node's worth of GPUs, simulated (issue 35 point 8): does the driver, the shard workers and
Ray's object store keep eight GPUs fed?

A local Ray declares 8 GPUs (``ray.init(num_gpus=8)``) on this CPU machine and ``run_ray`` runs
the real synthesis path (driver, layout, ``ShardWorker`` actors making whole shards, batches of
decoded pictures through the object store to an ``Inpaint`` pool of one actor per GPU), except
that each ``Inpaint`` actor stands for a GPU: it sleeps a fixed time per batch (the GPU's
measured cost of a batch) and then makes the batch's edit with the box blur (a few ms on small
pictures). Each actor logs when it slept; the busy fraction is the time the eight "GPUs" slept
over eight times the window in which every one of them had work (from the last one's first
batch to the first one's last batch), and over the whole run. A run too small for such a
window (shorter than one batch: a GPU done before another started) reports the mean of each
GPU's busy share between its own first and last batch, and ``window_seconds`` 0. The sleep is long (1 s per batch
of 8, 64 items/s for the node) so that this 2-core machine's CPU, not the pipeline, would be
what limits it if anything did.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import Arg, Section

GPUS = 8
SLEEP = 1.0
"""Seconds per batch each simulated GPU sleeps."""
BATCH = 8


class SleepingGpu:
    """An ``Inpaint`` actor whose GPU is a sleep: ``SLEEP`` seconds per batch, then the batch's
    edit with the box blur; each sleep's start and end appended to ``LOG/<pid>.jsonl``."""

    LOG = ""
    SLEEP = SLEEP

    def __init__(
        self, config: Any, runtime: Any, stage: Any, board: str | None = None, window: Any = None
    ) -> None:
        from counterfactual.image import ImageConfig
        from counterfactual.pipelines.actors import build_chain, tell_started
        from counterfactual.synth.plan import Runtime

        tell_started(board)
        blur = dataclasses.replace(config, image=ImageConfig(method="blur"))
        self.chain, self.error = build_chain(blur, Runtime(), stage)
        self.log = Path(self.LOG) / f"{os.getpid()}.jsonl"

    def ready(self) -> str | None:
        return self.error

    def run(self, jobs: list[Any]) -> list[Any]:
        start = time.time()
        time.sleep(self.SLEEP)
        end = time.time()
        with self.log.open("a") as f:
            f.write(json.dumps([start, end, len(jobs)]) + "\n")
        return self.chain(jobs)


def busy_fractions(logs: Path) -> dict[str, float]:
    """From the actors' logs: the busy fraction in the window where every GPU had work, over
    the whole run, and the batches and items the GPUs took."""
    spans = [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(logs.glob("*.jsonl"))
    ]
    if len(spans) < GPUS:
        raise RuntimeError(f"only {len(spans)} of {GPUS} simulated GPUs took a batch")
    window = (max(s[0][0] for s in spans), min(s[-1][1] for s in spans))
    whole = (min(s[0][0] for s in spans), max(s[-1][1] for s in spans))

    def busy(lo: float, hi: float) -> float:
        inside = sum(max(0.0, min(e, hi) - max(b, lo)) for s in spans for b, e, _ in s)
        return inside / (GPUS * (hi - lo))

    if window[1] - window[0] < SleepingGpu.SLEEP:
        # a small run: one GPU finished before the last one started, so no window has all
        # eight at work; each GPU's busy share between its own first and last batch instead
        fraction = sum(sum(e - b for b, e, _ in s) / (s[-1][1] - s[0][0]) for s in spans) / len(
            spans
        )
        window = (window[0], window[0])
    else:
        fraction = busy(*window)
    return {
        "busy_fraction": fraction,
        "busy_fraction_whole_run": busy(*whole),
        "window_seconds": window[1] - window[0],
        "batches": sum(len(s) for s in spans),
        "mean_batch_items": sum(n for s in spans for _, _, n in s) / sum(len(s) for s in spans),
    }


def bench_gpu_node(work: Path, n: int, cpus: int = 8 + 12) -> dict[str, float]:
    """``n`` generated 96x72 pictures through ``run_ray`` on a local Ray of ``cpus`` logical
    CPUs and 8 declared GPUs, the ``Inpaint`` actors replaced by :class:`SleepingGpu`."""
    import ray
    from ray import cloudpickle

    from counterfactual.image import ImageConfig
    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import cluster_shape, layout_actors
    from counterfactual.pipelines.synth import run_ray
    from counterfactual.readers.coco import read_coco
    from counterfactual.readers.generate import generate_coco
    from counterfactual.synth.plan import Runtime, SynthConfig
    from counterfactual.synth.staging import plan_stages
    from counterfactual.text import TextConfig

    files = generate_coco(work / "gpu-node-coco", n, seed=4, size=(96, 72))
    records = list(read_coco(files.instances, files.captions, files.images).records)
    lama = work / "never-loaded.pt"
    lama.write_bytes(b"the simulated GPUs load no model")
    image = ImageConfig(method="inpaint", backend="lama")
    config = SynthConfig(
        image=dataclasses.replace(image, lama=dataclasses.replace(image.lama, model=str(lama))),
        text=TextConfig(method="prompt"),
        images_per_shard=50,
    )
    runtime = Runtime(device="cuda", inpaint_batch_size=BATCH, batch_size=2 * BATCH)
    logs = work / "gpu-node-logs"
    logs.mkdir(exist_ok=True)
    SleepingGpu.LOG = str(logs)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers lack this file
    from counterfactual.pipelines import loop

    real = loop.actor_class
    loop.actor_class = lambda stage: type(stage, (SleepingGpu,), {})  # type: ignore[assignment]
    ray.init(
        address="local", num_cpus=cpus, num_gpus=GPUS, include_dashboard=False, log_to_driver=False
    )
    try:
        layout = layout_actors(plan_stages(config, runtime), RayOptions(), cluster_shape())
        start = time.perf_counter()
        result = run_ray(records, work / "gpu-node-out", config, RayOptions(), runtime=runtime)
        seconds = time.perf_counter() - start
    finally:
        loop.actor_class = real
        ray.shutdown()
    figures = busy_fractions(logs)
    return {
        f"gpu_node_sim.{k}": v
        for k, v in {
            **figures,
            "gpus": GPUS,
            "sleep_per_batch_s": SLEEP,
            "workers": layout.workers,
            "items": result.items_run,
            "items_per_s": result.items_run / seconds,
        }.items()
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_gpu_node(work, args.gpu_node_images)


SECTION = Section(
    "gpu-node",
    run,
    args=(Arg("--gpu-node-images", {"type": int, "default": 1_200}),),
    note="benchmarks/sections/gpu_node.py: run_ray on a local Ray declaring 8 GPUs, each Inpaint actor a "
    "1 s sleep per batch of 8 (64 items/s for the node: long enough that this machine's 2 "
    "cores are not the limit) then a blur; busy_fraction: the GPUs' sleep over the window "
    "where all 8 had work; items_per_s includes Ray's start-up",
    targets={
        "gpu_node_sim.busy_fraction": 0.9,
    },
)
