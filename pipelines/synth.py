"""The synthesis run on Ray Data: the library's steps as streaming stages.

The driver plans the run (:func:`counterfactual.run.layout`), streams the jobs of unfinished
shards through the stages and writes each shard as its last item comes back, through the same
:class:`~counterfactual.shards.ShardAssembler` the in-process runner uses; only JPEG bytes and
metadata travel back to it. Consecutive steps that run no learned model form one CPU stage (an
actor pool: spaCy and the fills load once per actor, pixels never leave the worker); each model
step (diffusion inpainting, captioner, the CLIP verifier) is an actor pool of its own with ``num_gpus`` when its
device is CUDA, fed by CPU stages before and after it, so decoding never starves a GPU.

``ray.init()`` starts a local Ray, or joins the cluster named by ``RAY_ADDRESS`` (or
``--ray-address``); under ``ray job submit`` it joins the job's cluster.
"""

from __future__ import annotations

import math
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from counterfactual.records import ImageRecord, Status
from counterfactual.run import RunResult, deliver, finish_run, layout, prepare_run
from counterfactual.shards import ShardAssembler
from counterfactual.stages import (
    Chain,
    Done,
    Job,
    build_steps,
    step_batch_size,
    step_device,
    step_order,
    uses_model,
)
from counterfactual.synth import SynthConfig


@dataclass(frozen=True, slots=True)
class RayOptions:
    """How the stages are spread over the cluster; none of it changes the output.

    ``cpu_actors``: actors per CPU stage (default: the cluster's CPUs left after the model
    stages). ``model_actors``: actors per model stage (default: one per ``gpus_per_actor`` GPUs,
    or 1 on CPU). ``model_batch_size``: items per model call batch (default: the image config's
    ``batch_size``). ``address``: a cluster to join (default: ``RAY_ADDRESS``, else local).
    ``num_cpus`` and ``dashboard`` apply to a local Ray only.
    """

    cpu_actors: int | None = None
    model_actors: int | None = None
    gpus_per_actor: float = 1.0
    model_batch_size: int | None = None
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = True
    block_items: int = 64

    def __post_init__(self) -> None:
        for name in ("cpu_actors", "model_actors", "model_batch_size", "num_cpus"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 < self.gpus_per_actor <= 8:
            raise ValueError(f"gpus_per_actor must be in (0, 8], got {self.gpus_per_actor}")
        if self.block_items < 1:
            raise ValueError(f"block_items must be >= 1, got {self.block_items}")


@dataclass(frozen=True, slots=True)
class Stage:
    """Consecutive steps run by one actor pool."""

    steps: tuple[str, ...]
    uses_model: bool


def plan_stages(config: SynthConfig) -> list[Stage]:
    """Group the steps: each model step alone, the CPU steps between them together."""
    stages: list[Stage] = []
    for name in step_order(config):
        model = uses_model(config, name)
        if not model and stages and not stages[-1].uses_model:
            stages[-1] = Stage((*stages[-1].steps, name), False)
        else:
            stages.append(Stage((name,), model))
    return stages


def _pack(jobs: Iterable[Job | Done]) -> dict[str, np.ndarray]:
    packed = [pickle.dumps(job, protocol=5) for job in jobs]
    out = np.empty(len(packed), dtype=object)
    out[:] = packed
    return {"job": out}


def _blocks(jobs: list[bytes], block_items: int, cpus: int) -> list[Any]:
    """Arrow tables of about ``block_items`` pickled jobs, at least two per CPU while jobs last:
    the input blocks, in output order."""
    import pyarrow as pa

    n = min(len(jobs), max(math.ceil(len(jobs) / block_items), 2 * cpus))
    size = math.ceil(len(jobs) / n)
    return [
        pa.table({"job": pa.array(jobs[i : i + size], pa.binary())})
        for i in range(0, len(jobs), size)
    ]


def _unpack(batch: dict[str, np.ndarray]) -> list[Any]:
    return [pickle.loads(raw) for raw in batch["job"]]


class _Steps:
    """A Ray Data UDF: builds its steps once per actor, runs them on each batch."""

    def __init__(self, config: SynthConfig, steps: Sequence[str]) -> None:
        if not any(uses_model(config, name) for name in steps):
            import cv2

            cv2.setNumThreads(1)  # one CPU per actor: OpenCV must not spread over the others
        self.chain = Chain(build_steps(config, steps))
        self.last = steps[-1] == "encode"

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        jobs = self.chain(_unpack(batch))
        # the last stage sends the driver only what the writer needs
        return _pack([job.done() for job in jobs] if self.last else jobs)


# One class per role, so Ray's progress bars and dashboard name the stages.
class CpuSteps(_Steps):
    """Every step on CPU: decode, erase, rewrite, encode in one place."""


class Prepare(_Steps):
    """CPU steps before a model stage (decode, and a rewriter that needs no picture)."""


class Inpaint(_Steps):
    """The learned inpainter (diffusion), one model per actor."""


class Caption(_Steps):
    """The learned captioner, one model per actor."""


class Detect(_Steps):
    """The open-vocabulary detector (boxes for a corpus without them), one model per actor."""


class Plan(_Steps):
    """CPU steps between the detector and the next model stage: the alpha rules on the
    detections, then a rewriter that needs no picture (and the fills, on CPU)."""


class Verify(_Steps):
    """The counterfactual check (CLIP crops of the removed and kept classes), one model per
    actor."""


class Finish(_Steps):
    """CPU steps after the model stages (encode)."""


def _stage_class(stage: Stage, position: int, stages: Sequence[Stage]) -> type[_Steps]:
    if stage.uses_model:
        return {("edit",): Inpaint, ("verify",): Verify, ("detect",): Detect}.get(
            stage.steps, Caption
        )
    if len(stages) == 1:
        return CpuSteps
    if position == 0:
        return Prepare
    return Plan if stage.steps[0] == "select" else Finish


def init_ray(work_dir: Path, options: RayOptions) -> dict[str, Any]:
    """Start or join Ray once per process; return what the manifest records about it."""
    import ray

    dashboard = None
    if not ray.is_initialized():
        address = options.address or os.environ.get("RAY_ADDRESS")
        if address:
            ctx = ray.init(address=address)
        else:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ctx = ray.init(
                num_cpus=options.num_cpus,
                include_dashboard=options.dashboard and _has_dashboard(),
                dashboard_host="127.0.0.1",
                _temp_dir=str(ray_temp_dir(work_dir)),
            )
        dashboard = ctx.dashboard_url or None
    context = ray.get_runtime_context()
    resources = ray.cluster_resources()
    return {
        "address": context.gcs_address,
        "dashboard": dashboard,
        "cpus": resources.get("CPU", 0.0),
        "gpus": resources.get("GPU", 0.0),
        "nodes": len([n for n in ray.nodes() if n.get("Alive")]),
        "version": ray.__version__,
    }


def ray_temp_dir(work_dir: Path) -> Path:
    """``WORK/.ray`` when its path is short enough for Ray's unix sockets (which must stay under
    107 bytes), else a fresh folder under the system temp dir."""
    path = Path(work_dir).resolve() / ".ray"
    if len(str(path)) <= 40:
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix="cf-ray-"))


def _has_dashboard() -> bool:
    try:
        import aiohttp  # noqa: F401  (ray[default] installs it with the dashboard)
    except ImportError:
        return False
    return True


def stage_args(
    stage: Stage,
    stages: Sequence[Stage],
    config: SynthConfig,
    options: RayOptions,
    cpus: float,
    gpus: float,
) -> dict[str, Any]:
    """``map_batches`` arguments for one stage: actors, resources and batch size."""
    import ray

    model_stages = [s for s in stages if s.uses_model]
    cpu_stages = len(stages) - len(model_stages)

    def on_gpu(s: Stage) -> bool:
        return step_device(config, s.steps[0]).startswith("cuda")

    gpu_stages = sum(on_gpu(s) for s in model_stages)

    def actors(s: Stage) -> int:
        """The stage's actors: as asked, else the GPUs shared out among the GPU stages."""
        if options.model_actors:
            return options.model_actors
        if not on_gpu(s):
            return 1
        return max(1, int(gpus / gpu_stages // options.gpus_per_actor))

    if stage.uses_model:
        batch = options.model_batch_size or step_batch_size(config, stage.steps[0])
        return {
            "compute": ray.data.ActorPoolStrategy(size=actors(stage)),
            "num_cpus": 1,
            "num_gpus": options.gpus_per_actor if on_gpu(stage) else 0,
            "batch_size": batch,
        }
    reserved = sum(actors(s) for s in model_stages)  # each model actor holds one CPU
    n = options.cpu_actors or max(1, int(cpus) - reserved)
    pool = (
        ray.data.ActorPoolStrategy(size=n)
        if cpu_stages == 1
        else ray.data.ActorPoolStrategy(min_size=1, max_size=n)
    )
    return {"compute": pool, "num_cpus": 1, "batch_size": step_batch_size(config, stage.steps[0])}


def run_ray(
    records: Iterable[ImageRecord],
    out_dir: Path,
    config: SynthConfig,
    options: RayOptions | None = None,
    failures: Sequence[Status] = (),
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Make the shards of ``records`` in ``out_dir`` on Ray, resuming a run of the same config.

    Same contract and same bytes as :func:`counterfactual.runner.run_local`;
    ``progress(items_done, items_todo)`` is called after every batch that comes back.
    """
    import ray

    options = options or RayOptions()
    out_dir = Path(out_dir)
    run = prepare_run(out_dir, layout(records, config, failures), config)
    assembler = ShardAssembler(run.out_dir, run.todo_sizes())
    jobs = [pickle.dumps(job, protocol=5) for job in run.jobs()]
    # a run whose shards are all committed only rewrites its records: no Ray needed
    info = init_ray(out_dir, options) if jobs else {"skipped": "every shard was committed"}
    stages = plan_stages(config)
    try:
        if jobs:
            ds = ray.data.from_arrow(_blocks(jobs, options.block_items, int(info["cpus"])))
            for position, stage in enumerate(stages):
                ds = ds.map_batches(
                    _stage_class(stage, position, stages),
                    fn_constructor_kwargs={"config": config, "steps": stage.steps},
                    batch_format="numpy",
                    **stage_args(stage, stages, config, options, info["cpus"], info["gpus"]),
                )
            done = 0
            for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
                finished = _unpack(batch)
                deliver(assembler, finished)
                done += len(finished)
                if progress is not None:
                    progress(done, len(jobs))
    finally:
        assembler.abort()
    extra = {"ray": {**info, "stages": [list(s.steps) for s in stages], "options": asdict(options)}}
    return finish_run(run, assembler.committed, "ray", extra)
