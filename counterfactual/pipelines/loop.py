"""The driver's side of a run on Ray: starting the actors and waiting (bounded) until they are
ready (:func:`start_actors`), the loop that hands shard tasks to the workers and hears back
each shard's counts (:func:`map_unordered`: a lost worker's shards go to the others and a
replacement is started), cancelling and killing at the end."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from counterfactual.messages import one_line
from counterfactual.pipelines.actors import ShardCancelled, ShardWorker, actor_class, board_actor
from counterfactual.pipelines.metrics import run_metrics, run_of
from counterfactual.pipelines.options import RayOptions
from counterfactual.synth.layout import MODEL_CPUS, Cluster, Layout
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.staging import (
    SetupError,
    Stage,
)
from counterfactual.synth.tasks import ShardDone, ShardTask


@dataclass(frozen=True)
class StartedActor:
    """A started actor as the driver waits for it: its handle, name and what it asked for."""

    handle: Any
    name: str
    what: str


@dataclass(frozen=True)
class WorkerSpec:
    """What every shard worker of a run is started with: a replacement is started the same
    way (:meth:`start`), by the next position."""

    config: SynthConfig
    runtime: Runtime
    out_dir: str
    stages: tuple[Stage, ...]
    pools: tuple[list[str] | None, ...]
    """Per stage, the names of its model actors (``None``: the worker runs it itself)."""
    batch_sizes: tuple[int | None, ...]
    board: str
    call_timeout: float
    count: int
    """The workers of the layout."""

    def start(self, position: int) -> StartedActor:
        """Start shard worker ``position`` (from 0; a replacement's is ``count`` or more)."""
        import ray

        name = f"{self.board.removesuffix('-board')}-worker-{position}"
        handle = (
            ray.remote(ShardWorker)
            .options(name=name, num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD")
            .remote(
                self.config,
                self.runtime,
                self.out_dir,
                self.stages,
                self.pools,
                self.batch_sizes,
                position,
                self.board,
                self.call_timeout,
            )
        )
        if position < self.count:
            what = f"shard worker {position + 1} of {self.count} (1 CPU)"
        else:
            what = f"replacement shard worker {position + 1 - self.count} (1 CPU)"
        return StartedActor(handle, name, what)


def start_actors(
    config: SynthConfig,
    runtime: Runtime,
    out_dir: str,
    stages: Sequence[Stage],
    layout: Layout,
    options: RayOptions,
    board: str,
) -> tuple[list[Any], list[Any], WorkerSpec]:
    """Start the model actors and the workers; wait (bounded) until each is ready, or kill
    them and raise :class:`SetupError` with the first one that failed or timed out. Returns
    the model actors' and the workers' handles, and how to start a replacement worker."""
    import ray

    run = board.removesuffix("-board")
    started: list[StartedActor] = []
    names: list[list[str] | None] = []
    sizes: list[int | None] = []
    try:
        for stage, n, gpus in zip(stages, layout.model_actors, layout.gpus, strict=True):
            res = stage.resources
            sizes.append(None if res is None else options.model_batch_size or res.batch_size)
            if not n or res is None:
                names.append(None)
                continue
            cls = ray.remote(actor_class(res.stage))
            named = [f"{run}-{stage.steps[0]}-{i}" for i in range(n)]
            names.append(named)
            for i, name in enumerate(named):
                handle = cls.options(
                    name=name,
                    num_cpus=MODEL_CPUS,
                    num_gpus=gpus,
                    max_restarts=3,
                    max_task_retries=3,
                ).remote(config, runtime, stage, board, options.failure_window)
                what = f"stage {res.stage} actor {i + 1} of {n} ({gpus:g} GPU, {MODEL_CPUS:g} CPU)"
                started.append(StartedActor(handle, name, what))
        models = list(started)
        wait_ready(models, board, options, layout.cluster)  # the workers look them up by name
        spec = WorkerSpec(
            config,
            runtime,
            out_dir,
            tuple(stages),
            tuple(names),
            tuple(sizes),
            board,
            options.call_timeout,
            layout.workers,
        )
        workers = [spec.start(i) for i in range(layout.workers)]
        started += workers
        wait_ready(workers, board, options, layout.cluster)
    except BaseException:
        kill_actors([actor.handle for actor in started])
        raise
    return [a.handle for a in models], [a.handle for a in workers], spec


KILL_WAIT = 10.0
"""Seconds the driver waits for killed actors to be reported dead."""


def kill_actors(actors: Sequence[Any], timeout: float = KILL_WAIT) -> None:
    """Kill actors and wait (at most ``timeout`` s) until Ray reports each one dead: a shard
    worker whose task ended on the driver's side may still be running it (a cancelled task
    that had already started), and the driver removes the run's temporary files only once no
    worker can write one."""
    import ray

    for actor in actors:
        ray.kill(actor)
    alive = list(actors)
    deadline = time.monotonic() + timeout
    while alive and time.monotonic() < deadline:
        probes = {actor.__ray_ready__.remote(): actor for actor in alive}
        ended, _ = ray.wait(list(probes), num_returns=len(probes), timeout=POLL_SECONDS)
        alive = [probes[ref] for ref in probes if ref not in ended]
        for ref in ended:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                continue  # dead
            alive.append(probes[ref])  # answered before the kill reached it: ask again
        if alive:
            time.sleep(0.05)


def wait_ready(
    actors: Sequence[StartedActor], board: str, options: RayOptions, cluster: Cluster
) -> None:
    """Wait until every actor is ready: at most ``place_timeout`` seconds until the cluster
    has placed them all (each tells the board when its process starts), then at most
    ``load_timeout`` seconds for their models; :class:`SetupError` (one line) with the first
    error an actor reports (a model that does not load), or the first actor that timed out."""
    import ray

    pending = {a.handle.ready.remote(): a for a in actors}
    begin = time.monotonic()
    placed_at: float | None = None
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
        for ref in ready:
            actor = pending.pop(ref)
            try:
                error = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                raise SetupError(f"{actor.what} died while starting: {one_line(err)}") from err
            if error:
                raise SetupError(error)
        if not pending:
            return
        now = time.monotonic()
        if placed_at is None:
            started = set(ray.get(board_actor(board).started.remote()))
            waiting = [a for a in pending.values() if a.name not in started]
            if not waiting:
                placed_at = now
            elif now - begin > options.place_timeout:
                free = ray.available_resources()
                raise SetupError(
                    f"{waiting[0].what} was not placed within {options.place_timeout:g} s "
                    f"(--place-timeout): the cluster has {cluster.describe()}, "
                    f"{free.get('GPU', 0.0):g} GPUs and {free.get('CPU', 0.0):g} CPUs free now "
                    "(another job holds the rest?); free them, or lower --model-actors, "
                    "--gpus-per-actor or --cpu-actors"
                )
        elif now - placed_at > options.load_timeout:
            actor = next(iter(pending.values()))
            raise SetupError(
                f"{actor.what} did not load its model within {options.load_timeout:g} s "
                "(--load-timeout); raise it, or see the node's logs (--verbose)"
            )


POLL_SECONDS = 0.5
"""How often the driver looks at the board while it waits (progress, placement)."""


TASK_TRIES = 3
"""How often a shard is tried on a worker that is lost while it makes it."""


class Replacements:
    """Lost shard workers' replacements: at most ``limit`` started in a run (each by
    :meth:`WorkerSpec.start`, at the next position); each joins the pool when it is ready.
    ``handles`` collects every one started, for the runner to kill at the end."""

    def __init__(self, spec: WorkerSpec, limit: int, place_timeout: float) -> None:
        self.spec, self.limit, self.place_timeout = spec, limit, place_timeout
        self.handles: list[Any] = []
        self.pending: dict[Any, tuple[StartedActor, float]] = {}  # ready() ref -> actor, since

    def start(self, lost: int) -> None:
        """Start one more replacement; :class:`SetupError` (one line) past the limit."""
        if len(self.handles) >= self.limit:
            raise SetupError(
                f"{lost} shard workers were lost, more than the {self.limit} replacements a run "
                "starts (their processes or nodes keep dying: see the nodes' logs, --verbose); "
                "rerun the same command to resume"
            )
        actor = self.spec.start(self.spec.count + len(self.handles))
        self.handles.append(actor.handle)
        self.pending[actor.handle.ready.remote()] = (actor, time.monotonic())

    def joined(self, ref: Any) -> Any | None:
        """The handle of the replacement whose ``ready`` answered at ``ref`` (``None``: it died
        while starting); :class:`SetupError` with the error it reports (a model that does not
        load)."""
        import ray

        actor, _ = self.pending.pop(ref)
        try:
            error = ray.get(ref)
        except ray.exceptions.RayActorError:
            return None
        if error:
            raise SetupError(error)
        return actor.handle

    def overdue(self) -> bool:
        """Whether every pending replacement has waited longer than ``place_timeout``."""
        now = time.monotonic()
        return all(now - since > self.place_timeout for _, since in self.pending.values())


def map_unordered(
    workers: Sequence[Any],
    tasks: Iterator[ShardTask],
    in_flight: int,
    board: str | None = None,
    on_items: Callable[[int, int], None] | None = None,
    spare: Replacements | None = None,
) -> Iterator[ShardDone]:
    """Each task on a free worker, at most ``in_flight`` queued per worker; results as they
    come. The driver holds only the tasks in flight. ``on_items(shard, items)`` hears the
    items finished so far of each shard in the making, from the board. A worker that is lost
    (its process or node died: ``RayActorError`` from its own task, not a model actor's loss,
    which its task reports as :class:`ModelStageLost`) leaves the pool, its shards go to the
    others, at most :data:`TASK_TRIES` times each, and (with ``spare``) a replacement is
    started that joins the pool when it is ready. With no worker left and no replacement ready
    within ``place_timeout``, :class:`SetupError` (one line)."""
    import ray

    slots = deque(w for _ in range(in_flight) for w in workers)
    running: dict[Any, tuple[Any, ShardTask]] = {}
    again: deque[ShardTask] = deque()
    tries: dict[int, int] = {}
    lost: set[int] = set()
    alive = len(workers)
    handle = board_actor(board) if on_items is not None else None
    metrics = run_metrics(run_of(board))
    pending = spare.pending if spare is not None else {}
    exhausted = False
    try:
        while True:
            while slots and (again or not exhausted):
                task = again.popleft() if again else next(tasks, None)
                if task is None:
                    exhausted = True
                    break
                worker = slots.popleft()
                running[worker.run.remote(task)] = (worker, task)
            if not running:
                if not again:
                    return
                if not pending or (spare is not None and spare.overdue()):
                    raise SetupError(_all_lost(len(workers), again[0].index, spare))
            metrics.queue_depth("shards", len(running))
            ready, _ = ray.wait([*running, *pending], num_returns=1, timeout=POLL_SECONDS)
            if handle is not None and on_items is not None:
                try:
                    reported = ray.get(handle.take.remote())
                except ray.exceptions.RayActorError:  # progress by shard only from now on
                    handle, reported = None, {}
                for shard, items in reported.items():
                    on_items(shard, items)
            if not ready:
                continue
            if ready[0] in pending and spare is not None:
                joined = spare.joined(ready[0])
                if joined is None:  # died while starting: another one, within the limit
                    spare.start(len(lost) + 1)
                    continue
                alive += 1
                slots.extend([joined] * in_flight)
                print(
                    f"a replacement shard worker is ready ({alive} of {len(workers)} workers)",
                    file=sys.stderr,
                )
                continue
            worker, task = running.pop(ready[0])
            try:
                done = get_result(ready[0])
            except ray.exceptions.RayActorError:
                tries[task.index] = tries.get(task.index, 0) + 1
                if tries[task.index] >= TASK_TRIES:
                    raise
                if id(worker) not in lost:
                    lost.add(id(worker))
                    alive -= 1
                    replaced = "; a replacement is started" if spare is not None else ""
                    print(
                        f"a shard worker was lost ({len(lost)} so far); its shards go to the "
                        f"others{replaced}",
                        file=sys.stderr,
                    )
                    if spare is not None:
                        spare.start(len(lost))
                slots = deque(w for w in slots if w is not worker)
                again.append(task)
                continue
            slots.append(worker)
            yield done
    except BaseException:  # a signal (Interrupted), or the driver stopped reading (close)
        cancel_tasks(list(running))
        raise


def _all_lost(workers: int, shard: int, spare: Replacements | None) -> str:
    waited = (
        f" and no replacement was ready within {spare.place_timeout:g} s (--place-timeout)"
        if spare is not None
        else ""
    )
    return (
        f"all {workers} shard workers were lost (their nodes or processes died){waited}; "
        f"shard {shard} and the rest were not made; rerun the same command to resume"
    )


CANCEL_WAIT = 60.0
"""Seconds the driver waits for cancelled shards to be abandoned before it kills the workers."""


def cancel_tasks(refs: Sequence[Any], timeout: float = CANCEL_WAIT) -> None:
    """Cancel shard tasks and wait (at most ``timeout`` s) until each has ended: one not yet
    started never starts; a running one stops after its current batch (:class:`ShardCancelled`),
    its worker removing the shard's temporary file or unfinished upload itself. Cancelled
    tasks are not retried."""
    import ray

    for ref in refs:
        ray.cancel(ref)
    if not refs:
        return
    ended, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    for ref in ended:  # fetched, so that Ray does not report them as unhandled errors
        with contextlib.suppress(ray.exceptions.RayError, ShardCancelled):
            ray.get(ref)


def get_result(ref: Any) -> Any:
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
