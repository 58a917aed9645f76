"""A lost node on a ``ray.cluster_utils.Cluster`` of this machine: killed as a lost machine
goes (:func:`kill_node`), and waited for until the cluster has marked it dead
(:func:`wait_until_dead`)."""

from __future__ import annotations

import time

import ray


def kill_node(cluster, node) -> None:
    """SIGKILL the node's worker processes (children of its raylet), then the node, as a lost
    machine goes; on this machine a worker process could outlive its raylet long enough to
    finish its shard."""
    import psutil

    raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
    for child in raylet.children(recursive=True):
        child.kill()
    cluster.remove_node(node, allow_graceful=False)


def wait_until_dead(cluster, node, timeout: float = 60.0) -> None:
    """Wait until the cluster has marked ``node`` dead (a run started before that would plan a
    worker on it, which then dies while starting: a failed start, not a loss mid-run)."""
    joined = not ray.is_initialized()
    if joined:
        ray.init(address=cluster.address, log_to_driver=False)
    try:
        deadline = time.monotonic() + timeout
        while any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
            assert time.monotonic() < deadline, "the killed node is still alive"
            time.sleep(0.2)
    finally:
        if joined:
            ray.shutdown()
