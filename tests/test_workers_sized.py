"""Shard workers sized by what the GPU stages consume, one OpenCV and torch thread each
(issue 35 point 5): the rule as a table (no Ray), ``synth --dry-run`` on a simulated cluster of
two nodes with four declared GPUs each, and the thread counts inside real Ray actors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from counterfactual.image import ImageConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.synth.layout import WORKERS_PER_ITEM, Cluster, Node, plan_layout
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.staging import plan_stages

ROOT = Path(__file__).resolve().parents[1]
LAMA_VERIFY = SynthConfig(
    image=ImageConfig(method="inpaint", backend="lama"), verify=VerifyConfig(mode="record")
)


def lama_stages(batch: int, device: str = "cuda"):
    return plan_stages(LAMA_VERIFY, Runtime(device=device, inpaint_batch_size=batch))


CASES = [
    # cluster, inpaint batch, --model-batch-size, shard workers, rule
    (
        Cluster.single(192, 8),
        8,
        None,
        128,
        "min(CPUs left 176, 2 x 8 GPU actors x batch 8 = 128)",
    ),
    (
        Cluster.single(192, 8),
        16,
        None,
        176,
        "min(CPUs left 176, 2 x 8 GPU actors x batch 16 = 256)",
    ),
    (Cluster.single(192, 8), 8, 2, 32, "min(CPUs left 176, 2 x 8 GPU actors x batch 2 = 32)"),
    (Cluster.single(16, 1), 8, None, 14, "min(CPUs left 14, 2 x 1 GPU actor x batch 8 = 16)"),
    (Cluster.single(16, 1), 1, None, 2, "min(CPUs left 14, 2 x 1 GPU actor x batch 1 = 2)"),
    (
        Cluster((Node(8, 0), Node(32, 4), Node(32, 4))),
        4,
        None,
        56,
        "min(CPUs left 56, 2 x 8 GPU actors x batch 4 = 64)",
    ),
]


@pytest.mark.parametrize(("cluster", "batch", "model_batch", "workers", "rule"), CASES)
def test_workers_are_capped_by_what_the_gpu_actors_consume(
    cluster, batch, model_batch, workers, rule
):
    layout = plan_layout(lama_stages(batch), cluster, model_batch_size=model_batch)
    assert (layout.workers, layout.rule) == (workers, rule)
    assert layout.to_json()["workers_rule"] == rule


def test_the_cap_is_the_rule_at_its_boundary():
    """Exactly at the cap, and one CPU either side of it."""
    stages = lama_stages(4)
    cap = WORKERS_PER_ITEM * 2 * 4  # two GPUs, one Inpaint actor each
    for cpus, expected in ((cap + 1 + 1, cap), (cap + 1, cap), (cap, cap - 1)):
        # the Verify actors (one a GPU: verify's cost sizes them) hold a CPU each, as do the
        # two Inpaint actors
        layout = plan_layout(stages, Cluster.single(cpus + 3, 2))
        assert layout.workers == expected, (cpus, layout.rule)


def test_on_cpu_the_workers_take_every_cpu_left():
    layout = plan_layout(lama_stages(8, device="cpu"), Cluster.single(64))
    assert layout.workers == 64
    assert layout.rule == "the CPUs left after the model actors (64); no GPU stage to feed"


def test_cpu_actors_sets_the_workers_and_says_so():
    layout = plan_layout(lama_stages(1), Cluster.single(192, 8), cpu_actors=100)
    assert (layout.workers, layout.rule) == (100, "--cpu-actors 100")


ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def gpu_cluster():
    """Two nodes of 12 CPUs and 4 declared GPUs each, and a head with CPUs only for the
    driver; the thread test's actors (no CPU asked) run there too."""
    from ray.cluster_utils import Cluster as RayCluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = RayCluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=12, num_gpus=4)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_dry_run_on_two_nodes_of_four_gpus_shows_workers_and_rule(
    gpu_cluster, tmp_path, monkeypatch, capsys
):
    """The coco config's layout on 2 x 4 declared GPUs (a head with CPUs only for the driver):
    one Inpaint actor per GPU, and by the declared costs (verify's CLIP ViT-L/14 about 0.74 of
    LaMa an item) one Verify actor beside each, placed; workers by the rule."""
    from counterfactual.cli import main

    lama = tmp_path / "big-lama.pt"
    lama.write_bytes(b"not loaded by a dry run")
    monkeypatch.setenv("RAY_ADDRESS", gpu_cluster.address)
    code = main(["synth", "--dry-run", "--config", "coco", "--inpaint-model", str(lama)])
    stdout, stderr = capsys.readouterr()
    # the layout on stdout; the verifier's CLIP is not on this machine: named, exit 1
    assert code == 1, stderr
    assert "dry run: model not available: verifier" in stderr, stderr
    out = json.loads(stdout)
    rules = [s.pop("rule") for s in out["stages"]]
    assert [s.pop("seconds_per_item") for s in out["stages"]] == [0.002221, 0.001638]
    assert out == {
        "gpus": 8,
        "cpus": 26,
        "workers": 10,  # 26 CPUs less 16 model actors
        "workers_rule": "min(CPUs left 10, 2 x 8 GPU actors x batch 8 = 128)",
        "stages": [
            {"stage": "Inpaint", "actors": 8, "gpus_per_actor": 0.404},
            {"stage": "Verify", "actors": 8, "gpus_per_actor": 0.596},
        ],
    }
    assert rules[1].endswith("= 0.596 GPU per GPU: one actor per GPU of that share")


@pytest.fixture
def cluster_ray(gpu_cluster):
    """The module's cluster, joined by this process (a dry run may have joined it already)."""
    if not ray.is_initialized():
        ray.init(address=gpu_cluster.address, log_to_driver=False)
    yield


def test_every_actor_runs_one_opencv_and_one_torch_thread(cluster_ray, tmp_path):
    """A model actor and the shard workers, without and with a pool to call: one thread each,
    whatever the node's cores (OpenCV's default is every core)."""
    from counterfactual.pipelines.actors import ShardWorker, actor_class

    config = SynthConfig(image=ImageConfig(method="blur"))
    runtime = Runtime()
    stages = plan_stages(config, runtime)
    model = (
        ray.remote(actor_class("Inpaint"))
        .options(name="threads-model", num_cpus=0)
        .remote(config, runtime, stages[0])
    )
    assert ray.get(model.ready.remote()) is None
    worker = ray.remote(ShardWorker).options(num_cpus=0)
    nones = [None] * len(stages)
    alone = worker.remote(config, runtime, str(tmp_path), stages, nones, nones, 0)
    pools = [["threads-model"], *nones[1:]]
    fed = worker.remote(config, runtime, str(tmp_path), stages, pools, [4, *nones[1:]], 0)
    for actor in (model, alone, fed):
        assert ray.get(actor.threads.remote()) == {"opencv": 1, "torch": 1}
