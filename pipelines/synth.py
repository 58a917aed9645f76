"""The synthesis run on Ray: shard workers that write their own shards, model actors they call.

The driver (:func:`counterfactual.synth.run.run_shards`) streams shard tasks to a pool of
:class:`ShardWorker` actors, at most ``in_flight`` queued per worker, and hears back only each
shard's counts. A worker reads its task's input (a slice of records, or a corpus piece it reads
itself), plans it, runs the steps batch by batch and writes the shard's tar and then its stats
file straight into OUT (a folder every node sees, or an object store), exactly as the
in-process runner does (:class:`counterfactual.synth.tasks.ShardMaker`): img2dataset's model.

Steps that declare a learned model (:class:`~counterfactual.synth.steps.Resources`: diffusion
inpainting, the captioner, the detector, the CLIP verifier) on a GPU are actor pools of their
own, one actor class per declared stage (``Inpaint``, ``Caption``, ``Detect``, ``Verify``, with
``num_gpus``: :func:`actor_class`); the workers send them batches of decoded
pictures through Ray's object store and go on with the CPU steps, so several workers keep a GPU
fed. On CPU a worker runs every step itself (``--model-actors N`` makes model pools on CPU too).

Before any shard starts, impossible setups fail in seconds with one line: a stage that needs
more GPUs than the cluster has, an actor whose model does not load. ``ray.init()`` starts a
local Ray, or joins the cluster named by ``RAY_ADDRESS`` (or ``--ray-address``); under
``ray job submit`` it joins the job's cluster.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from counterfactual import fs
from counterfactual.progress import Progress
from counterfactual.readers.spec import RunInput
from counterfactual.records import ImageRecord, Status
from counterfactual.synth import signals
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.run import RunResult, preflight, run_shards
from counterfactual.synth.steps import (
    Chain,
    Job,
    Process,
    SetupError,
    Stage,
    Staged,
    crop_for_edit,
    in_chunks,
    paste_edit,
    plan_stages,
    ships_crops,
    start_steps,
)
from counterfactual.synth.tasks import ShardDone, ShardMaker, ShardTask


@dataclass(frozen=True, slots=True)
class RayOptions:
    """How the work is spread over the cluster; none of it changes the output.

    ``cpu_actors``: shard workers (default: the cluster's CPUs left after the model actors).
    ``model_actors``: actors per model stage (default: one per ``gpus_per_actor`` GPUs shared
    among the GPU stages; on CPU none: workers run models themselves, unless set).
    ``model_batch_size``: items per model call (default: the step's own batch size).
    ``in_flight``: tasks queued per worker. ``address``: a cluster to join (default:
    ``RAY_ADDRESS``, else local). ``num_cpus`` and ``dashboard`` apply to a local Ray only.
    ``verbose``: Ray's own logs and worker output on the driver's terminal.
    """

    cpu_actors: int | None = None
    model_actors: int | None = None
    gpus_per_actor: float = 1.0
    model_batch_size: int | None = None
    address: str | None = None
    num_cpus: int | None = None
    dashboard: bool = True
    in_flight: int = 2
    verbose: bool = False

    def __post_init__(self) -> None:
        for name in ("cpu_actors", "model_actors", "model_batch_size", "num_cpus", "in_flight"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not 0 < self.gpus_per_actor <= 8:
            raise ValueError(f"gpus_per_actor must be in (0, 8], got {self.gpus_per_actor}")


def pooled(stage: Stage, options: RayOptions) -> bool:
    """Whether a stage runs on an actor pool of its own (a model on a GPU, or asked for)."""
    if not stage.uses_model:
        return False
    return options.model_actors is not None or on_gpu(stage)


def on_gpu(stage: Stage) -> bool:
    """Whether the stage's model step declares a CUDA device."""
    return stage.resources is not None and stage.resources.device.startswith("cuda")


# ------------------------------------------------------------------------------ actors


class _ModelStep:
    """A model step's actor: loads its model once, runs one batch per call. A model that does
    not load is reported by :meth:`ready` (one line), not as a crash of the actor."""

    def __init__(self, config: SynthConfig, runtime: Runtime, stage: Stage) -> None:
        self.chain, self.error = _build(config, runtime, stage)

    def ready(self) -> str | None:
        return self.error

    def run(self, jobs: list[Job]) -> list[Job]:
        return self.chain(jobs)


@functools.cache
def actor_class(stage: str) -> type[_ModelStep]:
    """The actor class of a model stage, named as the step declares it (``Inpaint``,
    ``Caption``, ``Detect``, ``Verify``), so the dashboard names each pool."""
    return type(stage, (_ModelStep,), {"__doc__": f"The {stage} model, one per actor."})


def _build(config: SynthConfig, runtime: Runtime, stage: Stage) -> tuple[Chain, str | None]:
    """The stage's steps as a chain, or the one-line error of the first that cannot start
    (reported by ``ready``, so the driver ends the run with it instead of a crashed actor)."""
    try:
        return Chain(start_steps(config, stage.steps, runtime=runtime), stage.given), None
    except SetupError as err:
        return Chain([], ()), str(err)


class _RemoteStep:
    """A pooled model step as seen from a worker: a batch cut into the model's batch size,
    spread over the pool's actors, results back in order."""

    def __init__(
        self,
        actors: Sequence[str],
        batch_size: int,
        start: int,
        crops: SynthConfig | None = None,
    ) -> None:
        import ray

        # by name: handles among a restartable actor's constructor arguments would make Ray
        # keep them in the object store (and warn on every run)
        self.actors = [ray.get_actor(name) for name in actors]
        self.batch_size, self.next = batch_size, start
        self.crops = crops  # Edit's pool: send crops, not whole pictures (crop_for_edit)

    def __call__(self, jobs: list[Job]) -> list[Job]:
        if self.crops is None:
            return self._send(jobs)
        cuts = crop_for_edit(jobs, self.crops)
        done = self._send(jobs)
        paste_edit(done, cuts)
        return done

    def _send(self, jobs: list[Job]) -> list[Job]:
        import ray

        refs = []

        def send(chunk: list[Job]) -> list[Job]:  # the chunks of in_chunks, sent at once
            refs.append(self.actors[self.next % len(self.actors)].run.remote(chunk))
            self.next += 1
            return []

        in_chunks(send, jobs, self.batch_size)
        return [job for part in ray.get(refs) for job in part]


class ShardWorker:
    """Makes whole shards: reads a task's input, runs the steps (model steps of pooled stages
    on their actors), writes the tar and the stats file into OUT."""

    def __init__(
        self,
        config: SynthConfig,
        runtime: Runtime,
        out_dir: str,
        stages: Sequence[Stage],
        pools: Sequence[Sequence[str] | None],
        batch_sizes: Sequence[int | None],
        position: int,
    ) -> None:
        import ray

        self.error: str | None = None
        self.node = ray.get_runtime_context().get_node_id()
        if not any(pools):  # one CPU per worker: OpenCV must not spread over the others
            import cv2

            cv2.setNumThreads(1)
        parts: list[tuple[Process, int | None]] = []
        for stage, pool, size in zip(stages, pools, batch_sizes, strict=True):
            if pool and size:  # cut into the model's batches, spread over the pool
                crops = config if "edit" in stage.steps and ships_crops(config) else None
                parts.append((_RemoteStep(pool, size, position, crops), None))
                continue
            chain, self.error = _build(config, runtime, stage)
            if self.error:
                break
            parts.append((chain, size))
        self.maker = ShardMaker(
            config, out_dir, Staged(parts), self.node, _stop_if_cancelled, runtime.batch_size
        )

    def ready(self) -> str | None:
        return self.error

    def run(self, task: ShardTask) -> ShardDone:
        return self.maker(task)


# ------------------------------------------------------------------------------ cluster


def init_ray(work_dir: fs.PathLike, options: RayOptions) -> dict[str, Any]:
    """Start or join Ray once per process; return what the manifest records about it."""
    import ray

    dashboard = None
    if not ray.is_initialized():
        quiet = {} if options.verbose else {"log_to_driver": False, "logging_level": logging.ERROR}
        address = options.address or os.environ.get("RAY_ADDRESS")
        if address:
            ctx = ray.init(address=address, **quiet)
        else:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ctx = ray.init(
                num_cpus=options.num_cpus,
                include_dashboard=options.dashboard and _has_dashboard(),
                dashboard_host="127.0.0.1",
                _temp_dir=str(ray_temp_dir(work_dir)),
                **quiet,
            )
        dashboard = ctx.dashboard_url or None
        if dashboard and "://" not in dashboard:
            dashboard = f"http://{dashboard}"
    context = ray.get_runtime_context()
    resources = ray.cluster_resources()
    return {
        "address": context.gcs_address,
        "dashboard": dashboard,
        "cpus": resources.get("CPU", 0.0),
        "gpus": resources.get("GPU", 0.0),
        "nodes": {n["NodeID"]: n.get("NodeManagerAddress") for n in ray.nodes() if n.get("Alive")},
        "version": ray.__version__,
    }


def ray_temp_dir(work_dir: fs.PathLike) -> Path:
    """``WORK/.ray`` when WORK is a local folder whose path is short enough for Ray's unix
    sockets (which must stay under 107 bytes), else a fresh folder under the system temp dir."""
    if not fs.is_url(work_dir):
        path = Path(fs.as_path(work_dir)).resolve() / ".ray"
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


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the work goes: actors per pooled stage, GPUs per model actor, shard workers."""

    model_actors: tuple[int, ...]
    """Per stage: its actors (0: the workers run it)."""
    gpus: tuple[float, ...]
    workers: int


def layout_actors(stages: Sequence[Stage], options: RayOptions, cpus: float, gpus: float) -> Layout:
    """Share the cluster out, or :class:`SetupError` when a stage cannot be placed; what each
    stage needs is what its steps declare (:class:`~counterfactual.synth.steps.Resources`)."""
    gpu_stages = [s for s in stages if pooled(s, options) and on_gpu(s)]
    actors, per_actor = [], []
    for stage in stages:
        res = stage.resources
        if res is None or not pooled(stage, options):
            actors.append(0)
            per_actor.append(0.0)
            continue
        need = options.gpus_per_actor if on_gpu(stage) else 0.0
        if need and gpus < need:
            raise SetupError(
                f"stage {res.stage} ({stage.steps[0]} on {res.device}) needs {need:g} GPU per "
                f"actor but the cluster has {gpus:g} GPUs; run it with --device cpu, or join a "
                "cluster with GPUs (RAY_ADDRESS)"
            )
        if options.model_actors:
            n = options.model_actors
        elif need:
            n = max(1, int(gpus / len(gpu_stages) // need))
        else:
            n = 1
        if need and n * need > gpus + 1e-9:
            raise SetupError(
                f"stage {res.stage}: {n} actors x {need:g} GPU exceed the cluster's {gpus:g} "
                "GPUs; lower --model-actors or --gpus-per-actor"
            )
        actors.append(n)
        per_actor.append(need)
    held = sum(actors)  # each model actor holds one CPU
    if options.cpu_actors is None and cpus - held < 1:
        raise SetupError(
            f"the cluster's {cpus:g} CPUs leave none for a shard worker after {held} model "
            "actors (one CPU each); lower --model-actors or join a larger cluster"
        )
    workers = options.cpu_actors or max(1, int(cpus - held))
    return Layout(tuple(actors), tuple(per_actor), workers)


def _start(
    config: SynthConfig,
    runtime: Runtime,
    out_dir: str,
    stages: Sequence[Stage],
    layout: Layout,
    options: RayOptions,
) -> tuple[list[Any], list[Any]]:
    """Start the model actors and the workers; wait until each is ready, or raise
    :class:`SetupError` with the first one that failed."""
    import ray

    run = uuid.uuid4().hex[:8]
    pools: list[list[Any] | None] = []
    names: list[list[str] | None] = []
    sizes: list[int | None] = []
    for stage, n, gpus in zip(stages, layout.model_actors, layout.gpus, strict=True):
        res = stage.resources
        sizes.append(None if res is None else options.model_batch_size or res.batch_size)
        if not n or res is None:
            pools.append(None)
            names.append(None)
            continue
        cls = ray.remote(actor_class(res.stage))
        named = [f"cf-{run}-{stage.steps[0]}-{i}" for i in range(n)]
        names.append(named)
        pools.append(
            [
                cls.options(
                    name=name, num_cpus=1, num_gpus=gpus, max_restarts=3, max_task_retries=3
                ).remote(config, runtime, stage)
                for name in named
            ]
        )
    model_actors = [a for pool in pools for a in pool or ()]
    _wait_ready(model_actors)  # the workers look them up by name
    worker = ray.remote(ShardWorker).options(
        num_cpus=1, max_restarts=3, max_task_retries=3, scheduling_strategy="SPREAD"
    )
    workers = [
        worker.remote(config, runtime, out_dir, stages, names, sizes, i)
        for i in range(layout.workers)
    ]
    _wait_ready(workers)
    return model_actors, workers


def _wait_ready(actors: Sequence[Any]) -> None:
    """Wait until every actor has started; :class:`SetupError` with the first one-line error
    an actor reports (a model that does not load)."""
    import ray

    pending = [a.ready.remote() for a in actors]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        error = ray.get(ready[0])
        if error:
            raise SetupError(error)


def _map_unordered(
    workers: Sequence[Any], tasks: Iterator[ShardTask], in_flight: int
) -> Iterator[ShardDone]:
    """Each task on a free worker, at most ``in_flight`` queued per worker; results as they
    come. The driver holds only the tasks in flight."""
    import ray

    slots = deque(w for _ in range(in_flight) for w in workers)
    running: dict[Any, Any] = {}
    exhausted = False
    try:
        while True:
            while slots and not exhausted:
                task = next(tasks, None)
                if task is None:
                    exhausted = True
                    break
                worker = slots.popleft()
                running[worker.run.remote(task)] = worker
            if not running:
                return
            ready, _ = ray.wait(list(running), num_returns=1)
            worker = running.pop(ready[0])
            slots.append(worker)
            yield _get(ready[0])
    except BaseException:  # a signal (Interrupted), or the driver stopped reading (close)
        _cancel(list(running))
        raise


CANCEL_WAIT = 60.0
"""Seconds the driver waits for cancelled shards to be abandoned before it kills the workers."""


def _cancel(refs: Sequence[Any], timeout: float = CANCEL_WAIT) -> None:
    """Cancel shard tasks and wait (at most ``timeout`` s) until each has ended: one not yet
    started never starts; a running one stops after its current batch (:class:`_Cancelled`),
    its worker removing the shard's temporary file or unfinished upload itself. Cancelled
    tasks are not retried."""
    import ray

    for ref in refs:
        ray.cancel(ref)
    if not refs:
        return
    ended, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    for ref in ended:  # fetched, so that Ray does not report them as unhandled errors
        with contextlib.suppress(ray.exceptions.RayError, _Cancelled):
            ray.get(ref)


class _Cancelled(Exception):
    """Raised inside a shard whose task the driver cancelled: the shard is abandoned."""


def _stop_if_cancelled(items: int) -> None:
    """``ShardMaker``'s ``on_batch`` on a worker: end the shard once its task is cancelled."""
    import ray

    if ray.get_runtime_context().is_canceled():
        raise _Cancelled("the run was interrupted")


def _get(ref: Any) -> Any:
    """``ray.get``, raising what a shard worker raised as itself (a disk-full ``OSError``, a
    ``SetupError``) rather than as Ray's multi-line ``RayTaskError``; the remote traceback
    stays on the chain for ``--debug``."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from err
        raise


def run_ray(
    inputs: RunInput | Iterable[ImageRecord],
    out_dir: fs.PathLike,
    config: SynthConfig,
    options: RayOptions | None = None,
    failures: Sequence[Status] = (),
    on_shard: Callable[[ShardDone], None] | None = None,
    progress: Progress | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
    runtime: Runtime | None = None,
) -> RunResult:
    """Make the shards of ``inputs`` in ``out_dir`` on Ray, resuming a run of the same config.

    Same contract and same bytes as :func:`counterfactual.synth.runner.run_local`. ``on_start(info)``
    hears where the run goes (address, dashboard, CPUs, GPUs, nodes) once Ray is up; a run
    whose shards are all committed starts no Ray. ``runtime``: device, dtype and batch sizes,
    as for ``run_local``.
    """
    import ray

    options, runtime = options or RayOptions(), runtime or Runtime()
    preflight(config, runtime)
    stages = plan_stages(config, runtime)
    info: dict[str, Any] = {"skipped": "every shard was committed"}
    out = str(fs.as_path(out_dir)) if fs.is_url(out_dir) else str(Path(out_dir).resolve())

    def execute(tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        first = next(tasks, None)
        if first is None:
            return
        info.clear()
        start = time.perf_counter()
        info.update(init_ray(out_dir, options))
        signals.rearm()  # ray.init replaced the SIGTERM handler with its own
        layout = layout_actors(stages, options, info["cpus"], info["gpus"])
        info["layout"] = asdict(layout)
        info["seconds"] = {"init": round(time.perf_counter() - start, 3)}
        if on_start is not None:
            on_start(info)
        actors: list[Any] = []
        try:
            models, workers = _start(config, runtime, out, stages, layout, options)
            actors = [*models, *workers]
            info["seconds"]["actors_ready"] = round(time.perf_counter() - start, 3)
            yield from _map_unordered(workers, itertools.chain([first], tasks), options.in_flight)
            info["seconds"]["shards_done"] = round(time.perf_counter() - start, 3)
        finally:
            for actor in actors:
                ray.kill(actor)

    def extra() -> dict[str, Any]:
        return {
            "ray": {
                **info,
                "stages": [list(s.steps) for s in stages],
                "options": asdict(options),
            }
        }

    return run_shards(
        RunInput.of(inputs, failures),
        out_dir,
        config,
        execute,
        "ray",
        on_shard,
        progress,
        extra,
        runtime,
    )
