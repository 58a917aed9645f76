"""The synthesis run on Ray: shard workers that write their own shards, model actors they call.

The driver (:func:`counterfactual.synth.run.run_shards`, with :class:`RayRunner`) streams shard
tasks to a pool of :class:`~counterfactual.pipelines.actors.ShardWorker` actors, at most ``in_flight`` queued per worker, and hears back only each
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

How many actors of each stage, with what share of a GPU, is
:func:`counterfactual.synth.layout.plan_layout`'s answer for the cluster's nodes (the inpainter
one per GPU, the light stages beside it); :func:`dry_run` prints it without starting anything.
Before any shard starts, impossible setups fail in seconds with one line: a layout the cluster
cannot hold, an actor whose model does not load; and nothing waits without a bound: an actor
not placed within ``place_timeout`` or not loaded within ``load_timeout`` ends the run with one
line. The actors tell a :class:`RunBoard` when they start and how many items each shard has
finished, so progress moves as items finish. A shard worker that is lost (its process or node
died) leaves the pool, its shards go to the others and a replacement is started (at most as
many as the layout's workers in a run, then one line). ``ray.init()`` starts a local Ray, or
joins the cluster named by ``RAY_ADDRESS`` (or ``--ray-address``); under ``ray job submit`` it
joins the job's cluster.

The runner is in three parts: the session (:mod:`counterfactual.pipelines.session`: Ray
started or joined, its folder, the cluster's shape), the actors
(:mod:`counterfactual.pipelines.actors`) and the driver's loop
(:mod:`counterfactual.pipelines.loop`); this module puts them behind the
:class:`~counterfactual.synth.run.Runner` protocol.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from counterfactual import fs
from counterfactual.pipelines.actors import RunBoard
from counterfactual.pipelines.loop import Replacements, kill_actors, map_unordered, start_actors
from counterfactual.pipelines.options import RayOptions
from counterfactual.pipelines.session import (
    check_model_paths,
    cluster_shape,
    init_ray,
    layout_actors,
    owns_ray,
    ray_temp_dir,
    stop_ray,
    work_ray_dir,
)
from counterfactual.progress import Progress
from counterfactual.readers.spec import RunInput
from counterfactual.records import ImageRecord, Status
from counterfactual.synth import signals
from counterfactual.synth.layout import Layout
from counterfactual.synth.models import absolute_models, local_model_paths
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.run import RunConfig, RunResult, check_entry, run_shards
from counterfactual.synth.staging import plan_stages
from counterfactual.synth.tasks import ShardDone, ShardTask


class RayRunner:
    """The :class:`~counterfactual.synth.run.Runner` on Ray. :meth:`start` starts or joins Ray
    (a local one in a fresh :func:`ray_temp_dir`), lays the actors out on the cluster, checks
    that every node that loads a local model file sees it, and starts the run's board, model
    actors and shard workers (waiting, bounded, until each is ready); :meth:`run` hands the
    tasks to the workers (:func:`~counterfactual.pipelines.loop.map_unordered`, lost workers
    replaced); :meth:`stop` kills every actor. :meth:`close` stops the local Ray it started
    (``run_ray`` calls it last, or a ``with`` block on exit; a run whose shards were all
    committed starts none)."""

    name = "ray"

    def __init__(
        self,
        config: SynthConfig,
        out_dir: fs.PathLike,
        options: RayOptions,
        runtime: Runtime,
        progress: Progress | None = None,
        on_start: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.config, self.options, self.runtime = config, options, runtime
        self.out = str(fs.as_path(out_dir)) if fs.is_url(out_dir) else str(Path(out_dir).resolve())
        self.progress, self.on_start = progress, on_start
        self.stages = plan_stages(config, runtime)
        self.info: dict[str, Any] = {"skipped": "every shard was committed"}
        self.owned: list[Path] = []  # the folder of the local Ray this run starts and removes
        self.actors: list[Any] = []
        self.workers: list[Any] = []
        self.spare: Replacements | None = None
        self.board = ""
        self.begin = 0.0

    def start(self, shards: int | None = None) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options, info = self.options, self.info
        info.clear()
        self.begin = time.perf_counter()
        if owns_ray(options):
            self.owned.append(ray_temp_dir())
        info.update(init_ray(None, options, self.owned[0] if self.owned else None))
        if self.owned and options.keep_ray_logs:
            info["logs"] = str(self.owned[0] / "session_latest" / "logs")
        signals.rearm()  # ray.init replaced the SIGTERM handler with its own
        layout = layout_actors(self.stages, options, cluster_shape()).for_shards(shards)
        gpu_only = any(g > 0 for g in layout.gpus)
        paths = local_model_paths(self.config, self.runtime)
        check_model_paths(paths, gpu_only, options.place_timeout)
        info["layout"] = asdict(layout)
        info["seconds"] = {"init": self._seconds()}
        if self.on_start is not None:
            self.on_start(info)
        self.board = f"cf-{uuid.uuid4().hex[:8]}-board"
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.actors.append(  # on the driver's node: it lives as long as the driver
            ray.remote(RunBoard)
            .options(name=self.board, num_cpus=0, scheduling_strategy=here)
            .remote()
        )
        placed = absolute_models(self.config)  # every node loads what the driver checked
        models, self.workers, spec = start_actors(
            placed, self.runtime, self.out, self.stages, layout, options, self.board
        )
        self.actors += [*models, *self.workers]
        self.spare = Replacements(spec, layout.workers, options.place_timeout)
        info["seconds"]["actors_ready"] = self._seconds()

    def run(self, tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        on_items = None if self.progress is None else self.progress.shard_items
        yield from map_unordered(
            self.workers, tasks, self.options.in_flight, self.board, on_items, self.spare
        )
        self.info["seconds"]["shards_done"] = self._seconds()

    def stop(self) -> None:
        replacements = self.spare.handles if self.spare is not None else []
        kill_actors([*self.actors, *replacements])
        self.actors, self.workers = [], []

    def record(self) -> dict[str, Any]:
        return {
            "ray": {
                **self.info,
                "stages": [list(s.steps) for s in self.stages],
                "options": asdict(self.options),
            }
        }

    def close(self) -> None:
        """Stop the local Ray :meth:`start` started and remove its folder (with
        ``keep_ray_logs``, keep it and say where its logs are)."""
        if self.owned:
            logs = stop_ray(self.owned.pop(), self.options.keep_ray_logs)
            if logs is not None:
                print(f"Ray's logs: {logs}", file=sys.stderr)

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _seconds(self) -> float:
        return round(time.perf_counter() - self.begin, 3)


def dry_run(
    config: SynthConfig,
    options: RayOptions | None = None,
    runtime: Runtime | None = None,
    work_dir: fs.PathLike | None = None,
) -> Layout:
    """The layout a run would use: joins or starts Ray as :func:`run_ray` does (``work_dir``:
    where a local Ray keeps its files, ``WORK/.ray``, default a fresh :func:`ray_temp_dir`;
    a local Ray it starts is stopped and its folder removed before it returns), starts no
    actor and loads no model; :class:`SetupError` (one line) when the cluster cannot hold it,
    or a node that loads a local model lacks it. The models missing here are not its
    business (:func:`~counterfactual.synth.models.missing_models` names them all): only
    those present here are looked for on the nodes."""
    options, runtime = options or RayOptions(), runtime or Runtime()
    stages = plan_stages(config, runtime)
    own = owns_ray(options)
    temp = (work_ray_dir(work_dir) or ray_temp_dir()) if own else None
    try:
        init_ray(None, options, temp)
        layout = layout_actors(stages, options, cluster_shape())
        here = {o: p for o, p in local_model_paths(config, runtime).items() if os.path.exists(p)}
        check_model_paths(here, any(g > 0 for g in layout.gpus), options.place_timeout)
        return layout
    finally:
        if temp is not None:
            stop_ray(temp)


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
    as for ``run_local``. The entry checks (:func:`~counterfactual.synth.run.check_entry`:
    local model paths, OUT) run first; each model actor checks its device on its node.
    """
    options, runtime = options or RayOptions(), runtime or Runtime()
    check_entry(out_dir, config, runtime)
    run = RunConfig(RunInput.of(inputs, failures), out_dir, config, runtime, on_shard, progress)
    with RayRunner(config, out_dir, options, runtime, progress, on_start) as runner:
        return run_shards(run, runner)
