"""Speed figures for `make bench`: a table on stdout and `benchmarks/latest.json`.

Every figure runs on one core (BLAS and OpenMP threads pinned to 1) and is compared with a
baseline measured in the same run, because the machine is shared and absolute times drift:

- selection: images/s of the vectorised rules at COCO statistics, and one image at a time;
- select: ``counterfactual select`` end to end (JSON read, rules, plan writing) on 100,000
  images at COCO statistics, beside the one-image-at-a-time path it replaced;
- np-removal: captions/s end to end (word pre-check, spaCy parse of the rest, rewrite), beside
  spaCy's own parse rate on the same captions;
- captions: caption quality of np-removal on ``benchmarks/data/captions.tsv`` (captions written
  for it, with the classes to remove): shares fully removed, fluent by the rules of
  :mod:`counterfactual.text.fluency`, unchanged, and captions/s, for the default (repair on)
  and the paper's exact output (``--no-repair-captions``) side by side;
- image path: per method, decode -> edit -> encode on real photos at 640x480 with about 15% of
  the pixels masked, as a ratio to a decode -> encode loop over the same files (the floor);
- pipeline: the whole run (blur, np-removal) on a generated COCO-format dataset, Ray on every
  core against the in-process runner on one, and against the floor times the cores; peak memory
  (PSS of the driver and every Ray process) at two dataset sizes, which must stay flat;
- retrieval: exact top-10 of 5,000 query embeddings over a 616,767-caption gallery (COCO's
  train + val + test), 512-d, on every core in a child process: seconds and peak RSS;
- mentions: captions/s of the class-mention index (ODmAP relevance) on one core;
- verify: the verifier's seconds per sample with a CLIP of ViT-B/32 size (random weights: the
  cost does not depend on them) on real photos, against one denoising step of a UNet of Stable
  Diffusion 2 inpainting's size (random weights) times 30 steps, both on one core;
- detect: images/s of decode -> OWLv2 detection on real photos, one thread, the tests' tiny
  model and one of the base checkpoint's size (random weights), per query mode, beside a
  decode-only loop;
- corpus: the whole corpus path (WebDataset shards, tiny detector, caption-aware selection)
  against the COCO path (annotated boxes) on the same pictures, in process on one core, with
  each step's worker seconds and the readers' own rates;
- run_layer: the run layer as a user meets it, ``counterfactual synth`` in a child process:
  the driver's peak RSS over a 10x larger CSV (rows whose pictures are missing), the Ray
  runner's speed against the in-process runner's (start-up included) beside what two plain
  decode+encode processes gain over one, and the Ray driver's own CPU per input image.

Sections with a note in ``NOTES`` also write it under ``_notes`` in the JSON.
"""

from __future__ import annotations

import os

USER_ENV = dict(os.environ)
"""The environment before the thread pins below: the CLI's runs get it, as a user runs them."""
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import gpu_bench  # noqa: E402  (benchmarks/, beside this file)
import numpy as np  # noqa: E402

from counterfactual.image import (  # noqa: E402
    DiffusersConfig,
    EditRequest,
    ImageConfig,
    OpenCVConfig,
    make_editor,
)
from counterfactual.imageio import encode_jpeg, load_rgb  # noqa: E402
from counterfactual.method.masks import box_mask  # noqa: E402
from counterfactual.method.selection import SelectionConfig, select, select_many  # noqa: E402
from counterfactual.readers.coco import read_coco  # noqa: E402
from counterfactual.readers.generate import generate_coco  # noqa: E402
from counterfactual.records import Dataset  # noqa: E402
from counterfactual.synth.run import RunResult  # noqa: E402
from counterfactual.synth.tasks import ShardDone  # noqa: E402
from counterfactual.testing import (  # noqa: E402
    build_tiny_owlv2,
    write_clip_tokenizer_files,
    write_owl_tokenizer_files,
)
from counterfactual.testing.corpora import write_wds  # noqa: E402
from counterfactual.text import RewriteRequest, TextConfig, make_rewriter  # noqa: E402
from counterfactual.vocab import coco_vocabulary  # noqa: E402

cv2.setNumThreads(1)


def best_rate(n: int, fn: Callable[[], object], repeat: int = 3) -> float:
    """Items per second of the fastest of ``repeat`` runs of ``fn`` over ``n`` items."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n / min(times)


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


def bench_select_cli(work: Path, small: int = 20_000, large: int = 100_000) -> dict[str, float]:
    """``counterfactual select`` as a user runs it: the CLI in a child process (default
    workers), on a ``small`` and a ``large`` file at COCO statistics, for each policy; the
    marginal rate ``(large - small) / (t_large - t_small)`` leaves start-up (imports, process
    launch) out. Runs alternate sizes and policies; best of 3 each. The CPU time (user + sys
    of the child and its workers) is measured too: on a shared machine it moves much less
    than the wall clock."""
    files = {n: coco_statistics_json(work / "select-cli" / f"{n}.json", n) for n in (small, large)}
    out = work / "select-cli" / "plans.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    best: dict[tuple[str, int], float] = {}
    best_cpu: dict[tuple[str, int], float] = {}
    for _ in range(3):
        for policy in ("uniform", "all"):
            for n, path in files.items():
                argv = [sys.executable, "-m", "counterfactual", "select", "--annotations"]
                argv += [str(path), "--policy", policy, "--out", str(out)]
                before = _children_cpu()
                seconds = _seconds(
                    lambda argv=argv: subprocess.run(argv, env=env, check=True, capture_output=True)
                )
                cpu = _children_cpu() - before
                best[(policy, n)] = min(best.get((policy, n), math.inf), seconds)
                best_cpu[(policy, n)] = min(best_cpu.get((policy, n), math.inf), cpu)
    figures = {"select_cli_small_images": float(small), "select_cli_large_images": float(large)}
    for policy in ("uniform", "all"):
        extra = best[(policy, large)] - best[(policy, small)]
        figures[f"select_cli_{policy}_marginal_images_per_s"] = (large - small) / extra
        figures[f"select_cli_{policy}_large_seconds"] = best[(policy, large)]
        extra_cpu = best_cpu[(policy, large)] - best_cpu[(policy, small)]
        figures[f"select_cli_{policy}_marginal_cpu_us_per_image"] = (
            extra_cpu / (large - small) * 1e6
        )
    figures["select_cli_load_average"] = os.getloadavg()[0]
    return figures


def _children_cpu() -> float:
    """User + sys seconds of this process's finished children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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
            new.append(_seconds(lambda: cli_main(argv)))
            one.append(_seconds(lambda: cli_main(one_argv)))
        old.append(_seconds(lambda: _select_one_at_a_time(instances, old_out, SelectionConfig())))
        floor.append(_seconds(lambda: json.loads(instances.read_bytes())))
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


def bench_np_removal(work: Path, n: int) -> dict[str, float]:
    files = generate_coco(work / "cap", n, seed=3, write_images=False)
    records = read_coco(files.instances, files.captions, files.images).records
    selections = select_many(records, SelectionConfig())
    requests = [
        RewriteRequest(c.text, s.plans[0].removed, s.plans[0].kept)
        for r, s in zip(records, selections, strict=True)
        if s.plans
        for c in r.captions
    ]
    rewriter = make_rewriter(TextConfig())

    def run() -> None:
        rewriter._cache.clear()  # type: ignore[attr-defined]  # measure parses, not the cache
        for i in range(0, len(requests), 256):
            rewriter(requests[i : i + 256])

    rate = best_rate(len(requests), run, repeat=2)
    mentioning = [r for r in requests if rewriter.vocabulary.may_mention(r.caption, r.removed)]  # type: ignore[attr-defined]

    def run_mentioning() -> None:
        rewriter._cache.clear()  # type: ignore[attr-defined]
        for i in range(0, len(mentioning), 256):
            rewriter(mentioning[i : i + 256])

    rate_mentioning = best_rate(len(mentioning), run_mentioning, repeat=2)
    texts = [r.caption for r in requests]
    from counterfactual.text.nlp import load_spacy

    full = load_spacy(rewriter.model_name)  # type: ignore[attr-defined]
    parse = best_rate(len(texts), lambda: list(full.pipe(texts, batch_size=256)), repeat=1)
    return {
        "np_removal_captions_per_s": rate,
        "spacy_full_pipeline_parse_per_s": parse,
        "np_removal_vs_spacy_parse": rate / parse,
        "np_removal_share_parsed": len(mentioning) / len(requests),
        "np_removal_parsed_only_captions_per_s": rate_mentioning,
    }


CAPTION_CORPUS = Path(__file__).resolve().parent / "data" / "captions.tsv"


def read_caption_corpus(path: Path = CAPTION_CORPUS) -> list[tuple[str, tuple[str, ...]]]:
    """``(caption, classes to remove)`` per line of the caption corpus (``#`` lines skipped)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        caption, classes = line.split("\t")
        rows.append((caption, tuple(c.strip() for c in classes.split(","))))
    return rows


def bench_captions(repeat: int = 3) -> dict[str, float]:
    from counterfactual.text.fluency import caption_quality

    rows = read_caption_corpus()
    vocabulary = coco_vocabulary()
    unknown = {c for _, r in rows for c in r} - set(vocabulary.classes)
    if unknown:
        raise ValueError(f"{CAPTION_CORPUS}: not COCO classes: {sorted(unknown)}")
    requests = [RewriteRequest(c, r) for c, r in rows]
    figures: dict[str, float] = {"captions_corpus_size": len(rows)}
    for name, repair in (("default", True), ("paper", False)):
        rewriter = make_rewriter(TextConfig(repair=repair))

        def run(rewriter=rewriter) -> None:
            rewriter._cache.clear()  # type: ignore[attr-defined]  # measure parses, not the cache
            rewriter(requests)

        rate = best_rate(len(requests), run, repeat=repeat)
        texts = [r.text for r in rewriter(requests)]
        quality = caption_quality(
            [c for c, _ in rows], [r for _, r in rows], texts, vocabulary, rewriter.nlp
        )  # type: ignore[attr-defined]
        figures |= {
            f"captions_{name}_fully_removed": quality.fully_removed,
            f"captions_{name}_fluent": quality.fluent,
            f"captions_{name}_unchanged": quality.unchanged,
            f"captions_{name}_empty": quality.empty,
            f"captions_{name}_per_s": rate,
        }
    figures["captions_originals_fluent"] = quality.originals_fluent
    return figures


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


def bench_images(work: Path, n: int) -> dict[str, float]:
    paths, masks = real_photos(work, n)

    def floor() -> None:
        for p in paths:
            encode_jpeg(load_rgb(p))

    def method(config: ImageConfig) -> Callable[[], None]:
        editor = make_editor(config)

        def run() -> None:
            for p, m in zip(paths, masks, strict=True):
                encode_jpeg(editor([EditRequest(load_rgb(p), m)])[0])

        return run

    methods = {
        "zero": ImageConfig(method="zero"),
        "mean": ImageConfig(method="mean"),
        "blur": ImageConfig(method="blur"),
        "opencv_inpaint": ImageConfig(method="inpaint"),
        "opencv_inpaint_native": ImageConfig(method="inpaint", opencv=OpenCVConfig(max_side=0)),
    }
    out = {}
    floors = []
    for name, config in methods.items():
        # floor and method alternate, so both see the same machine load
        repeat = 1 if name == "opencv_inpaint_native" else 3
        run = method(config)
        floor_times, method_times = [], []
        for _ in range(repeat):
            floor_times.append(len(paths) / best_rate(len(paths), floor, repeat=1))
            method_times.append(len(paths) / best_rate(len(paths), run, repeat=1))
        floors.append(len(paths) / min(floor_times))
        out[f"image_{name}_images_per_s"] = len(paths) / min(method_times)
        out[f"image_{name}_vs_floor"] = min(floor_times) / min(method_times)
    out["image_floor_images_per_s"] = max(floors)
    out["image_masked_fraction"] = float(np.mean([np.count_nonzero(m) / m.size for m in masks]))
    return out


def _generated(work: Path, n: int, size: tuple[int, int]) -> list:
    files = generate_coco(work / f"coco{n}-{size[0]}", n, seed=3, size=size)
    return list(read_coco(files.instances, files.captions, files.images).records)


def _floor_rate(records: list, limit: int = 300) -> float:
    from counterfactual.shards.pictures import load_record_image

    sample = records[:limit]
    return best_rate(
        len(sample), lambda: [encode_jpeg(load_record_image(r, 1 << 30)) for r in sample], repeat=2
    )


def _floor_chunk(paths: list[str]) -> int:
    for p in paths:
        encode_jpeg(load_rgb(Path(p)))
    return len(paths)


def _parallel_floor_rate(records: list, limit: int = 300) -> float:
    """The decode+encode floor in one process per core at once: what the machine's cores give
    together (on a shared VM, less than cores x one core)."""
    import multiprocessing as mp

    cores = os.cpu_count() or 1
    paths = [str(r.root / r.file) for r in records[:limit]]
    with mp.get_context("spawn").Pool(cores) as pool:
        pool.map(_floor_chunk, [paths[:10]] * cores)  # start-up outside the timing
        start = time.perf_counter()
        done = sum(pool.map(_floor_chunk, [paths] * cores))
        return done / (time.perf_counter() - start)


def _pss_sampler(stop: threading.Event, peak: list[float]) -> None:
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


class _Clock:
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


def _local_run(records: list, out: Path, config) -> tuple[float, int, _Clock]:
    from counterfactual.synth.runner import run_local

    clock = _Clock()
    start = time.perf_counter()
    result = run_local(records, out, config, on_shard=clock)
    return time.perf_counter() - start, result.written, clock


def _ray_run(
    records: list, out: Path, config, memory: bool = False
) -> tuple[float, float, int, float, _Clock]:
    """One Ray run on a fresh local Ray: seconds with Ray already up (as on a cluster), seconds
    including ``ray.init``, samples, peak PSS (bytes; with ``memory`` only, since reading every
    process's smaps costs CPU) during the run, and its clock."""
    import ray

    from counterfactual.pipelines.synth import RayOptions, init_ray, run_ray

    cold = time.perf_counter()
    init_ray(work_dir=out.parent, options=RayOptions(dashboard=False))
    # wait until the worker processes Ray starts with are up, as on a running cluster
    ray.get([ray.remote(lambda: None).remote() for _ in range(4 * (os.cpu_count() or 1))])
    stop, peak = threading.Event(), [0.0]
    sampler = threading.Thread(target=_pss_sampler, args=(stop, peak), daemon=True)
    if memory:
        sampler.start()
    start = time.perf_counter()
    clock = _Clock()
    result = run_ray(records, out, config, RayOptions(dashboard=False), on_shard=clock)
    end = time.perf_counter()
    stop.set()
    if memory:
        sampler.join()
    ray.shutdown()
    return end - start, end - cold, result.written, peak[0], clock


def bench_pipeline(work: Path, n: int, memory_sizes: tuple[int, int]) -> dict[str, float]:
    from counterfactual.image import ImageConfig
    from counterfactual.synth.plan import SynthConfig

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # 100 images per shard: both workers busy, and shards often enough for the steady rate
    config = SynthConfig(image=ImageConfig(method="blur"), images_per_shard=100)
    records = _generated(work, n, (640, 480))
    floor = _floor_rate(records)
    parallel_floor = _parallel_floor_rate(records)
    local_s, local_n, local_clock = _local_run(records, work / "local", config)
    seconds, cold, written, _, clock = _ray_run(records, work / "ray", config)
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
        small = _generated(work, size, (320, 240))
        *_, peak, _ = _ray_run(small, work / f"mem{size}", config, memory=True)
        peaks.append(peak)
        out[f"pipeline_peak_pss_mib_{size}_images"] = peak / 2**20
    local_s, local_n, _ = _local_run(small, work / "local-large", config)
    seconds, _, written, _, _ = _ray_run(small, work / "ray-large", config)
    out[f"pipeline_ray_vs_local_{memory_sizes[1]}_images_320x240"] = (written / seconds) / (
        local_n / local_s
    )
    out["pipeline_peak_memory_ratio"] = peaks[1] / peaks[0]
    return out


def bench_diffusion_gpu(work: Path, n: int, model: str | None) -> dict[str, float]:
    """Images/s per GPU of the diffusion inpainting stage (padded crop, 512 px, 30 steps, batch
    8, float16) on real photos, when a CUDA device and a model (hub id in the local cache, or a
    path: ``--inpaint-model``) are there; otherwise nothing is measured."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available() or not model:
        print("diffusion on GPU: not measured (needs a CUDA device and --inpaint-model)")
        return {}
    paths, masks = real_photos(work, n)
    config = ImageConfig(
        method="inpaint", backend="diffusers", diffusers=DiffusersConfig(model=model)
    )
    editor = make_editor(config, device="cuda", dtype="float16", batch_size=8)
    requests = [
        EditRequest(load_rgb(p), m, ("object",), ("background",), i)
        for i, (p, m) in enumerate(zip(paths, masks, strict=True))
    ]
    editor(requests[:8])  # warm-up: kernels, allocator
    torch.cuda.synchronize()
    start = time.perf_counter()
    editor(requests)
    torch.cuda.synchronize()
    return {"diffusion_images_per_s_per_gpu": len(requests) / (time.perf_counter() - start)}


def bench_erasers(work: Path, n: int, batch: int = 8) -> dict[str, float]:
    """Pipeline calls per batch before and after the one canvas, and bytes per item of a whole
    picture against its crop (see ``NOTES["erasers"]``)."""
    import pickle

    from counterfactual.image.diffusion import canvas_side, crop_box, work_size
    from counterfactual.testing import build_tiny_inpaint_pipeline

    files = generate_coco(work / "erasers-coco", n, seed=3)
    records = read_coco(files.instances, files.captions, files.images).records
    rng = np.random.default_rng(0)
    requests = []
    for i, record in enumerate(records):
        if not record.objects:
            continue
        obj = record.objects[int(rng.integers(len(record.objects)))]
        mask = box_mask(record.height, record.width, [obj.bbox])
        if not mask.any():
            continue
        image = load_rgb(str(Path(str(record.root)) / record.file))
        requests.append(EditRequest(image, mask, (obj.category,), (), i))
    sweep = []  # boxes of many sizes and places on one picture, as a user's data may have
    for i in range(len(requests)):
        w, h = int(rng.integers(16, 600)), int(rng.integers(16, 460))
        x, y = int(rng.integers(0, 640 - w)), int(rng.integers(0, 480 - h))
        mask = box_mask(480, 640, [(x, y, w, h)])
        sweep.append(EditRequest(requests[0].image, mask, ("dog",), (), i))

    def crop_of(request: EditRequest) -> tuple[int, int, int, int]:
        y, x = np.nonzero(request.mask)
        box = (int(x.min()), int(y.min()), int(x.max()) + 1, int(y.max()) + 1)
        return crop_box(box, 0.25, *request.mask.shape)

    def calls(items: list[EditRequest], resolution: int, canvas: bool) -> tuple[float, int]:
        """Mean calls per batch under a grouping rule, and the distinct groups overall."""
        per_batch, seen = [], set()
        for start in range(0, len(items) - batch + 1, batch):
            groups: dict[object, int] = {}
            for request in items[start : start + batch]:
                x0, y0, x1, y1 = crop_of(request)
                size = work_size(x1 - x0, y1 - y0, resolution)
                key = canvas_side(size, resolution) if canvas else size
                seen.add(key)
                groups[key] = groups.get(key, 0) + 1
            per_batch.append(sum(-(-count // batch) for count in groups.values()))
        return float(np.mean(per_batch)), len(seen)

    figures: dict[str, float] = {}
    for name, items in (("coco", requests), ("sweep", sweep)):
        for resolution in (512, 0):
            tag = f"erasers_{name}_{resolution or 'native'}"
            figures[f"{tag}_calls_per_batch_before"], sizes = calls(items, resolution, False)
            figures[f"{tag}_distinct_sizes_before"] = float(sizes)
            figures[f"{tag}_calls_per_batch_after_rule"], sides = calls(items, resolution, True)
            figures[f"{tag}_distinct_sizes_after"] = float(sides)
    whole, crop = [], []
    for request in requests:
        x0, y0, x1, y1 = crop_of(request)
        whole.append(
            len(pickle.dumps((request.image, request.mask))) + len(pickle.dumps(request.image))
        )
        part = np.ascontiguousarray(request.image[y0:y1, x0:x1])
        part_mask = np.ascontiguousarray(request.mask[y0:y1, x0:x1])
        crop.append(len(pickle.dumps((part, part_mask))) + len(pickle.dumps(part)))
    model = build_tiny_inpaint_pipeline(work / "erasers-sd")
    config = ImageConfig(
        backend="diffusers", diffusers=DiffusersConfig(model=str(model), steps=1, resolution=64)
    )
    editor = make_editor(config, batch_size=batch)
    calls_made: list[int] = []
    pipeline = editor._pipeline  # type: ignore[attr-defined]

    def counting(**kwargs: object) -> object:
        calls_made.append(1)
        return pipeline(**kwargs)

    editor._pipeline = counting  # type: ignore[attr-defined]
    measured = {}
    for name, items in (("coco", requests), ("sweep", sweep)):
        per_batch = []
        for start in range(0, len(items) - batch + 1, batch):
            calls_made.clear()
            editor(items[start : start + batch])
            per_batch.append(len(calls_made))
        measured[f"erasers_{name}_64_calls_per_batch_measured"] = float(np.mean(per_batch))
    return {
        **figures,
        **measured,
        "erasers_bytes_per_item_whole": float(np.mean(whole)),
        "erasers_bytes_per_item_crop": float(np.mean(crop)),
        "erasers_crop_vs_whole": float(np.mean(crop) / np.mean(whole)),
    }


def _topk_child(queries: int, gallery: int, dim: int, k: int) -> None:
    """Run in a child on every core: print seconds and peak RSS of one exact top-k."""
    import resource

    from counterfactual.eval.metrics import topk_chunked

    rng = np.random.default_rng(0)
    gallery_emb = rng.standard_normal((gallery, dim), dtype=np.float32)
    gallery_emb /= np.linalg.norm(gallery_emb, axis=1, keepdims=True)
    query_emb = rng.standard_normal((queries, dim), dtype=np.float32)
    query_emb /= np.linalg.norm(query_emb, axis=1, keepdims=True)
    start = time.perf_counter()
    top = topk_chunked(query_emb, gallery_emb, k)
    seconds = time.perf_counter() - start
    # spot check against a direct computation for a few queries
    for q in (0, queries // 2, queries - 1):
        direct = np.argsort(-(gallery_emb @ query_emb[q]), kind="stable")[:k]
        assert np.array_equal(direct, top.indices[q]), q
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_mib": peak}))


def bench_retrieval(queries: int, gallery: int, dim: int = 512, k: int = 10) -> dict[str, float]:
    import subprocess
    import sys

    cores = str(os.cpu_count() or 1)
    env = {**os.environ, "OMP_NUM_THREADS": cores, "OPENBLAS_NUM_THREADS": cores}
    env["MKL_NUM_THREADS"] = cores
    cmd = [sys.executable, __file__, "--topk-child", str(queries), str(gallery), str(dim), str(k)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    child = json.loads(out.strip().splitlines()[-1])
    return {
        "topk_queries": queries,
        "topk_gallery": gallery,
        "topk_seconds": child["seconds"],
        "topk_peak_rss_mib": child["peak_rss_mib"],
    }


def bench_mentions(work: Path, n: int) -> dict[str, float]:
    from counterfactual.eval.mentions import MentionIndexer

    files = generate_coco(work / "mentions", n, seed=5, write_images=False)
    texts = [a["caption"] for a in json.loads(files.captions.read_text())["annotations"]]
    texts = list(dict.fromkeys(texts))  # the indexer parses each distinct caption once
    indexer = MentionIndexer()
    rate = best_rate(len(texts), lambda: indexer(texts), repeat=2)
    share = sum(1 for t in texts if indexer.vocabulary.may_mention(t, indexer.vocabulary.classes))
    return {"mentions_captions_per_s": rate, "mentions_share_parsed": share / len(texts)}


def bench_verify(work: Path, n: int) -> dict[str, float]:
    import torch
    from diffusers import UNet2DConditionModel
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    from counterfactual.method.verify import Verifier, VerifyConfig, VerifyRequest
    from counterfactual.vocab import coco_vocabulary

    torch.set_num_threads(1)
    write_clip_tokenizer_files(work / "tok")  # a CLIP BPE vocabulary, offline
    tokenizer = CLIPTokenizer.from_pretrained(str(work / "tok"), model_max_length=77)
    config = CLIPConfig()  # the defaults are ViT-B/32's sizes
    config.text_config.vocab_size = len(tokenizer)
    config.text_config.bos_token_id = tokenizer.bos_token_id
    config.text_config.eos_token_id = config.text_config.pad_token_id = tokenizer.eos_token_id
    torch.manual_seed(0)
    CLIPModel(config).save_pretrained(str(work / "clip"))
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=tokenizer).save_pretrained(
        str(work / "clip")
    )
    verifier = Verifier(
        VerifyConfig(mode="record", model=f"hf-clip:{work / 'clip'}"),
        coco_vocabulary(),
        batch_size=16,
    )
    paths, _ = real_photos(work, n)
    requests = []
    for path in paths:
        image = load_rgb(path)
        requests.append(
            VerifyRequest(
                image,
                image,
                {"dog": [(40, 40, 160, 120)], "cat": [(300, 200, 120, 90)]},
                {"person": [(200, 60, 140, 300)], "chair": [(420, 250, 150, 180)]},
                ("dog", "cat"),
                ("person", "chair"),
                "A person on a chair.",
            )
        )
    verifier(requests[:2])  # warm-up
    per_sample = 1.0 / best_rate(len(requests), lambda: verifier(requests), repeat=2)

    unet = UNet2DConditionModel(
        sample_size=64,
        in_channels=9,
        out_channels=4,
        block_out_channels=(320, 640, 1280, 1280),
        attention_head_dim=(5, 10, 20, 20),
        cross_attention_dim=1024,
        use_linear_projection=True,
        layers_per_block=2,
    ).eval()
    latents = torch.randn(2, 9, 64, 64)  # classifier-free guidance: batch of 2
    context = torch.randn(2, 77, 1024)
    with torch.inference_mode():
        unet(latents, 10, encoder_hidden_states=context)  # warm-up
        start = time.perf_counter()
        unet(latents, 10, encoder_hidden_states=context)
        step = time.perf_counter() - start
    return {
        "verify_seconds_per_sample_vit_b32_cpu": per_sample,
        "diffusion_step_seconds_sd2_unet_cpu": step,
        "verify_vs_diffusion_30_steps": per_sample / (30 * step),
    }


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _side_by_side(
    n: int, floor: Callable[[], object], run: Callable[[], object], repeat: int
) -> tuple[float, float]:
    """Items/s of the fastest ``floor`` and the fastest ``run`` over ``n`` items, the two
    alternated so that both see the same machine load."""
    floor_times, run_times = [], []
    for _ in range(repeat):
        floor_times.append(_seconds(floor))
        run_times.append(_seconds(run))
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


def _owlv2_base(folder: Path) -> Path:
    """A random OWLv2 of ``google/owlv2-base-patch16-ensemble``'s sizes (ViT-B/16 image tower
    at 960 px: 3,600 patches; 12-layer text tower, 16 tokens) with its processor (pad to a
    square, resize to 960), saved to ``folder`` as a user's checkpoint is. ``Owlv2Config()``'s
    vision default is 768 px, so the size is set to the checkpoint's 960."""
    import torch
    from transformers import (
        CLIPTokenizer,
        Owlv2Config,
        Owlv2ForObjectDetection,
        Owlv2ImageProcessor,
        Owlv2Processor,
    )

    source = folder.parent / f"{folder.name}-tokenizer-src"
    write_owl_tokenizer_files(source)
    tokenizer = CLIPTokenizer.from_pretrained(str(source), model_max_length=16)
    config = Owlv2Config(
        text_config={
            "vocab_size": len(tokenizer),  # a lookup table: its size costs no time
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={"image_size": 960},
    )
    torch.manual_seed(0)
    Owlv2ForObjectDetection(config).eval().save_pretrained(folder)
    Owlv2Processor(image_processor=Owlv2ImageProcessor(), tokenizer=tokenizer).save_pretrained(
        folder
    )
    return folder


def _decode_and_detect(detector: Callable, files: list[Path], captions: list[str]) -> None:
    detector([load_rgb(p) for p in files], captions)


def _detect_model(
    folder: Path, files: list[Path], captions: list[str], repeat: int
) -> tuple[dict[str, float], float]:
    """Figures of one saved OWLv2 (keys without the ``detect_MODEL_`` prefix) and the best
    decode-only rate seen beside it."""
    from transformers import AutoProcessor

    from counterfactual.method.detect import DetectConfig, Detector
    from counterfactual.vocab import coco_vocabulary

    def floor() -> None:
        for p in files:
            load_rgb(p)

    out: dict[str, float] = {}
    floors = []
    for mode in ("caption", "caption+vocabulary"):
        config = DetectConfig(model=str(folder), score_threshold=0.2, queries=mode)
        detector = Detector(config, coco_vocabulary(), device="cpu", dtype="float32")
        if not floors:  # warm-up: first-call allocations, kernels picked for these shapes
            detector([load_rgb(files[0])], captions[:1])
        run = functools.partial(_decode_and_detect, detector, files, captions)
        floor_rate, rate = _side_by_side(len(files), floor, run, repeat)
        floors.append(floor_rate)
        out[f"{mode.replace('+', '_')}_images_per_s"] = rate
        out[f"{mode.replace('+', '_')}_cost_in_decodes"] = floor_rate / rate
    # the image processor the detector loaded, alone on the decoded photos
    processor = AutoProcessor.from_pretrained(str(folder)).image_processor
    images = [load_rgb(p) for p in files]
    pre = best_rate(len(images), lambda: processor(images=images, return_tensors="pt"), repeat=2)
    out["preprocess_images_per_s"] = pre
    out["caption_preprocess_share"] = out["caption_images_per_s"] / pre
    return out, max(floors)


def bench_detect(work: Path, n: int, n_base: int) -> dict[str, float]:
    """Images/s of decode -> detect (``Detector`` loaded from a saved folder, as a user loads
    one) on one thread, per query mode, for the tests' tiny OWLv2 on ``n`` photos and an OWLv2
    of the base checkpoint's size on ``n_base`` of them, each beside a decode-only loop."""
    import torch

    torch.set_num_threads(1)

    (work / "detect").mkdir(exist_ok=True)
    paths, _ = real_photos(work / "detect", max(n, n_base))
    captions = [DETECT_CAPTIONS[i % len(DETECT_CAPTIONS)] for i in range(len(paths))]
    print(
        f"detect: one torch thread; the base-size OWLv2 (random weights) on {n_base} photos "
        f"only (about 20 s each on one core here), the tiny one on {n}"
    )
    models = {
        "tiny": (build_tiny_owlv2(work / "owl-tiny", grid_boxes=True), n, 3),
        "base": (_owlv2_base(work / "owl-base"), n_base, 1),
    }
    out: dict[str, float] = {}
    floors = []
    for model, (folder, count, repeat) in models.items():
        figures, floor_rate = _detect_model(folder, paths[:count], captions[:count], repeat)
        out |= {f"detect_{model}_{name}": value for name, value in figures.items()}
        floors.append(floor_rate)
    out["detect_decode_images_per_s"] = max(floors)
    out["detect_base_images_measured"] = float(n_base)
    return out


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
    read_coco_rate, read_wds_rate = _side_by_side(n, read_annotated, read_shards, repeat=3)
    out["corpus_read_coco_images_per_s"] = read_coco_rate
    out["corpus_read_wds_images_per_s"] = read_wds_rate
    out["corpus_read_wds_vs_coco"] = read_wds_rate / read_coco_rate
    return out


ROOT = Path(__file__).resolve().parents[1]


def _cli_env() -> dict[str, str]:
    """The user's environment (no thread pins), offline, Ray quiet."""
    env = dict(USER_ENV)
    for name, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("RAY_USAGE_STATS_ENABLED", "0"),
        ("RAY_AUTH_MODE", "disabled"),
    ):
        env.setdefault(name, value)
    return env


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
    import subprocess
    import sys

    import psutil

    cmd = [sys.executable, "-m", "counterfactual", "synth", *args]
    rss = cpu = 0.0
    with open(log, "wb") as fh:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_cli_env(), cwd=ROOT)
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
    pool.map(_floor_chunk, [paths[i : i + cut] for i in range(0, len(paths), cut)], chunksize=1)
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
        pool.map(_floor_chunk, [paths[:5]] * 2, chunksize=1)  # start-up outside the timing
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

    from counterfactual.pipelines.synth import RayOptions, init_ray, run_ray
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


TARGETS = {
    "gpu_node_sim.busy_fraction": 0.9,
    "pipeline_ray_vs_local": 1.6,
    "pipeline_ray_vs_floor_x_cores": 0.7,
    "selection_images_per_s": 20_000,
    "select_images_per_s": 20_000,
    "select_cli_uniform_marginal_images_per_s": 20_000,
    "select_cli_all_marginal_images_per_s": 20_000,
    "np_removal_captions_per_s": 3_000,
    "mentions_captions_per_s": 3_000,
    "image_zero_vs_floor": 0.7,
    "image_mean_vs_floor": 0.7,
    "image_blur_vs_floor": 0.7,
    "image_opencv_inpaint_vs_floor": 0.25,
    "run_layer.speed.ray_vs_local": 1.2,
    "run_layer.speed.ray_vs_local_over_two_process_gain": 0.85,
}
MAX_TARGETS = {
    "experiment.seconds": 600,  # one seed of both arms on a 2-core machine
    "pipeline_peak_memory_ratio": 1.2,
    "topk_seconds": 300,
    "topk_peak_rss_mib": 4096,
    "verify_vs_diffusion_30_steps": 0.1,
    "run_layer.memory.local_ratio": 1.25,
    "run_layer.memory.ray_ratio": 1.25,
    "run_layer.driver_cpu.main_thread_us_per_image": 50,
}


def bench_experiment(work: Path, args: list[str]) -> dict[str, float]:
    """`counterfactual experiment --seeds 1` as a user runs it (a child process, the CLI's
    defaults unless ``args`` says otherwise): seconds in all and per stage, and the arms'
    ODmAP@1 on both query sets."""
    out = work / "experiment"
    command = [sys.executable, "-m", "counterfactual", "experiment", "--out", str(out)]
    start = time.perf_counter()
    subprocess.run([*command, "--seeds", "1", *args], check=True, env=_cli_env())
    figures = {"experiment.seconds": time.perf_counter() - start}
    timings = json.loads((out / "timings.json").read_text())
    figures |= {f"experiment.seconds_{k}": v for k, v in timings.items()}
    results = json.loads((out / "results.json").read_text())
    for arm, name in (("D", "d"), ("D+D'", "d_dprime")):
        mean = results["arms"][arm]["mean"]
        figures[f"experiment.{name}_odmap1"] = mean["odmap@1"]
        figures[f"experiment.{name}_clean_odmap1"] = mean["clean_odmap@1"]
        figures[f"experiment.{name}_i2t_r1"] = mean["i2t_r@1"]
    return figures


def held_out_boxes(
    width: int, height: int, objects: list[tuple[float, float, float, float]], n: int, seed: int
) -> list[tuple[int, int, int, int]]:
    """``n`` boxes (``xywh``, 12-25% of each side) that touch no annotated object: where the
    true pixels behind a fill are known."""
    rng = np.random.default_rng(seed)
    boxes: list[tuple[int, int, int, int]] = []
    for _ in range(2000):
        if len(boxes) == n:
            break
        w = int(rng.integers(width * 12 // 100, width // 4))
        h = int(rng.integers(height * 12 // 100, height // 4))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        if not any(
            x < ox + ow and ox < x + w and y < oy + oh and oy < y + h for ox, oy, ow, oh in objects
        ):
            boxes.append((x, y, w, h))
    return boxes


def _ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two grey float images (Wang et al.: Gaussian window, sigma 1.5)."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def g(x: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(x, (11, 11), 1.5)

    ma, mb = g(a), g(b)
    va, vb, cov = g(a * a) - ma * ma, g(b * b) - mb * mb, g(a * b) - ma * mb
    ssim = ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
    return float(ssim.mean())


def fill_scores(truth: np.ndarray, filled: np.ndarray) -> dict[str, float]:
    """A fill against the true pixels of its box (``uint8`` RGB crops of the box): PSNR (dB),
    SSIM (grey), ``grad_hist``: L1 distance (0-2) of the gradient-magnitude histograms (32 bins
    over 0-255; a smear has too many small gradients), ``hf_ratio``: the fill's high-frequency
    energy (Laplacian) over the truth's (1 = the same texture; a smear is near 0)."""
    t, f = truth.astype(np.float64), filled.astype(np.float64)
    mse = float(np.mean((t - f) ** 2))
    psnr = 10 * math.log10(255**2 / max(mse, 1e-10))
    gt = cv2.cvtColor(truth, cv2.COLOR_RGB2GRAY).astype(np.float32)
    gf = cv2.cvtColor(filled, cv2.COLOR_RGB2GRAY).astype(np.float32)

    def magnitude(x: np.ndarray) -> np.ndarray:
        return np.hypot(cv2.Sobel(x, cv2.CV_32F, 1, 0), cv2.Sobel(x, cv2.CV_32F, 0, 1)) / 4

    def histogram(x: np.ndarray) -> np.ndarray:
        counts, _ = np.histogram(np.clip(magnitude(x), 0, 255), bins=32, range=(0, 256))
        return counts / counts.sum()

    def energy(x: np.ndarray) -> float:
        return float(np.mean(cv2.Laplacian(x, cv2.CV_32F) ** 2))

    return {
        "psnr": psnr,
        "ssim": _ssim(gt, gf),
        "grad_hist": float(np.abs(histogram(gt) - histogram(gf)).sum()),
        "hf_ratio": energy(gf) / max(energy(gt), 1e-6),
    }


def bench_fill(work: Path, boxes_per_picture: int = 4) -> dict[str, float]:
    """The CPU erasers on held-out regions of the demo's real photos (see ``NOTES["fill"]``)."""
    from counterfactual.readers.demo import read_demo

    editors = {
        "telea": make_editor(ImageConfig(opencv=OpenCVConfig(algorithm="telea"))),
        "ns": make_editor(ImageConfig(opencv=OpenCVConfig(algorithm="ns"))),
        "exemplar": make_editor(ImageConfig(backend="exemplar")),
    }
    scores: dict[str, list[dict[str, float]]] = {name: [] for name in editors}
    seconds = dict.fromkeys(editors, 0.0)
    count = 0
    for i, record in enumerate(read_demo(work / "fill-demo").records):
        image = load_rgb(str(Path(str(record.root)) / record.file))
        objects = [o.bbox for o in record.objects]
        for x, y, w, h in held_out_boxes(
            record.width, record.height, objects, boxes_per_picture, i
        ):
            mask = box_mask(record.height, record.width, [(x, y, w, h)])
            truth = image[y : y + h, x : x + w]
            count += 1
            for name, editor in editors.items():
                start = time.perf_counter()
                (filled,) = editor([EditRequest(image, mask, (), (), 0)])
                seconds[name] += time.perf_counter() - start
                scores[name].append(fill_scores(truth, filled[y : y + h, x : x + w]))
    figures = {"fill_regions": float(count)}
    for name, rows in scores.items():
        for key in rows[0]:
            figures[f"fill_{name}_{key}"] = round(float(np.mean([r[key] for r in rows])), 3)
        figures[f"fill_{name}_seconds_per_region"] = round(seconds[name] / max(count, 1), 3)
    return figures


SECTIONS = (
    "selection",
    "select",
    "select-cli",
    "np-removal",
    "captions",
    "images",
    "pipeline",
    "diffusion",
    "retrieval",
    "mentions",
    "verify",
    "detect",
    "corpus",
    "run_layer",
    "erasers",
    "fill",
    "experiment",
    "gpu-node",
    "lama-batches",
    "verify-cost",
    "gpu",
)
NOTES = {
    "gpu-node": (
        "benchmarks/gpu_node.py: run_ray on a local Ray declaring 8 GPUs, each Inpaint actor a "
        "1 s sleep per batch of 8 (64 items/s for the node: long enough that this machine's 2 "
        "cores are not the limit) then a blur; busy_fraction: the GPUs' sleep over the window "
        "where all 8 had work; items_per_s includes Ray's start-up"
    ),
    "lama-batches": (
        "The tests' tiny TorchScript LaMa through the lama backend, batches of 8 generated "
        "640x480 COCO-like pictures with one annotated box as the mask: forwards per batch and "
        "items per forward with the old grouping by exact padded size (lama_work_side 0) and "
        "with the square canvases (default 512); exact_over_canvas: their forwards' ratio."
    ),
    "verify-cost": (
        "Verification on the same pictures (the removed box, two kept boxes: 4 crops an item) "
        "with a random CLIP that takes CLIP's 224 px input but is tiny inside, one thread: the "
        "model actor's seconds per item on the old path (the processor resizes, crops and "
        "normalises there) and on the new one (the shard worker resized and cropped; the actor "
        "normalises and embeds); the processor alone as the actor ran it, against the worker's "
        "prepare_verify; next to the tiny LaMa's seconds per item (batch 8). With ViT-L/14 on a "
        "GPU the model part grows; the sizing rule is steps.verify_gpu_share."
    ),
    "gpu": (
        "synth on a local Ray (LaMa inpainting, verify record) with a LaMa-like FFC generator "
        "(gpu_bench.lama_like, TorchScript, big-lama's inputs and outputs; 51M parameters on "
        "CUDA) and CLIP of ViT-L/14's sizes, random weights, float32. Without CUDA it runs "
        "reduced (a narrow generator, a tiny 224 px CLIP) and the GPU rows (items/s per GPU, "
        "NVML busy fraction, ratio to the bare loop) are not measured. bare loop: the model "
        "alone, batch 8 on 512 px canvases, inputs on the device. items/s: samples over the run's "
        "seconds with Ray up (the actors' start and model load inside); steady: between the "
        "first and last shard."
    ),
    "experiment": (
        "`counterfactual experiment --seeds 1` in a child process with the CLI's "
        "defaults (6,000 scenes of 48 px, 1,500 steps of 128 per arm, one torch thread, one DataLoader worker): "
        "seconds in all (imports included) and per stage (world: the dataset and D's shards; "
        "synth: D' and the queries; train: both arms; eval: both arms on both query sets); "
        "the arms' ODmAP@1 on the pipeline's queries and the clean renders, and i2t R@1. The "
        "issue's budget is 600 s for one seed of both arms on a 2-core machine."
    ),
    "fill": (
        "The CPU erasers on held-out regions of the demo's 8 real pictures: 4 boxes each "
        "(12-25% of each side) that touch no annotated object, filled and compared with the "
        "true pixels there. psnr (dB) and ssim (grey, Gaussian window): closeness; grad_hist: "
        "L1 distance (0-2) of the gradient-magnitude histograms, hf_ratio: the fill's "
        "Laplacian energy over the truth's (1 = as much texture, a smear is near 0): whether "
        "it looks like the surroundings. seconds_per_region: the eraser's call, one region. "
        "LaMa needs its weights and is not measured here; blur is left out, as it reads the "
        "pixels it hides."
    ),
    "erasers": (
        "Batches of 8 crops. coco: eraser_images generate_coco pictures (640x480), one "
        "annotated object per image as the box mask; sweep: as many boxes of random sizes "
        "(16-600 x 16-460 px) and places on one 640x480 picture. *_calls_per_batch_before and "
        "*_distinct_sizes_before: the old grouping (one pipeline call per distinct working size "
        "of crop_box + work_size in the batch), at resolution 512 and 0 (native), from the rule; "
        "*_after_rule: the same with the canvas (canvas_side); *_64_calls_per_batch_measured: "
        "pipeline calls per batch counted on the tests' tiny SD inpainting pipeline loaded from "
        "disk (resolution 64, one step). bytes_per_item_*: pickled numpy arrays a GPU actor "
        "receives and returns per item (picture + mask in, edited picture out), the whole "
        "640x480 picture against the diffusers crop (crop_padding 0.25); crop_vs_whole: their "
        "ratio. The Ray workers send Edit's actors the crop (crop_for_edit) when the backend "
        "declares its region and best-of-n is off."
    ),
    "select-cli": (
        "`counterfactual select` as a user runs it: the CLI in a child process with its default "
        "workers (one per usable core), on files of select_cli_small_images and "
        "select_cli_large_images images at generate_coco's statistics, each policy; "
        "*_marginal_images_per_s = extra images / extra seconds between the two sizes, so "
        "start-up (interpreter, imports, process launch) is left out. Best of 3, alternated. "
        "*_marginal_cpu_us_per_image: the same difference in CPU time (user + sys of the child "
        "and its workers) per extra image, which a loaded machine moves much less than the "
        "wall clock; load_average: the 1-minute load when the section ended."
    ),
    "captions": (
        "np-removal with the default COCO vocabulary on benchmarks/data/captions.tsv (COCO-style "
        "captions written for this benchmark, each with the classes to remove). default: "
        "repair on; paper: --no-repair-captions, the paper's exact output. fully_removed: "
        "share whose rewrite names no removed class (ClassVocabulary.mentioned; no caption "
        "left counts as removed); fluent: share whose rewrite breaks none of the rules of "
        "counterfactual/text/fluency.py (dangling article, conjunction or preposition, doubled "
        "word, orphan comma, 'between' with one object); unchanged: share returned as they "
        "were; empty: no words left; per_s: captions per second, parse cache cleared, best of 3 "
        "on one core; originals_fluent: the human-written originals that pass the rules."
    ),
    "select": (
        "`counterfactual select` as a user runs it (main(argv) in process, imports done): "
        "read an instances file of select_images images at generate_coco's statistics (boxes "
        "only, integer ids; about 0.9 KB an image) as a BoxTable, the alpha rules (uniform "
        "policy) on even chunks of at most 16,384 images in select_workers processes (the default: one per "
        "usable core), one JSON line per plan. one_process: the same with --workers 1. "
        "one_at_a_time: the path it replaced (read_coco, select() per image, json.dumps per "
        "plan), on the same file, alternated; same_plans: 1 when all three wrote the same "
        "plans in the same order (ids compared as integers; the two select runs byte for "
        "byte). json_load: json.loads of the file alone. Best of `repeat`."
    ),
    "detect": (
        "decode -> Detector (OWLv2 loaded from a saved folder, float32, threshold 0.2) on real "
        "640x480 photos, captions naming three COCO classes; 'caption' asks for those three, "
        "'caption_vocabulary' for all 80. One torch thread. Random weights: the cost does not "
        "depend on them. tiny = the tests' OWLv2 (32 px); base = google/owlv2-base-patch16-"
        "ensemble's sizes (960 px, 3,600 patches), measured on detect_base_images_measured "
        "photos only, after a one-photo warm-up, since one takes about 20 s on one core. "
        "*_cost_in_decodes: seconds per image over a decode-only loop's on the same photos, "
        "alternated with it. *_preprocess_images_per_s: the image processor the detector "
        "loads, alone on decoded photos (without torchvision transformers falls back to its "
        "PIL/scipy processor); caption_preprocess_share: its part of the caption-mode time."
    ),
    "corpus": (
        "The same generated 640x480 pictures through the in-process runner on one core (one "
        "torch thread), blur, np-removal: coco = COCO annotations and boxes; wds = the pictures "
        "and first captions as WebDataset shards (100 per shard), boxes from the tests' tiny "
        "OWLv2 (random weights, grid boxes, threshold 0, queries 'caption'), caption-aware "
        "selection. images_per_s: input images per second, reading and model loading included, "
        "best of two alternated runs; written, skipped_*, failed_*: that run's status counts; "
        "seconds_<step>: worker seconds per step of that run; "
        "read_*: the readers alone (read_wds reads tar headers only). With a trained, "
        "base-size OWLv2 the detect step would cost what the detect section measures per "
        "image, and the boxes, so the selections and samples, would differ."
    ),
    "run_layer": (
        "`counterfactual synth` as a user runs it: `python -m counterfactual synth` in a child "
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
        "records; Ray's own threads tick with wall time, not with items."
    ),
}


def _gpu_images(n: int | None) -> int:
    import torch

    return n if n is not None else (2_000 if torch.cuda.is_available() else 16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/latest.json"))
    parser.add_argument("--images", type=int, default=10_000, help="images for selection")
    parser.add_argument(
        "--select-images", type=int, default=100_000, help="images for `counterfactual select`"
    )
    parser.add_argument("--captions-images", type=int, default=1_000)
    parser.add_argument("--photos", type=int, default=30)
    parser.add_argument("--pipeline-images", type=int, default=2_000)
    parser.add_argument("--memory-images", type=int, nargs=2, default=(1_000, 10_000))
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        default=None,
    )
    parser.add_argument("--topk-queries", type=int, default=5_000)
    parser.add_argument("--topk-gallery", type=int, default=616_767)
    parser.add_argument("--mention-images", type=int, default=1_000, help="x5 captions")
    parser.add_argument("--verify-images", type=int, default=24)
    parser.add_argument(
        "--detect-base-images", type=int, default=3, help="photos for the base-size OWLv2"
    )
    parser.add_argument("--corpus-images", type=int, default=300)
    parser.add_argument("--eraser-images", type=int, default=96)
    parser.add_argument(
        "--run-layer-rows", type=int, nargs=2, default=(40_000, 400_000), help="CSV rows"
    )
    parser.add_argument("--run-layer-images", type=int, default=3_000)
    parser.add_argument("--run-layer-repeat", type=int, default=2)
    parser.add_argument("--run-layer-per-shard", type=int, default=100)
    parser.add_argument(
        "--run-layer-parts", nargs="+", choices=RUN_LAYER_PARTS, default=RUN_LAYER_PARTS
    )
    parser.add_argument(
        "--run-layer-profile",
        type=Path,
        default=None,
        help="driver_cpu: cProfile (CPU time) a second Ray run into PATH",
    )
    parser.add_argument(
        "--experiment-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="options for `counterfactual experiment` (last on the line)",
    )
    parser.add_argument("--gpu-node-images", type=int, default=1_200)
    parser.add_argument("--topk-child", type=int, nargs=4, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--inpaint-model", default=None, help="diffusers model for the GPU figure")
    parser.add_argument("--lama-batch-images", type=int, default=48)
    parser.add_argument("--verify-cost-images", type=int, default=24)
    parser.add_argument(
        "--gpu-images", type=int, default=None, help="gpu: pictures (2,000 on CUDA, 16 on CPU)"
    )
    args = parser.parse_args(argv)
    if args.topk_child:
        _topk_child(*args.topk_child)
        return 0
    todo = set(args.only or SECTIONS)
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "selection" in todo:
            figures |= bench_selection(work, args.images)
        if "select" in todo:
            figures |= bench_select(work, args.select_images)
        if "select-cli" in todo:
            figures |= bench_select_cli(work)
        if "np-removal" in todo:
            figures |= bench_np_removal(work, args.captions_images)
        if "captions" in todo:
            figures |= bench_captions()
        if "images" in todo:
            figures |= bench_images(work, args.photos)
        if "pipeline" in todo:
            figures |= bench_pipeline(work, args.pipeline_images, tuple(args.memory_images))
        if "diffusion" in todo:
            figures |= bench_diffusion_gpu(work, 64, args.inpaint_model)
        if "retrieval" in todo:
            figures |= bench_retrieval(args.topk_queries, args.topk_gallery)
        if "mentions" in todo:
            figures |= bench_mentions(work, args.mention_images)
        if "verify" in todo:
            figures |= bench_verify(work, args.verify_images)
        if "detect" in todo:
            figures |= bench_detect(work, args.photos, args.detect_base_images)
        if "corpus" in todo:
            figures |= bench_corpus(work, args.corpus_images)
        if "erasers" in todo:
            figures |= bench_erasers(work, args.eraser_images)
        if "fill" in todo:
            figures |= bench_fill(work)
        if "experiment" in todo:
            figures |= bench_experiment(work, args.experiment_args)
        if "gpu-node" in todo:
            from gpu_node import bench_gpu_node

            figures |= bench_gpu_node(work, args.gpu_node_images)
        if "lama-batches" in todo:
            figures |= gpu_bench.bench_lama_batches(work, args.lama_batch_images)
        if "verify-cost" in todo:
            figures |= gpu_bench.bench_verify_cost(work, args.verify_cost_images)
        if "gpu" in todo:
            figures |= gpu_bench.bench_gpu(work, _gpu_images(args.gpu_images), _ray_run, _generated)
        if "run_layer" in todo:
            figures |= bench_run_layer(
                work,
                tuple(args.run_layer_rows),
                args.run_layer_images,
                args.run_layer_repeat,
                args.run_layer_per_shard,
                args.run_layer_profile,
                tuple(args.run_layer_parts),
            )
    print(f"{'figure':<48} {'value':>12}  target")
    for name, value in figures.items():
        if (target := TARGETS.get(name)) is not None:
            mark = f">= {target}  {'ok' if value >= target else 'MISSED'}"
        elif (target := MAX_TARGETS.get(name)) is not None:
            mark = f"<= {target}  {'ok' if value <= target else 'MISSED'}"
        else:
            mark = ""
        print(f"{name:<48} {value:>12.3f}  {mark}")
    previous = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name, value in figures.items():  # "a.b.c": previous["a"]["b"]["c"]
        *groups, key = name.split(".")
        place = previous
        for group in groups:
            place = place.setdefault(group, {})
        place[key] = round(value, 4)
    previous["_machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores; one used, except by the Ray pipeline and top-k"
    )
    notes = previous.get("_notes", {})
    previous["_notes"] = notes | {s: NOTES[s] for s in SECTIONS if s in todo and s in NOTES}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(previous, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
