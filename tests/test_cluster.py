"""``counterfactual synth --runner ray --ray-address ADDRESS`` on a two-node Ray cluster on this
machine (``ray.cluster_utils.Cluster``: a head and a worker node, one CPU each): the shard
workers are spread over both nodes, the manifest counts the items each node made, and the
shards are the bytes of the in-process runner's."""

from __future__ import annotations

import json

import pytest
from bad_coco import synth_args
from shard_files import run_outputs

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

ray = pytest.importorskip("ray")

from ray_nodes import kill_node, wait_until_dead  # noqa: E402

pytestmark = pytest.mark.slow

EXTRA = ("--image-method", "blur", "--images-per-shard", "2", "--contact-sheet", "0")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # a Ray of another test module: this one joins the cluster
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_shards_are_spread_over_both_nodes_with_the_bytes_of_the_local_run(two_nodes, tmp_path):
    files = generate_coco(tmp_path / "coco", 16, seed=2, size=(320, 240))
    local, spread = tmp_path / "local", tmp_path / "cluster"
    assert main(synth_args(files, local, *EXTRA)) == 0
    address = ("--runner", "ray", "--ray-address", two_nodes.address)
    assert main(synth_args(files, spread, *EXTRA, *address)) == 0
    manifest = json.loads((spread / "manifest.json").read_text())
    assert len(manifest["ray"]["nodes"]) == 2 and manifest["ray"]["cpus"] == 2
    assert manifest["ray"]["layout"]["workers"] == 2
    per_node = manifest["items_per_node"]
    assert sorted(per_node) == sorted(manifest["ray"]["nodes"])  # node ids
    assert all(n > 0 for n in per_node.values()) and sum(per_node.values()) == manifest["items"]
    nodes = {json.loads(p.read_text())["node"] for p in spread.glob("*_stats.json")}
    assert nodes == set(per_node)
    ours, theirs = run_outputs(spread), run_outputs(local)
    assert sorted(ours) == sorted(theirs) and len(ours) == 2 * 8 + 1
    for name in ours:
        assert ours[name] == theirs[name], name


@pytest.fixture
def worker_nodes():
    """A head that takes no work (no CPU) and two worker nodes of one CPU each; a dead node is
    noticed within about a second."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    quick = {"health_check_period_ms": 200, "health_check_failure_threshold": 3}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "_system_config": quick, "include_dashboard": False},
    )
    try:
        nodes = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


LOSS = ("--image-method", "blur", "--images-per-shard", "3", "--batch-size", "1")


def _killing_progress(cluster, node, monkeypatch):
    """Progress that removes ``node`` (all its processes, SIGKILL) from inside the driver's
    loop the first time a shard is reported half made after another has committed."""
    import counterfactual.cli.synth as cli_synth
    from counterfactual.progress import Progress

    class Killing(Progress):
        killed_at: int | None = None

        def shard_items(self, shard: int, items: int) -> None:
            super().shard_items(shard, items)
            if Killing.killed_at is None and self.counts.shards >= 1:
                Killing.killed_at = self.counts.shards
                kill_node(cluster, node)

    monkeypatch.setattr(cli_synth, "Progress", Killing)
    return Killing


def test_a_lost_node_costs_at_most_its_shards_and_the_rerun_resumes(
    worker_nodes, tmp_path, monkeypatch, capsys
):
    cluster, (first, second) = worker_nodes
    files = generate_coco(tmp_path / "coco", 24, seed=4, size=(320, 240))
    local = tmp_path / "local"
    assert main(synth_args(files, local, *LOSS, "--contact-sheet", "0")) == 0
    total = len(list(local.glob("shard-*.tar")))
    address = ("--runner", "ray", "--ray-address", cluster.address, "--contact-sheet", "0")

    # one of two worker nodes dies mid-run: its shards go to the other, the run finishes
    killing = _killing_progress(cluster, second, monkeypatch)
    survived = tmp_path / "survived"
    assert main(synth_args(files, survived, *LOSS, *address)) == 0
    assert killing.killed_at is not None and killing.killed_at < total, "no kill mid-run"
    assert run_outputs(survived) == run_outputs(local)
    assert "a shard worker was lost" in capsys.readouterr().err
    wait_until_dead(cluster, second)

    # the only worker node dies mid-run: one line once the replacement waited --place-timeout
    # (10 s, not the default 120), the committed shards stay, a rerun on a new node resumes
    killing = _killing_progress(cluster, first, monkeypatch)
    out = tmp_path / "resumed"
    assert main(synth_args(files, out, *LOSS, *address, "--place-timeout", "10")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "counterfactual synth: error: all 1 shard workers were lost (their nodes or processes "
        "died) and no replacement was ready within 10 s (--place-timeout); shard "
    ), err
    assert err.endswith("and the rest were not made; rerun the same command to resume"), err
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard-*.tar")}
    assert 1 <= killing.killed_at <= len(kept) < total
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    monkeypatch.undo()
    assert main(synth_args(files, out, *LOSS, *address)) == 0
    assert {k: p.stat().st_mtime_ns for k, p in ((k, out / k) for k in kept)} == kept
    manifest = json.loads((out / "manifest.json").read_text())
    # (a worker process of the simulated node may outlive its raylet long enough to commit
    # the shard it was making: then that one is resumed too)
    assert len(kept) <= manifest["shards_resumed"] < total
    assert run_outputs(out) == run_outputs(local) and not list(out.glob("*.tmp"))
