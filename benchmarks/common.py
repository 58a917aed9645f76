"""Shared helpers of the bench sections (``benchmarks/sections/``) and :class:`Section`, the
shape every section declares. Importing it pins BLAS and OpenMP to one thread (the figures run
on one core); :data:`USER_ENV` keeps the environment from before, for the CLI runs.
"""

from __future__ import annotations

import os

USER_ENV = dict(os.environ)
"""The environment before the thread pins below: the CLI's runs get it, as a user runs them."""
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")


import argparse  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from counterfactual.imageio import encode_jpeg, load_rgb  # noqa: E402
from counterfactual.method.masks import box_mask  # noqa: E402
from counterfactual.readers.coco import read_coco  # noqa: E402
from counterfactual.readers.generate import generate_coco  # noqa: E402
from counterfactual.synth.tasks import ShardDone  # noqa: E402
from counterfactual.vocab import coco_vocabulary  # noqa: E402

cv2.setNumThreads(1)


@dataclass(frozen=True)
class Arg:
    """One command-line option a section reads: ``flag`` and ``argparse``'s keywords. Two
    sections may declare the same flag (``--photos``) only with the same keywords."""

    flag: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """One section of ``make bench``: ``name`` (what ``--only`` takes), its options, ``run``
    (``run(work, args)``: a scratch folder and the parsed options, returns figures by name;
    a dotted name ``a.b.c`` nests in the JSON), its note (written under ``_notes``) and its
    targets (figure name: the least, ``targets``, or the most, ``max_targets``, it should
    reach; the table marks each ok or MISSED)."""

    name: str
    run: Callable[[Path, argparse.Namespace], dict[str, float]]
    args: tuple[Arg, ...] = ()
    note: str | None = None
    targets: dict[str, float] = field(default_factory=dict)
    max_targets: dict[str, float] = field(default_factory=dict)


PHOTOS = Arg("--photos", {"type": int, "default": 30})
"""Real photos of the images and detect sections."""


def best_rate(n: int, fn: Callable[[], object], repeat: int = 3) -> float:
    """Items per second of the fastest of ``repeat`` runs of ``fn`` over ``n`` items."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n / min(times)


def coco_statistics_json(path: Path, n: int, seed: int = 0, size=(640, 480)) -> Path:
    """An ``instances`` file of ``n`` images with ``generate_coco``'s statistics (1 + Poisson(1.9)
    classes, max(classes, Poisson(7.3)) boxes of 5-35% of each side, integer ids) and no
    pictures, polygons or captions: drawn in arrays, as ``generate_coco`` takes about 40 ms an
    image for its pictures."""
    rng = np.random.default_rng(seed)
    classes = list(coco_vocabulary().classes)
    width, height = size
    n_classes = np.minimum(len(classes), 1 + rng.poisson(1.9, n))
    n_boxes = np.maximum(n_classes, rng.poisson(7.3, n))
    chosen = np.argsort(rng.random((n, len(classes))), axis=1)
    total = int(n_boxes.sum())
    w = (rng.uniform(0.05, 0.35, total) * width).astype(int)
    h = (rng.uniform(0.05, 0.35, total) * height).astype(int)
    x = (rng.random(total) * (width - w)).astype(int).tolist()
    y = (rng.random(total) * (height - h)).astype(int).tolist()
    pick = rng.random(total).tolist()
    w, h = w.tolist(), h.tolist()
    images, annotations = [], []
    k = 0
    for i in range(n):
        mine = chosen[i, : n_classes[i]].tolist()
        for j in range(int(n_boxes[i])):
            cls = mine[j] if j < len(mine) else mine[int(pick[k] * len(mine))]
            annotations.append(
                {
                    "id": k + 1,
                    "image_id": i + 1,
                    "category_id": cls + 1,
                    "bbox": [x[k], y[k], w[k], h[k]],
                    "area": w[k] * h[k],
                    "iscrowd": 0,
                }
            )
            k += 1
        images.append(
            {"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "width": width, "height": height}
        )
    categories = [{"id": k + 1, "name": c, "supercategory": ""} for k, c in enumerate(classes)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return path


def real_photos(work: Path, n: int) -> tuple[list[Path], list[np.ndarray]]:
    """JPEGs of scikit-image's real photos at 640x480, each with boxes masking ~15%."""
    import skimage.data as data

    names = ["astronaut", "coffee", "chelsea", "rocket", "camera", "immunohistochemistry"]
    rng = np.random.default_rng(0)
    paths, masks = [], []
    for i in range(n):
        photo = getattr(data, names[i % len(names)])()
        if photo.ndim == 2:
            photo = np.stack([photo] * 3, -1)
        photo = cv2.resize(photo[:, :, :3], (640, 480), interpolation=cv2.INTER_AREA)
        path = work / f"photo_{i:03d}.jpg"
        cv2.imwrite(str(path), cv2.cvtColor(photo, cv2.COLOR_RGB2BGR))
        paths.append(path)
        boxes, mask = [], np.zeros((480, 640), np.uint8)
        while np.count_nonzero(mask) < 0.14 * mask.size:
            w, h = rng.integers(40, 160), rng.integers(40, 120)
            boxes.append((int(rng.integers(0, 640 - w)), int(rng.integers(0, 480 - h)), w, h))
            mask = box_mask(480, 640, boxes)
        masks.append(mask)
    return paths, masks


def generated(work: Path, n: int, size: tuple[int, int]) -> list:
    files = generate_coco(work / f"coco{n}-{size[0]}", n, seed=3, size=size)
    return list(read_coco(files.instances, files.captions, files.images).records)


def floor_chunk(paths: list[str]) -> int:
    for p in paths:
        encode_jpeg(load_rgb(Path(p)))
    return len(paths)


def pss_sampler(stop: threading.Event, peak: list[float]) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        total = 0
        for proc in [me, *me.children(recursive=True)]:
            try:
                total += proc.memory_full_info().pss
            except (psutil.Error, OSError):
                continue
        peak[0] = max(peak[0], total)
        stop.wait(1.0)


class Clock:
    """An ``on_shard`` callback that notes when each shard came back, and the input images
    done by then."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, int]] = []

    def __call__(self, done: ShardDone) -> None:
        images = self.marks[-1][1] if self.marks else 0
        self.marks.append((time.perf_counter(), images + done.images))

    def steady_rate(self) -> float:
        """Images/s from the first shard back to the last: the rate once start-up is paid."""
        (t0, n0), (t1, n1) = self.marks[0], self.marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else float("nan")


def local_run(records: list, out: Path, config) -> tuple[float, int, Clock]:
    from counterfactual.synth.runner import run_local

    clock = Clock()
    start = time.perf_counter()
    result = run_local(records, out, config, on_shard=clock)
    return time.perf_counter() - start, result.written, clock


def ray_run(
    records: list, out: Path, config, memory: bool = False, runtime=None
) -> tuple[float, float, int, float, Clock]:
    """One Ray run on a fresh local Ray: seconds with Ray already up (as on a cluster), seconds
    including ``ray.init``, samples, peak PSS (bytes; with ``memory`` only, since reading every
    process's smaps costs CPU) during the run, and its clock. ``runtime``: where and in what
    the models run (default: ``Runtime()``)."""
    import ray

    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import init_ray
    from counterfactual.pipelines.synth import run_ray

    cold = time.perf_counter()
    init_ray(work_dir=out.parent, options=RayOptions(dashboard=False))
    # wait until the worker processes Ray starts with are up, as on a running cluster
    ray.get([ray.remote(lambda: None).remote() for _ in range(4 * (os.cpu_count() or 1))])
    stop, peak = threading.Event(), [0.0]
    sampler = threading.Thread(target=pss_sampler, args=(stop, peak), daemon=True)
    if memory:
        sampler.start()
    start = time.perf_counter()
    clock = Clock()
    result = run_ray(
        records, out, config, RayOptions(dashboard=False), on_shard=clock, runtime=runtime
    )
    end = time.perf_counter()
    stop.set()
    if memory:
        sampler.join()
    ray.shutdown()
    return end - start, end - cold, result.written, peak[0], clock


def seconds_of(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(
    n: int, floor: Callable[[], object], run: Callable[[], object], repeat: int
) -> tuple[float, float]:
    """Items/s of the fastest ``floor`` and the fastest ``run`` over ``n`` items, the two
    alternated so that both see the same machine load."""
    floor_times, run_times = [], []
    for _ in range(repeat):
        floor_times.append(seconds_of(floor))
        run_times.append(seconds_of(run))
    return n / min(floor_times), n / min(run_times)


DETECT_CAPTIONS = (
    "A person next to a dog and a bicycle.",
    "A cat sleeping on a couch beside a laptop.",
    "Two people on a bench with an umbrella.",
    "A car and a bus stopped at a traffic light.",
    "A pizza and a cup on a dining table.",
    "A man riding a horse past a truck.",
)
"""Captions naming three COCO classes each (what ``queries="caption"`` asks for)."""


ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench.py"
"""The entry point (child processes of a section run it, e.g. ``--topk-child``)."""


def cli_env() -> dict[str, str]:
    """The user's environment (no thread pins), offline, Ray quiet."""
    env = dict(USER_ENV)
    for name, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_AUTH_MODE", "disabled"),
    ):
        env.setdefault(name, value)
    return env
