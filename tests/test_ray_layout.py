"""The layout on a real Ray whose head declares one GPU (``ray.cluster_utils.Cluster``, no GPU
needed): ``synth --dry-run`` as a user types it, a run that would wait forever for a GPU that
another job holds or for a model that takes too long to load ends in one line, and progress
counts items as workers finish them, before their shard commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]
INPAINT_VERIFY = (
    "--image-method",
    "inpaint",
    "--inpaint-backend",
    "diffusers",
    "--device",
    "cuda",
    "--verify",
)
"""A dry run loads no model and looks none up: the default hub ids stay."""


def unloaded_models(tmp_path: Path) -> tuple[str, ...]:
    """Model folders that exist (the driver's checks pass) but are never loaded: their actors
    are never placed."""
    sd, clip = tmp_path / "sd", tmp_path / "clip"
    sd.mkdir()
    clip.mkdir()
    return ("--inpaint-model", str(sd), "--verify-model", str(clip))


@pytest.fixture(scope="module")
def one_gpu():
    """A head with 4 CPUs and one declared GPU; this process is its driver."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # a Ray of another test module
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 4, "num_gpus": 1, "include_dashboard": False},
    )
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 24, seed=3, size=(320, 240))


def _cli(*argv: str, address: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env |= {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    if address:
        env["RAY_ADDRESS"] = address
    cmd = [sys.executable, "-m", "counterfactual", "synth", "--dataset", "demo", *argv]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)


def test_dry_run_prints_the_layout_it_would_use(one_gpu, tmp_path):
    # the models are here (folders): exit 0 (tests/test_first_hour.py: a missing one, exit 1)
    done = _cli("--dry-run", *INPAINT_VERIFY, *unloaded_models(tmp_path), address=one_gpu.address)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    rules = [(s.pop("rule"), s.pop("seconds_per_item")) for s in out["stages"]]
    assert out == {
        "gpus": 1,
        "cpus": 4,
        "workers": 2,  # the 4 CPUs less one per model actor
        "workers_rule": "min(CPUs left 2, 2 x 1 GPU actor x batch 1 = 2)",
        "stages": [
            {"stage": "Inpaint", "actors": 1, "gpus_per_actor": 0.9},
            {"stage": "Verify", "actors": 1, "gpus_per_actor": 0.1},
        ],
    }
    # SD 2 (30 steps, guidance: 60 UNet calls) costs some 80 times verify's CLIP an item
    (inpaint_rule, sd2), (verify_rule, clip) = rules
    assert inpaint_rule == "one actor per GPU, the GPU less the light stages' 0.1"
    assert 50 < sd2 / clip < 120
    assert verify_rule.startswith("capacity >= 2 x the heavy stage's rate: 2 x ")
    assert verify_rule.endswith(": one 0.1 GPU actor per 4 GPUs (1 actor)")
    assert done.stdout.count("\n") == 1  # one JSON object, one line


def test_dry_run_sizes_verify_by_a_measured_stage_cost(one_gpu, tmp_path):
    """``--stage-cost Verify=0.033`` (a quarter of SD 2's 0.13 s): verify needs half the
    inpainter's share (2 x 0.25), so the GPU goes 2 to 1; a bad value is one line, exit 2."""
    models = unloaded_models(tmp_path)
    done = _cli(
        "--dry-run", *INPAINT_VERIFY, *models, "--stage-cost", "Verify=0.0328", "Inpaint=0.1312",
        address=one_gpu.address,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    stages = {s["stage"]: s for s in json.loads(done.stdout)["stages"]}
    assert (stages["Inpaint"]["gpus_per_actor"], stages["Verify"]["gpus_per_actor"]) == (
        0.6666,
        0.3334,
    )
    assert (stages["Inpaint"]["seconds_per_item"], stages["Verify"]["seconds_per_item"]) == (
        0.1312,
        0.0328,
    )
    bad = _cli("--dry-run", *INPAINT_VERIFY, *models, "--stage-cost", "Verify=fast", address=None)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == (
        "counterfactual synth: error: --stage-cost 'Verify=fast': expected STAGE=SECONDS with "
        "STAGE one of Inpaint, Verify, Detect, Caption and SECONDS > 0\n"
    )


def test_dry_run_of_a_layout_that_does_not_fit_is_one_line_and_exit_2(one_gpu):
    done = _cli("--dry-run", *INPAINT_VERIFY, "--gpus-per-actor", "1", address=one_gpu.address)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "counterfactual synth: error: stage Verify (verify on cuda) asks for 1 actor x 0.1 GPU "
        "and 1 CPU but the cluster has 1 GPU and 4 CPUs on 1 node; 0 fit beside Inpaint 1 x 1"
    )


def test_dry_run_starts_a_local_ray_when_none_is_named(tmp_path):
    done = _cli("--dry-run", "--num-cpus", "2", "--no-dashboard", address=None)
    assert done.returncode == 0, done.stderr
    layout = json.loads(done.stdout)
    assert layout["cpus"] == 2 and layout["workers"] == 2 and layout["stages"] == []


def test_a_gpu_held_by_another_job_ends_the_run_in_one_line(one_gpu, coco, tmp_path, capsys):
    """The layout fits the cluster, but another job holds its GPU: the Inpaint actor is never
    placed, and the run ends after --place-timeout instead of waiting forever."""

    class Holder:  # defined here: Ray ships it by value (tests/ is no package on the workers)
        def ping(self) -> bool:
            return True

    holder = ray.remote(num_gpus=1, num_cpus=0)(Holder).remote()
    ray.get(holder.ping.remote())
    out = tmp_path / "out"
    models = unloaded_models(tmp_path)
    argv = synth_args(
        coco, out, *INPAINT_VERIFY, *models, "--runner", "ray", "--place-timeout", "3"
    )
    start = time.monotonic()
    assert main([*argv, "--contact-sheet", "0"]) == 2
    assert time.monotonic() - start < 90
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "counterfactual synth: error: stage Inpaint actor 1 of 1 (0.9 GPU, 1 CPU) was not "
        "placed within 3 s (--place-timeout): the cluster has 1 GPU and 4 CPUs on 1 node, 0 GPUs"
    ), err
    ray.kill(holder)
    time.sleep(3)  # the run's own actors were killed: none takes the GPU now it is free
    assert ray.available_resources().get("GPU") == 1.0
    assert not list(out.glob("shard-*"))


def test_a_model_that_loads_too_slowly_ends_the_run_in_one_line(one_gpu, coco, tmp_path, capsys):
    from counterfactual.testing import build_tiny_inpaint_pipeline

    sd = build_tiny_inpaint_pipeline(tmp_path / "sd")
    argv = synth_args(
        coco,
        tmp_path / "out",
        *("--image-method", "inpaint", "--inpaint-backend", "diffusers"),
        *("--inpaint-model", str(sd), "--runner", "ray", "--model-actors", "1"),
        *("--load-timeout", "0.01", "--contact-sheet", "0"),
    )
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "counterfactual synth: error: stage Inpaint actor 1 of 1 (0 GPU, 1 CPU) did not load "
        "its model within 0.01 s (--load-timeout); raise it, or see the node's logs (--verbose)"
    )


def test_progress_counts_items_before_their_shard_commits(one_gpu, coco, tmp_path, monkeypatch):
    """Workers tell the driver the items they finish after every batch; the count of a shard
    in the making is replaced by its committed count, so nothing is counted twice."""
    import counterfactual.cli.synth as cli_synth
    from counterfactual.progress import Progress

    seen: list[tuple[str, int, int]] = []  # (event, shard, items)

    class Recording(Progress):
        def shard_items(self, shard: int, items: int) -> None:
            seen.append(("partial", shard, items))
            super().shard_items(shard, items)

        def update(self, *args, shard=None, items=0, **kwargs):
            if shard is not None:
                seen.append(("commit", shard, items))
            super().update(*args, shard=shard, items=items, **kwargs)

        def close(self) -> None:
            Recording.final = self.counts
            super().close()

    monkeypatch.setattr(cli_synth, "Progress", Recording)
    out = tmp_path / "out"
    extra = ("--image-method", "blur", "--images-per-shard", "8", "--batch-size", "1")
    ray_args = ("--runner", "ray", "--cpu-actors", "2")  # 3 shards: one worker makes two
    assert main(synth_args(coco, out, *extra, *ray_args, "--contact-sheet", "0")) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert Recording.final.items == manifest["items"] > 0  # every item once
    commits = {shard: i for i, (event, shard, _) in enumerate(seen) if event == "commit"}
    early = [(s, n) for i, (e, s, n) in enumerate(seen) if e == "partial" and i < commits[s]]
    assert early and all(n > 0 for _, n in early), seen  # counted before the shard committed
