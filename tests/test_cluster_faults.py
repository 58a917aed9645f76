"""Surviving the cluster (issue 35, point 3): a model actor that dies or goes silent, a device
that breaks (CUDA-style errors from the model file itself), a stage whose items all fail, and
out-of-memory batches, on ``ray.cluster_utils.Cluster`` nodes that declare GPUs. The model is a
tiny TorchScript file with LaMa's interface (the lama backend's real loading code), on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from arrays import random_image, rect_mask
from bad_coco import synth_args

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from ray_nodes import kill_node, wait_until_dead  # noqa: E402
from tiny_lama import build_tiny_lama  # noqa: E402
from torch import nn  # noqa: E402

from counterfactual.cli import main  # noqa: E402
from counterfactual.image import EditRequest, ImageConfig, LamaConfig, make_editor  # noqa: E402
from counterfactual.readers.generate import generate_coco  # noqa: E402
from counterfactual.synth.steps import DeviceFailure, model_outputs  # noqa: E402


class IllegalAddress(nn.Module):
    """Loads and passes the 64 px probe, then fails as a GPU whose context is lost."""

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if image.shape[2] > 64:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return image


class Failing(nn.Module):
    """Fails every real batch with an ordinary model error."""

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if image.shape[2] > 64:
            raise RuntimeError("boom")
        return image


class SmallMemory(nn.Module):
    """Out of memory on more than two images at once."""

    def forward(self, image: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if image.shape[0] > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return image * (1 - mask) + 0.5 * mask


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 8, seed=3, size=(320, 240))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "good": build_tiny_lama(root / "good.pt"),
        "cuda": build_tiny_lama(root / "cuda.pt", IllegalAddress()),
        "failing": build_tiny_lama(root / "failing.pt", Failing()),
        "oom": build_tiny_lama(root / "oom.pt", SmallMemory()),
    }


def _lama(model: Path, *extra: str) -> tuple[str, ...]:
    return (
        *("--image-method", "inpaint", "--inpaint-backend", "lama", "--inpaint-model", str(model)),
        *("--runner", "ray", "--model-actors", "2", "--contact-sheet", "0"),
        *("--images-per-shard", "2", "--batch-size", "2"),
        *extra,
    )


# ------------------------------------------------------------------ out of memory, in process


def test_out_of_memory_halves_the_batch_before_one_item(models) -> None:
    config = ImageConfig(method="inpaint", backend="lama", lama=LamaConfig(str(models["oom"])))
    editor = make_editor(config, batch_size=8)
    sizes: list[int] = []
    model = editor._model  # type: ignore[attr-defined]

    def counting(image, mask):
        sizes.append(image.shape[0])
        return model(image, mask)

    editor._model = counting  # type: ignore[attr-defined]
    requests = [
        (i, EditRequest(random_image(240, 320, i), rect_mask(240, 320, 50, 100, 60, 120)))
        for i in range(8)
    ]
    out = model_outputs(editor, requests)
    assert [job for job, _ in out] == list(range(8))
    assert sizes == [8, 4, 2, 2, 4, 2, 2]  # halves, never one by one
    for (_, request), (_, edited) in zip(requests, out, strict=True):
        keep = request.mask == 0
        np.testing.assert_array_equal(edited[keep], request.image[keep])


def test_a_device_error_is_not_an_item_error(models) -> None:
    config = ImageConfig(method="inpaint", backend="lama", lama=LamaConfig(str(models["cuda"])))
    editor = make_editor(config)
    request = EditRequest(random_image(240, 320), rect_mask(240, 320, 50, 100, 60, 120))
    with pytest.raises(DeviceFailure, match=r"^cpu: .*CUDA error: an illegal memory access"):
        model_outputs(editor, [(0, request)])


# ------------------------------------------------------------------ on a cluster


@pytest.fixture(scope="module")
def gpu_cluster():
    """A head that takes no work and two nodes of 2 CPUs and 1 declared GPU each; a dead node
    is noticed within about a second. One cluster for the module: ``gpu_nodes`` replaces a
    node a test removed."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    quick = {"health_check_period_ms": 200, "health_check_failure_threshold": 3}
    # the dashboard stays: the actor-killing helper finds the actors through its state API
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": quick})
    try:
        nodes = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        yield cluster, nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def gpu_nodes(gpu_cluster):
    """The module's cluster with two live GPU nodes (one a test removed is replaced, once the
    cluster has marked it dead); the test's driver leaves it afterwards."""
    cluster, nodes = gpu_cluster
    for node in [n for n in nodes if n not in cluster.worker_nodes]:
        wait_until_dead(cluster, node)
        nodes.remove(node)
    while len(nodes) < 2:
        nodes.append(cluster.add_node(num_cpus=2, num_gpus=1))
    cluster.wait_for_nodes()
    try:
        yield cluster, list(nodes)
    finally:
        ray.shutdown()
        nodes[:] = [n for n in nodes if n in cluster.worker_nodes]
        nodes.extend(n for n in cluster.worker_nodes if n not in nodes)


def _cli(argv: list[str], address: str, monkeypatch, capsys) -> tuple[int, str]:
    """``counterfactual synth`` in this process, joining the cluster through ``RAY_ADDRESS``:
    its exit code and stderr."""
    monkeypatch.setenv("RAY_ADDRESS", address)
    code = main(argv)
    return code, capsys.readouterr().err


@pytest.mark.slow
def test_a_broken_gpu_ends_the_run_in_one_line_naming_it(
    gpu_nodes, coco, models, tmp_path, monkeypatch, capsys
):
    cluster, _ = gpu_nodes
    out = tmp_path / "out"
    argv = synth_args(coco, out, *_lama(models["cuda"], "--call-timeout", "60"))
    code, err = _cli(argv, cluster.address, monkeypatch, capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("counterfactual synth: error: all 2 actors of a model stage are lost")
    assert "last device failure: " in line and "illegal memory access" in line
    assert "rerun the same command to resume" in line and len(line) <= 430
    print(line)


@pytest.mark.slow
def test_a_stage_whose_items_all_fail_ends_the_run(
    gpu_nodes, coco, models, tmp_path, monkeypatch, capsys
):
    cluster, _ = gpu_nodes
    argv = synth_args(coco, tmp_path / "out", *_lama(models["failing"], "--failure-window", "4"))
    code, err = _cli(argv, cluster.address, monkeypatch, capsys)
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line == (
        "counterfactual synth: error: stage Inpaint: 4 of its last 4 items failed with "
        "model-error (more than 50%); the model or its device is failing, see the status rows' "
        "details; the run stops here, rerun to resume"
    ), line
    print(line)


def _actor_killing_progress(monkeypatch, cluster, lost_node=None):
    """Progress that, once a shard has committed, kills one Inpaint actor for good (or, with
    ``lost_node``, removes that node and every process on it)."""
    import counterfactual.cli.synth as cli_synth
    from counterfactual.progress import Progress

    class Killing(Progress):
        killed = False

        def shard_items(self, shard: int, items: int) -> None:
            super().shard_items(shard, items)
            if not Killing.killed and self.counts.shards >= 1:
                Killing.killed = True
                if lost_node is not None:
                    kill_node(cluster, lost_node)
                    return
                from ray.util.state import list_actors

                job = ray.get_runtime_context().get_job_id()  # this run's, not an earlier one's
                inpaint = [
                    a
                    for a in list_actors(address=cluster.address)
                    if a.class_name == "Inpaint" and a.state == "ALIVE" and a.job_id == job
                ]
                ray.kill(ray.get_actor(inpaint[0].name), no_restart=True)

    monkeypatch.setattr(cli_synth, "Progress", Killing)
    return Killing


@pytest.mark.slow
def test_a_killed_model_actor_leaves_the_run_to_the_other(
    gpu_nodes, coco, models, tmp_path, monkeypatch, capsys
):
    cluster, _ = gpu_nodes
    killing = _actor_killing_progress(monkeypatch, cluster)
    out = tmp_path / "out"
    argv = synth_args(coco, out, *_lama(models["good"], "--ray-address", cluster.address))
    assert main(argv) == 0
    assert killing.killed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["items"] > 0 and len(list(out.glob("shard-*.tar"))) == 4
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert rows and not [r for r in rows if r.get("status") == "failed"]  # nothing lost
    err = capsys.readouterr().err
    assert "a shard worker was lost" not in err  # the workers were never blamed


@pytest.mark.slow
def test_a_node_lost_mid_shard_with_its_model_actor(
    gpu_nodes, coco, models, tmp_path, monkeypatch, capsys
):
    cluster, (_, second) = gpu_nodes
    killing = _actor_killing_progress(monkeypatch, cluster, second)
    out = tmp_path / "out"
    extra = ("--ray-address", cluster.address, "--call-timeout", "5")
    argv = synth_args(coco, out, *_lama(models["good"], *extra))
    code = main(argv)
    assert killing.killed
    err = capsys.readouterr().err.strip().splitlines()
    if code == 2:  # the run said so in one line; the rerun resumes on the node left
        assert err[-1].startswith("counterfactual synth: error: "), err[-1]
        cluster.add_node(num_cpus=2, num_gpus=1)
        cluster.wait_for_nodes()
        monkeypatch.undo()
        assert main(argv) == 0
    else:
        assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert (
        len(list(out.glob("shard-*.tar"))) == 4
        and manifest["items"] + manifest.get("shards_resumed", 0) >= 4
    )
