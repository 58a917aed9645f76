"""What a synthesis run shows in the Ray dashboard: counters, gauges and histograms through
``ray.util.metrics``, every one named ``counterfactual_*`` (Prometheus sees them with Ray's
``ray_`` prefix) and tagged with the run (``cf-XXXXXXXX``, its actors' name prefix):

- ``counterfactual_items_total`` (status, reason): status rows of committed shards, as
  ``status.jsonl`` holds them (``written``, ``skipped``/``failed`` with their reason);
- ``counterfactual_shards_total``: shards committed;
- ``counterfactual_stage_seconds_per_item`` (stage): seconds per item of each stage where it
  runs (a model stage in its actor: the GPU's time; a CPU stage in the shard worker);
- ``counterfactual_batch_items`` (stage): items per call of a model actor;
- ``counterfactual_queue_depth`` (stage): a worker's batches sent to a model pool and not yet
  back; stage ``shards``: shard tasks the driver has queued on the workers;
- ``counterfactual_gpu_memory_bytes`` (stage): CUDA memory a model actor holds after a batch
  (0 on CPU).

Each process makes its own metric objects once (:func:`run_metrics`).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

PREFIX = "counterfactual_"
SECONDS_BOUNDS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]
BATCH_BOUNDS = [1, 2, 4, 8, 16, 32, 64, 128, 256]


class RunMetrics:
    """The run's metrics in this process (driver, shard worker or model actor)."""

    def __init__(self, run: str) -> None:
        from ray.util import metrics

        self.run = run
        tags = ("run", "stage")
        self.items = metrics.Counter(
            PREFIX + "items_total",
            "status rows of committed shards, by status and reason",
            tag_keys=("run", "status", "reason"),
        )
        self.shards = metrics.Counter(
            PREFIX + "shards_total", "shards committed", tag_keys=("run",)
        )
        self.seconds = metrics.Histogram(
            PREFIX + "stage_seconds_per_item",
            "seconds per item of a stage where it runs",
            boundaries=SECONDS_BOUNDS,
            tag_keys=tags,
        )
        self.batch = metrics.Histogram(
            PREFIX + "batch_items",
            "items per call of a model actor",
            boundaries=BATCH_BOUNDS,
            tag_keys=tags,
        )
        self.queue = metrics.Gauge(
            PREFIX + "queue_depth",
            "batches sent to a model pool and not back (stage shards: tasks queued on workers)",
            tag_keys=tags,
        )
        self.gpu_memory = metrics.Gauge(
            PREFIX + "gpu_memory_bytes", "CUDA memory a model actor holds", tag_keys=tags
        )

    def shard_done(self, counts: dict[str, int]) -> None:
        """A committed shard's status rows (``ShardDone.counts``: ``written``,
        ``failed:REASON``...)."""
        for name, n in counts.items():
            status, _, reason = name.partition(":")
            if n:
                self.items.inc(n, tags={"run": self.run, "status": status, "reason": reason})
        self.shards.inc(1, tags={"run": self.run})

    def stage_time(self, stage: str, seconds: float, items: int) -> None:
        if items:
            self.seconds.observe(seconds / items, tags={"run": self.run, "stage": stage})

    def model_batch(self, stage: str, seconds: float, items: int) -> None:
        """One call of a model actor: its time per item, its size, the GPU memory after it."""
        tags = {"run": self.run, "stage": stage}
        self.stage_time(stage, seconds, items)
        self.batch.observe(items, tags=tags)
        self.gpu_memory.set(gpu_memory(), tags=tags)

    def queue_depth(self, stage: str, depth: int) -> None:
        self.queue.set(depth, tags={"run": self.run, "stage": stage})


def gpu_memory() -> int:
    """CUDA memory this process holds (torch's allocator), 0 without torch or CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return 0
    return int(torch.cuda.memory_allocated())


@functools.cache
def run_metrics(run: str) -> RunMetrics:
    """This process's metrics of ``run`` (made once)."""
    return RunMetrics(run)


def run_of(board: str | None) -> str:
    """The run's tag: its board's name without ``-board`` (``local`` without a board)."""
    return board.removesuffix("-board") if board else "local"


def timed(
    process: Callable[[list[Any]], list[Any]], stage: str, run: str, model: bool = False
) -> Callable[[list[Any]], list[Any]]:
    """``process`` (one stage's part of a worker's batch) recording its seconds per item;
    ``model``: a model stage the worker runs itself, recorded as a model actor's call."""

    def run_part(jobs: list[Any]) -> list[Any]:
        start = time.perf_counter()
        out = process(jobs)
        metrics = run_metrics(run)
        record = metrics.model_batch if model else metrics.stage_time
        record(stage, time.perf_counter() - start, len(jobs))
        return out

    return run_part
