"""The run's metrics in the Ray dashboard (issue 35 point 6): a synth run on a local Ray with an
``Inpaint`` actor pool (a tiny TorchScript LaMa on CPU) and one shard worker, the metrics read
from the node's Prometheus endpoint (``_metrics_export_port``) while the run works and after."""

from __future__ import annotations

import re
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

pytestmark = pytest.mark.slow  # a local Ray and a run: about 30 s

NAMES = (
    "counterfactual_items_total",
    "counterfactual_shards_total",
    "counterfactual_stage_seconds_per_item",
    "counterfactual_batch_items",
    "counterfactual_queue_depth",
    "counterfactual_gpu_memory_bytes",
)
SAMPLE = re.compile(r"^ray_(counterfactual_\w+)\{(.*)\} (\S+)$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Scraper(threading.Thread):
    """Reads the metrics endpoint every half second; keeps the last value of every
    ``counterfactual_*`` series seen (a series of an actor that has ended may leave it)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.series: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()

    def scrape(self) -> None:
        try:
            text = urllib.request.urlopen(self.url, timeout=2).read().decode()
        except OSError:
            return
        for line in text.splitlines():
            match = SAMPLE.match(line)
            if match:
                self.series[(match[1], match[2])] = float(match[3])

    def run(self) -> None:
        while not self.stop.is_set():
            self.scrape()
            self.stop.wait(0.5)

    def names(self) -> set[str]:
        """The metrics seen (a histogram by its name, not its ``_bucket``/``_sum``/``_count``)."""
        return {re.sub(r"_(bucket|sum|count)$", "", name) for name, _ in self.series}

    def values(self, name: str, **tags: str) -> list[float]:
        want = [f'{k}="{v}"' for k, v in tags.items()]
        return [
            v
            for (n, labels), v in self.series.items()
            if n == name and all(w in labels for w in want)
        ]


@pytest.fixture(scope="module")
def metrics_ray():
    if ray.is_initialized():
        ray.shutdown()
    port = free_port()
    ray.init(
        address="local",  # a Ray of its own, not the machine's latest cluster
        num_cpus=3,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 500},
    )
    yield port
    ray.shutdown()


def test_the_run_reports_its_metrics_to_the_dashboard(metrics_ray, tmp_path: Path):
    from tiny_lama import build_tiny_lama

    coco = generate_coco(tmp_path / "coco", 12, seed=5, size=(160, 120))
    lama = build_tiny_lama(tmp_path / "lama.pt")
    out = tmp_path / "out"
    scraper = Scraper(metrics_ray)
    scraper.start()
    argv = synth_args(
        coco,
        out,
        *("--image-method", "inpaint", "--inpaint-backend", "lama", "--inpaint-model", str(lama)),
        *("--runner", "ray", "--model-actors", "1", "--cpu-actors", "1"),
        *("--images-per-shard", "4", "--inpaint-batch-size", "2", "--contact-sheet", "0"),
    )
    assert main(argv) == 0

    def seen() -> bool:  # every metric, the driver's and the actors', and the last shard
        return (
            set(NAMES) <= scraper.names()
            and bool(scraper.values("counterfactual_queue_depth", stage="shards"))
            and sum(scraper.values("counterfactual_shards_total")) == 3
        )

    deadline = time.monotonic() + 30  # bounded: Ray exports every half second here
    while time.monotonic() < deadline and not seen():
        time.sleep(0.5)
    scraper.stop.set()
    scraper.join(5)
    assert set(NAMES) <= scraper.names(), sorted(scraper.names())

    rows = [line for line in (out / "status.jsonl").read_text().splitlines() if line]
    written = sum('"written"' in line for line in rows)
    assert written > 0
    assert sum(scraper.values("counterfactual_items_total", status="written")) == written
    assert sum(scraper.values("counterfactual_shards_total")) == 3  # 12 images, 4 per shard
    assert sum(scraper.values("counterfactual_stage_seconds_per_item_count", stage="Inpaint")) > 0
    batches = scraper.values("counterfactual_batch_items_count", stage="Inpaint")
    items = scraper.values("counterfactual_batch_items_sum", stage="Inpaint")
    assert sum(batches) > 0 and sum(items) / sum(batches) <= 2  # --inpaint-batch-size 2
    assert scraper.values("counterfactual_queue_depth", stage="shards")
    assert scraper.values("counterfactual_gpu_memory_bytes", stage="Inpaint") == [0.0]  # CPU
