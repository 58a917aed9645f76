"""The ``retrieval`` section of ``make bench``: exact top-10 of 5,000 query embeddings over a 616,767-caption gallery (COCO's
train + val + test), 512-d, on every core in a child process: seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from common import BENCH, Arg, Section


def topk_child(queries: int, gallery: int, dim: int, k: int) -> None:
    """Run in a child on every core: print seconds and peak RSS of one exact top-k."""

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

    cores = str(os.cpu_count() or 1)
    env = {**os.environ, "OMP_NUM_THREADS": cores, "OPENBLAS_NUM_THREADS": cores}
    env["MKL_NUM_THREADS"] = cores
    cmd = [sys.executable, str(BENCH), "--topk-child", str(queries), str(gallery), str(dim), str(k)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    child = json.loads(out.strip().splitlines()[-1])
    return {
        "topk_queries": queries,
        "topk_gallery": gallery,
        "topk_seconds": child["seconds"],
        "topk_peak_rss_mib": child["peak_rss_mib"],
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_retrieval(args.topk_queries, args.topk_gallery)


SECTION = Section(
    "retrieval",
    run,
    args=(
        Arg("--topk-queries", {"type": int, "default": 5_000}),
        Arg("--topk-gallery", {"type": int, "default": 616_767}),
    ),
    max_targets={
        "topk_seconds": 300,
        "topk_peak_rss_mib": 4096,
    },
)
