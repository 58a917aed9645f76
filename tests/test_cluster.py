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

pytestmark = pytest.mark.slow

EXTRA = ("--image-method", "blur", "--images-per-shard", "2", "--contact-sheet", "0")


@pytest.fixture(scope="module")
def two_nodes():
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # a Ray of another test module: this one joins the cluster
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
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
