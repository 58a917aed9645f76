"""Issue 35: a shard worker lost mid-run is replaced. On a local Ray, the test kills a worker
(``ray.kill`` on its handle) after the first shard; the run finishes with the same shards as
the in-process runner, a replacement joined the pool (the worker count is back to the
layout's), and a run that keeps losing workers stops after its replacements with one line."""

from __future__ import annotations

import time

import pytest
from shard_files import run_outputs

ray = pytest.importorskip("ray")

from counterfactual.image import ImageConfig  # noqa: E402
from counterfactual.pipelines.options import RayOptions  # noqa: E402
from counterfactual.pipelines.session import ray_temp_dir, stop_ray  # noqa: E402
from counterfactual.pipelines.synth import RayRunner  # noqa: E402
from counterfactual.readers.coco import read_coco  # noqa: E402
from counterfactual.readers.generate import generate_coco  # noqa: E402
from counterfactual.readers.spec import RunInput  # noqa: E402
from counterfactual.synth.plan import Runtime, SynthConfig  # noqa: E402
from counterfactual.synth.run import RunConfig, run_shards  # noqa: E402
from counterfactual.synth.runner import run_local  # noqa: E402
from counterfactual.synth.staging import SetupError  # noqa: E402
from counterfactual.text import TextConfig  # noqa: E402

CONFIG = SynthConfig(
    image=ImageConfig(method="blur"), text=TextConfig(method="prompt"), images_per_shard=1
)


@pytest.fixture(scope="module")
def local_ray():
    temp = ray_temp_dir()  # a Ray of the test's own (another on this machine is not joined)
    ray.init(
        address="local",
        num_cpus=3,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(temp),
    )
    yield
    stop_ray(temp)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    files = generate_coco(tmp_path_factory.mktemp("coco"), 16, seed=3, size=(96, 72))
    return list(read_coco(files.instances, files.captions, files.images).records)


def _alive(runner: RayRunner) -> int:
    """The runner's shard workers that answer now (started ones and replacements)."""
    handles = [*runner.workers, *(runner.spare.handles if runner.spare else [])]
    alive = 0
    for handle in handles:
        try:
            ray.get(handle.__ray_ready__.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            continue
        alive += 1
    return alive


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_shards_are_the_same(local_ray, records, tmp_path):
    local = tmp_path / "local"
    run_local(records, local, CONFIG)
    out = tmp_path / "ray"
    options = RayOptions(cpu_actors=2, in_flight=1)
    runner = RayRunner(CONFIG, out, options, Runtime())
    seen: list[int] = []
    alive: list[int] = []

    def on_shard(done) -> None:
        seen.append(done.index)
        if len(seen) == 1:
            ray.kill(runner.workers[0], no_restart=True)
        if len(seen) == len(records):  # the pool as it stands when the last shard is in
            alive.append(_alive(runner))
        elif runner.spare is not None and runner.spare.pending:
            time.sleep(0.3)  # the replacement starts meanwhile (the other worker goes on)

    run = RunConfig(RunInput.of(records), out, CONFIG, Runtime(), on_shard=on_shard)
    run_shards(run, runner)
    assert len(runner.spare.handles) == 1  # one replacement started
    assert alive == [2]  # the layout's two workers: the lost one's place is filled
    assert run_outputs(out) == run_outputs(local)


@pytest.mark.slow
def test_workers_that_keep_dying_end_the_run_after_the_replacements(local_ray, records, tmp_path):
    out = tmp_path / "dying"
    options = RayOptions(cpu_actors=1, in_flight=1, place_timeout=20)
    runner = RayRunner(CONFIG, out, options, Runtime())

    def on_shard(done) -> None:  # every worker, the replacement too, is killed
        for handle in [*runner.workers, *(runner.spare.handles if runner.spare else [])]:
            ray.kill(handle, no_restart=True)

    run = RunConfig(RunInput.of(records), out, CONFIG, Runtime(), on_shard=on_shard)
    with pytest.raises(SetupError) as err:
        run_shards(run, runner)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("2 shard workers were lost, more than the 1 replacements") or (
        line.startswith("all 1 shard workers were lost")
    ), line
    assert line.endswith("rerun the same command to resume")
    assert len(runner.spare.handles) == 1
