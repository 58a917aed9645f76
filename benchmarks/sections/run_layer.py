"""The ``run_layer`` section of ``make bench``: the run layer as a user meets it, ``counterfactual synth`` in a child process:
the driver's peak RSS over a 10x larger CSV (rows whose pictures are missing), the Ray
runner's speed against the in-process runner's (start-up included) beside what two plain
decode+encode processes gain over one, and the Ray driver's own CPU per input image.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from common import DETECT_CAPTIONS, ROOT, Arg, Section, cli_env, floor_chunk

from counterfactual.image import (
    ImageConfig,
)
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco
from counterfactual.testing import (
    build_tiny_owlv2,
)


@dataclass(frozen=True)
class _Child:
    """One ``counterfactual synth`` child: wall seconds; ``maxrss_mib``, its peak RSS from
    ``wait4`` (the largest of it and the children it reaped: with Ray, Ray's own processes);
    ``polled_rss_mib`` and ``polled_cpu_s``: its own peak RSS and user+system CPU as last seen
    by polling that one process (psutil, every ``poll`` s)."""

    seconds: float
    maxrss_mib: float
    polled_rss_mib: float
    polled_cpu_s: float


def _synth_cli(args: list[str], log: Path, poll: float = 0.1) -> _Child:
    """Run ``python -m counterfactual synth ARGS`` as a user would, output to ``log``."""

    import psutil

    cmd = [sys.executable, "-m", "counterfactual", "synth", *args]
    rss = cpu = 0.0
    with open(log, "wb") as fh:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=cli_env(), cwd=ROOT)
        watch = psutil.Process(proc.pid)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            try:
                rss = max(rss, watch.memory_info().rss)
                times = watch.cpu_times()
                cpu = times.user + times.system
            except psutil.Error:
                pass
            time.sleep(poll)
        seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    return _Child(seconds, usage.ru_maxrss / 1024, rss / 2**20, cpu)


def _missing_pictures_csv(path: Path, rows: int) -> Path:
    """A ``key,caption,image`` CSV whose pictures do not exist: each row is read by a worker
    and becomes a ``failed: missing-file`` status, nothing is decoded."""
    import csv

    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["key", "caption", "image"])
        for i in range(rows):
            writer.writerow([f"k{i:08d}", DETECT_CAPTIONS[i % 6], f"missing/{i:08d}.jpg"])
    return path


def _run_layer_memory(work: Path, sizes: tuple[int, int]) -> dict[str, float]:
    """Peak RSS of the CLI's driver over two CSV sizes: ``--runner local`` from ``wait4``
    (the driver is the only process), ``--runner ray`` polled (the driver process only)."""
    owl = build_tiny_owlv2(work / "rl-owl", grid_boxes=True)
    out: dict[str, float] = {}
    for rows in sizes:
        table = _missing_pictures_csv(work / f"rl-{rows}.csv", rows)
        for runner in ("local", "ray"):
            target = work / f"rl-csv-{runner}-{rows}"
            args = ["--dataset", "csv", "--root", str(table), "--out", str(target)]
            args += ["--runner", runner, "--detector-model", str(owl), "--image-method", "blur"]
            child = _synth_cli([*args, "--contact-sheet", "0"], work / f"{target.name}.log", 0.2)
            status = (target / "status.jsonl").read_text().count("missing-file")
            if status != rows:
                raise RuntimeError(f"{target}: {status} missing-file rows, expected {rows}")
            peak = child.maxrss_mib if runner == "local" else child.polled_rss_mib
            out[f"{runner}_peak_rss_mib_{rows}_rows"] = peak
            out[f"{runner}_seconds_{rows}_rows"] = child.seconds
            out[f"{runner}_cli_cpu_us_per_row_{rows}_rows"] = child.polled_cpu_s / rows * 1e6
            shutil.rmtree(target)
        table.unlink()
    small, large = sizes
    for runner in ("local", "ray"):
        a, b = (
            out[f"{runner}_peak_rss_mib_{small}_rows"],
            out[f"{runner}_peak_rss_mib_{large}_rows"],
        )
        out[f"{runner}_ratio"] = b / a
        out[f"{runner}_mib_per_100k_rows"] = (b - a) / (large - small) * 100_000
    return out


@functools.cache
def _run_layer_coco(work: Path, n: int):
    """``n`` generated COCO-format 640x480 pictures, made once per bench run."""
    return generate_coco(work / f"rl-coco{n}", n, seed=3, size=(640, 480))


def _floor_split(pool, paths: list[str], parts: int) -> float:
    """Seconds for ``pool`` to decode+encode ``paths`` cut into ``parts`` tasks."""
    cut = -(-len(paths) // parts)
    start = time.perf_counter()
    pool.map(floor_chunk, [paths[i : i + cut] for i in range(0, len(paths), cut)], chunksize=1)
    return time.perf_counter() - start


def _run_layer_speed(work: Path, n: int, repeat: int, per_shard: int) -> dict[str, float]:
    """``synth --runner ray`` against ``--runner local``, both the CLI in a child process
    (imports, reading, ``ray.init`` included), alternated with one and two plain
    decode+encode processes over the same pictures; medians."""
    import multiprocessing as mp

    files = _run_layer_coco(work, n)
    data = ["--dataset", "coco", "--instances", str(files.instances)]
    data += ["--captions", str(files.captions), "--images", str(files.images)]
    data += ["--image-method", "blur", "--text-method", "np-removal", "--contact-sheet", "0"]
    data += ["--images-per-shard", str(per_shard)]
    paths = [str(p) for p in sorted(Path(files.images).glob("*.jpg"))[:300]]
    times: dict[str, list[float]] = {"local": [], "ray": [], "one": [], "two": []}
    cli_cpu: list[float] = []
    written = {}
    with mp.get_context("spawn").Pool(2) as pool:
        pool.map(floor_chunk, [paths[:5]] * 2, chunksize=1)  # start-up outside the timing
        for i in range(repeat):
            for runner in ("local", "ray"):
                target = work / f"rl-speed-{runner}{i}"
                child = _synth_cli(
                    [*data, "--runner", runner, "--out", str(target)], work / f"{target.name}.log"
                )
                times[runner].append(child.seconds)
                if runner == "ray":
                    cli_cpu.append(child.polled_cpu_s)
                manifest = json.loads((target / "manifest.json").read_text())
                written[runner] = manifest.get("counts", manifest.get("status_counts"))
                shutil.rmtree(target)
            times["one"].append(_floor_split(pool, paths, 1))
            times["two"].append(_floor_split(pool, paths, 2))
    if written["local"] != written["ray"]:
        raise RuntimeError(f"counts differ: local {written['local']}, ray {written['ray']}")
    med = {name: float(np.median(values)) for name, values in times.items()}
    ray_ratio = med["local"] / med["ray"]
    gain = med["one"] / med["two"]
    return {
        "images": float(n),
        "images_per_shard": float(per_shard),
        "repeats": float(repeat),
        "local_seconds": med["local"],
        "ray_seconds": med["ray"],
        "local_images_per_s": n / med["local"],
        "ray_images_per_s": n / med["ray"],
        "ray_vs_local": ray_ratio,
        "two_process_gain": gain,
        "ray_vs_local_over_two_process_gain": ray_ratio / gain,
        "ray_cli_cpu_us_per_image": float(np.median(cli_cpu)) / n * 1e6,
    }


def _run_layer_driver_cpu(work: Path, n: int, per_shard: int, profile: Path | None) -> dict:
    """The Ray driver's own CPU (every thread of this process, Ray's included; not the
    workers') over ``run_ray`` on ``n`` generated pictures, Ray already up (``init_ray``
    outside), reading outside; per input image."""
    import ray

    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import init_ray
    from counterfactual.pipelines.synth import run_ray
    from counterfactual.synth.plan import SynthConfig

    files = _run_layer_coco(work, n)
    start = time.process_time()
    records = read_coco(files.instances, files.captions, files.images).records
    read_cpu = time.process_time() - start
    config = SynthConfig(image=ImageConfig(method="blur"), images_per_shard=per_shard)
    options = RayOptions(dashboard=False)
    init_ray(work, options)
    try:
        wall = time.perf_counter()
        start, main = time.process_time(), time.thread_time()
        result = run_ray(records, work / "rl-driver", config, options)
        cpu, main = time.process_time() - start, time.thread_time() - main
        wall = time.perf_counter() - wall
        if profile is not None:  # a second run, so that the profiler's cost stays out
            import cProfile

            # CPU time of the whole process: what Ray's own threads burn while the driver
            # waits shows up under the call that waits
            profiler = cProfile.Profile(time.process_time)
            profiler.runcall(run_ray, records, work / "rl-driver-profiled", config, options)
            profiler.dump_stats(str(profile))
    finally:
        ray.shutdown()
    return {
        "images": float(n),
        "shards": float(len(result.shards)),
        "run_ray_cpu_s": cpu,
        "run_ray_main_thread_cpu_s": main,
        "run_ray_wall_s": wall,
        "us_per_image": cpu / n * 1e6,
        # the thread that plans, hands out tasks and writes the records: what limits how many
        # workers one driver can feed (Ray's own threads tick with time, not with items)
        "main_thread_us_per_image": main / n * 1e6,
        "read_coco_us_per_image": read_cpu / n * 1e6,
    }


RUN_LAYER_PARTS = ("memory", "speed", "driver_cpu")


def bench_run_layer(
    work: Path,
    rows: tuple[int, int],
    images: int,
    repeat: int,
    per_shard: int,
    profile: Path | None = None,
    parts: tuple[str, ...] = RUN_LAYER_PARTS,
) -> dict[str, float]:
    """The run layer's figures under ``run_layer.memory``, ``.speed`` and ``.driver_cpu``
    (those named in ``parts``)."""
    out: dict[str, float] = {}
    measures = {
        "memory": lambda: _run_layer_memory(work, rows),
        "speed": lambda: _run_layer_speed(work, images, repeat, per_shard),
        "driver_cpu": lambda: _run_layer_driver_cpu(work, images, per_shard, profile),
    }
    for part, measure in measures.items():
        if part not in parts:
            continue
        start = time.perf_counter()
        figures = measure()
        print(f"run_layer.{part} ({time.perf_counter() - start:.0f} s): {figures}", flush=True)
        out |= {f"run_layer.{part}.{name}": value for name, value in figures.items()}
    return out


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_run_layer(
        work,
        tuple(args.run_layer_rows),
        args.run_layer_images,
        args.run_layer_repeat,
        args.run_layer_per_shard,
        args.run_layer_profile,
        tuple(args.run_layer_parts),
    )


SECTION = Section(
    "run_layer",
    run,
    args=(
        Arg(
            "--run-layer-rows",
            {"type": int, "nargs": 2, "default": (40_000, 400_000), "help": "CSV rows"},
        ),
        Arg("--run-layer-images", {"type": int, "default": 3_000}),
        Arg("--run-layer-repeat", {"type": int, "default": 2}),
        Arg("--run-layer-per-shard", {"type": int, "default": 100}),
        Arg(
            "--run-layer-parts",
            {"nargs": "+", "choices": RUN_LAYER_PARTS, "default": RUN_LAYER_PARTS},
        ),
        Arg(
            "--run-layer-profile",
            {
                "type": Path,
                "default": None,
                "help": "driver_cpu: cProfile (CPU time) a second Ray run into PATH",
            },
        ),
    ),
    note="`counterfactual synth` as a user runs it: `python -m counterfactual synth` in a child "
    "process, with the user's environment (no thread pins). memory: a CSV of N rows "
    "(key, caption, image) whose pictures do not exist (each row a failed: missing-file "
    "status, read by a worker, nothing decoded), the tests' tiny OWLv2 as --detector-model "
    "(loaded, never called), default 1,000 images per shard; local_peak_rss: the CLI's "
    "ru_maxrss from wait4 (it is the only process); ray_peak_rss: the CLI process's RSS "
    "polled every 0.2 s (the driver only, not Ray's processes); *_ratio: the larger CSV's "
    "peak over the smaller's; *_cli_cpu_us_per_row: the CLI process's own CPU (polled, "
    "imports and ray.init included) per row. speed: generated COCO-format 640x480 "
    "pictures, blur, np-removal, images_per_shard per shard, --runner local against "
    "--runner ray (local Ray started inside the timing, dashboard as by default), "
    "alternated with one and two plain decode+encode processes (PIL via load_rgb, "
    "encode_jpeg, 300 of the pictures, one spawn pool, start-up outside); medians of "
    "`repeats`; two_process_gain: one process's seconds over two's; ray_vs_local: local "
    "seconds over Ray's. driver_cpu: time.process_time() of this process (every thread, "
    "Ray's C++ threads included; the workers not) around run_ray on the same pictures, "
    "Ray already up (init_ray outside), the records read outside (read_coco_us_per_image); "
    "main_thread_us_per_image: time.thread_time() of the driver's main thread, which plans, "
    "hands out tasks (Ray's serialization of their arguments included) and writes the "
    "records; Ray's own threads tick with wall time, not with items.",
    targets={
        "run_layer.speed.ray_vs_local": 1.2,
        "run_layer.speed.ray_vs_local_over_two_process_gain": 0.85,
    },
    max_targets={
        "run_layer.memory.local_ratio": 1.25,
        "run_layer.memory.ray_ratio": 1.25,
        "run_layer.driver_cpu.main_thread_us_per_image": 50,
    },
)
