"""The ``pipeline`` section of ``make bench``: the whole run (blur, np-removal) on a generated COCO-format dataset, Ray on every
core against the in-process runner on one, and against the floor times the cores; peak memory
(PSS of the driver and every Ray process) at two dataset sizes, which must stay flat.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from common import Arg, Section, best_rate, floor_chunk, generated, local_run, ray_run

from counterfactual.image import (
    ImageConfig,
)
from counterfactual.imageio import encode_jpeg


def _floor_rate(records: list, limit: int = 300) -> float:
    from counterfactual.shards.pictures import load_record_image

    sample = records[:limit]
    return best_rate(
        len(sample), lambda: [encode_jpeg(load_record_image(r, 1 << 30)) for r in sample], repeat=2
    )


def _parallel_floor_rate(records: list, limit: int = 300) -> float:
    """The decode+encode floor in one process per core at once: what the machine's cores give
    together (on a shared VM, less than cores x one core)."""
    import multiprocessing as mp

    cores = os.cpu_count() or 1
    paths = [str(r.root / r.file) for r in records[:limit]]
    with mp.get_context("spawn").Pool(cores) as pool:
        pool.map(floor_chunk, [paths[:10]] * cores)  # start-up outside the timing
        start = time.perf_counter()
        done = sum(pool.map(floor_chunk, [paths] * cores))
        return done / (time.perf_counter() - start)


def bench_pipeline(work: Path, n: int, memory_sizes: tuple[int, int]) -> dict[str, float]:
    from counterfactual.synth.plan import SynthConfig

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # 100 images per shard: both workers busy, and shards often enough for the steady rate
    config = SynthConfig(image=ImageConfig(method="blur"), images_per_shard=100)
    records = generated(work, n, (640, 480))
    floor = _floor_rate(records)
    parallel_floor = _parallel_floor_rate(records)
    local_s, local_n, local_clock = local_run(records, work / "local", config)
    seconds, cold, written, _, clock = ray_run(records, work / "ray", config)
    if written != local_n:
        raise RuntimeError(f"Ray wrote {written} samples, in-process {local_n}")
    cores = os.cpu_count() or 1
    ray_rate, local_rate = written / seconds, local_n / local_s
    out = {
        "pipeline_images": float(n),
        "pipeline_samples": float(written),
        "pipeline_local_samples_per_s": local_rate,
        "pipeline_ray_samples_per_s": ray_rate,
        "pipeline_ray_with_init_samples_per_s": written / cold,
        "pipeline_floor_images_per_s": floor,
        "pipeline_ray_vs_local": ray_rate / local_rate,
        "pipeline_ray_vs_floor_x_cores": ray_rate / (floor * cores),
        "machine_parallel_floor_speedup": parallel_floor / floor,
        "pipeline_ray_vs_parallel_floor": ray_rate / parallel_floor,
        "pipeline_ray_vs_local_after_startup": clock.steady_rate() / local_clock.steady_rate(),
        "pipeline_ray_after_startup_vs_floor_x_cores": clock.steady_rate() / (floor * cores),
    }
    peaks = []
    for size in memory_sizes:
        small = generated(work, size, (320, 240))
        *_, peak, _ = ray_run(small, work / f"mem{size}", config, memory=True)
        peaks.append(peak)
        out[f"pipeline_peak_pss_mib_{size}_images"] = peak / 2**20
    local_s, local_n, _ = local_run(small, work / "local-large", config)
    seconds, _, written, _, _ = ray_run(small, work / "ray-large", config)
    out[f"pipeline_ray_vs_local_{memory_sizes[1]}_images_320x240"] = (written / seconds) / (
        local_n / local_s
    )
    out["pipeline_peak_memory_ratio"] = peaks[1] / peaks[0]
    return out


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_pipeline(work, args.pipeline_images, tuple(args.memory_images))


SECTION = Section(
    "pipeline",
    run,
    args=(
        Arg("--pipeline-images", {"type": int, "default": 2_000}),
        Arg("--memory-images", {"type": int, "nargs": 2, "default": (1_000, 10_000)}),
    ),
    targets={
        "pipeline_ray_vs_local": 1.6,
        "pipeline_ray_vs_floor_x_cores": 0.7,
    },
    max_targets={
        "pipeline_peak_memory_ratio": 1.2,
    },
)
