"""The run's actors: model stages (one actor class per declared stage, ``Inpaint``, ``Caption``,
``Detect``, ``Verify``: :func:`actor_class`), the shard workers that make whole shards
(:class:`ShardWorker`, calling the model stages through :class:`_RemoteStep`, which bounds every
call), and :class:`RunBoard`, which the actors tell when they start and how far each shard is."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from counterfactual.messages import cut, one_line
from counterfactual.pipelines.metrics import run_metrics, run_of, timed
from counterfactual.synth.job import Job
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.staging import (
    Chain,
    Process,
    SetupError,
    Stage,
    Staged,
    in_chunks,
    start_steps,
)
from counterfactual.synth.steps import (
    DeviceFailure,
    FailureWindow,
    StageFailing,
    Verify,
    crop_for_edit,
    paste_edit,
    prepare_for_verify,
    restore_after_verify,
    ships_crops,
)
from counterfactual.synth.tasks import ShardDone, ShardMaker, ShardTask


class _ModelStep:
    """A model step's actor: loads its model once, runs one batch per call. A model that does
    not load is reported by :meth:`ready` (one line), not as a crash of the actor. It tells
    the run's board (:class:`RunBoard`, by name) that it has started before it loads.

    A broken device (:class:`DeviceFailure`: illegal address, Xid, ...) ends the actor's process
    after it has told the board which GPU: Ray restarts it (``max_restarts``) and retries the
    batch; one that stays broken dies for good and the workers go on with the stage's other
    actors. More than half of the last ``failure_window`` items failing with ``model-error``
    raises :class:`StageFailing` (the run ends with its line)."""

    def __init__(
        self,
        config: SynthConfig,
        runtime: Runtime,
        stage: Stage,
        board: str | None = None,
        failure_window: int = 200,
    ) -> None:
        tell_started(board)
        one_thread()
        self.board = board
        self.chain, self.error = build_chain(config, runtime, stage)
        name = stage.resources.stage if stage.resources else stage.steps[0]
        self.window = FailureWindow(name, failure_window)
        self.run_tag = run_of(board)
        self.stage = name

    def ready(self) -> str | None:
        return self.error

    def threads(self) -> dict[str, int]:
        return thread_counts()

    def pixel_prep(self) -> Any:
        """The verifier's CPU preprocessing (``None``: none, or no ``Verify`` here), so the
        shard workers prepare its crops (:func:`prepare_for_verify`)."""
        for step in self.chain.steps:
            if isinstance(step, Verify) and step.verifier is not None:
                return step.verifier.pixel_prep()
        return None

    def run(self, jobs: list[Job]) -> list[Job]:
        ran = [job for job in jobs if job.ok]
        start = time.perf_counter()
        try:
            done = self.chain(jobs)
        except DeviceFailure as err:
            self._end(err)
        run_metrics(self.run_tag).model_batch(self.stage, time.perf_counter() - start, len(jobs))
        self.window.add(ran)
        return done

    def _end(self, err: DeviceFailure) -> None:
        import ray

        context = ray.get_runtime_context()
        where = f"{context.get_actor_name()} on node {context.get_node_id()[:12]}"
        print(f"{where}: {err}; ending this actor", file=sys.stderr, flush=True)
        if self.board:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(board_actor(self.board).failed.remote(f"{where}: {err}"), timeout=5)
        os._exit(1)  # the CUDA context is unusable: Ray restarts the process (max_restarts)


@functools.cache
def actor_class(stage: str) -> type[_ModelStep]:
    """The actor class of a model stage, named as the step declares it (``Inpaint``,
    ``Caption``, ``Detect``, ``Verify``), so the dashboard names each pool."""
    return type(stage, (_ModelStep,), {"__doc__": f"The {stage} model, one per actor."})


def build_chain(config: SynthConfig, runtime: Runtime, stage: Stage) -> tuple[Chain, str | None]:
    """The stage's steps as a chain, or the one-line error of the first that cannot start
    (reported by ``ready``, so the driver ends the run with it instead of a crashed actor)."""
    try:
        return Chain(start_steps(config, stage.steps, runtime=runtime), stage.given), None
    except SetupError as err:
        return Chain([], ()), str(err)


class ModelStageLost(SetupError):
    """Every actor of a model stage is dead or did not answer a batch within its bound: the
    run ends with this line (a shard worker's own loss is Ray's ``RayActorError``)."""


CALL_MARGIN = 20.0
"""A model batch may take this many times the slowest one a worker has seen before it is
given up (if that is longer than ``call_timeout``)."""


class _RemoteStep:
    """A pooled model step as seen from a worker: a batch cut into the model's batch size,
    spread over the pool's actors, results back in order. Each batch has a bound (the larger
    of ``call_timeout`` and :data:`CALL_MARGIN` times the slowest batch so far); a batch whose
    actor died or did not answer within it goes to another actor of the pool, and that actor is
    not used again by this worker; with none left, :class:`ModelStageLost`."""

    def __init__(
        self,
        actors: Sequence[str],
        batch_size: int,
        start: int,
        crops: SynthConfig | None = None,
        call_timeout: float = 300.0,
        board: Any = None,
        stage: str = "",
        run: str = "local",
        verify: SynthConfig | None = None,
    ) -> None:
        import ray

        # by name: handles among a restartable actor's constructor arguments would make Ray
        # keep them in the object store (and warn on every run)
        self.names = list(actors)
        self.actors = [ray.get_actor(name) for name in actors]
        self.alive = list(range(len(self.actors)))
        self.batch_size, self.next = batch_size, start
        self.crops = crops  # Edit's pool: send crops, not whole pictures (crop_for_edit)
        self.call_timeout, self.slowest, self.board = call_timeout, 0.0, board
        self.lost: list[str] = []
        self.stage, self.run = stage, run
        self.verify = verify  # Verify's pool: preprocess its crops here (prepare_for_verify)
        self.prep: Any = None

    def __call__(self, jobs: list[Job]) -> list[Job]:
        if self.verify is not None:
            return self._verify(jobs, self.verify)
        if self.crops is None:
            return self._send(jobs)
        cuts = crop_for_edit(jobs, self.crops)
        done = self._send(jobs)
        paste_edit(done, cuts)
        return done

    def _verify(self, jobs: list[Job], config: SynthConfig) -> list[Job]:
        if self.prep is None and self.alive:  # the actors' processor: no model files here
            import ray

            actor = self.actors[self.alive[0]]
            try:
                self.prep = ray.get(actor.pixel_prep.remote(), timeout=self.call_timeout) or False
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                self.prep = None  # this batch goes whole (_send handles the lost actor)
        if not self.prep:
            return self._send(jobs)
        held = prepare_for_verify(jobs, config, self.prep)
        done = self._send(jobs)
        restore_after_verify(done, held, config.pairs)
        return done

    def _send(self, jobs: list[Job]) -> list[Job]:
        chunks: list[list[Job]] = []
        in_chunks(lambda chunk: chunks.append(chunk) or [], jobs, self.batch_size)
        results: list[list[Job] | None] = [None] * len(chunks)
        todo = list(range(len(chunks)))
        metrics = run_metrics(self.run)
        try:
            while todo:
                metrics.queue_depth(self.stage, len(todo))
                todo = self._round(chunks, todo, results)
        finally:
            metrics.queue_depth(self.stage, 0)
        return [job for part in results if part is not None for job in part]

    def _round(
        self, chunks: list[list[Job]], todo: list[int], results: list[list[Job] | None]
    ) -> list[int]:
        """Send the chunks ``todo`` at once; keep what comes back within the bound; the
        chunks of dead or silent actors are returned to be sent again."""
        import ray

        if not self.alive:
            raise ModelStageLost(self._lost_line())
        sent: dict[Any, tuple[int, int]] = {}
        for i in todo:
            actor = self.alive[self.next % len(self.alive)]
            self.next += 1
            sent[self.actors[actor].run.remote(chunks[i])] = (i, actor)
        rounds = -(-len(todo) // len(self.alive))
        bound = max(self.call_timeout, CALL_MARGIN * self.slowest) * rounds
        begin = time.monotonic()
        ready, late = ray.wait(list(sent), num_returns=len(sent), timeout=bound)
        again = []
        for ref in ready:
            i, actor = sent[ref]
            try:
                results[i] = ray.get(ref)
            except ray.exceptions.RayActorError as err:
                self._drop(actor, one_line(f"died: {err}", 160))
                again.append(i)
            except ray.exceptions.RayTaskError as err:
                cause = getattr(err, "cause", None)
                if isinstance(cause, (StageFailing, SetupError)):
                    raise cause from err
                raise
        if ready:
            self.slowest = max(self.slowest, (time.monotonic() - begin) / rounds)
        for ref in late:
            i, actor = sent[ref]
            ray.cancel(ref, force=False)
            self._drop(actor, f"did not answer within {bound:g} s (--call-timeout)")
            again.append(i)
        return sorted(again)

    def _drop(self, actor: int, why: str) -> None:
        if actor in self.alive:
            self.alive.remove(actor)
            self.lost.append(f"{self.names[actor]} {why}")
            print(f"model actor {self.lost[-1]}; its batches go to the others", file=sys.stderr)

    def _lost_line(self) -> str:
        import ray

        failures: list[str] = []
        if self.board is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                failures = ray.get(self.board.failures.remote(), timeout=5)
        device = f"; last device failure: {cut(failures[-1], 160)}" if failures else ""
        return one_line(
            f"all {len(self.actors)} actors of a model stage are lost ({cut(self.lost[-1], 120)})"
            f"{device}; check the GPUs and nodes named, then rerun the same command to resume"
        )


class RunBoard:
    """What the actors tell the driver besides their results (one per run, named, no CPU):
    which actors have started (their process is placed; a model actor then loads its model),
    and per shard in the making the items finished so far, so progress moves at GPU speed."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.items: dict[int, int] = {}
        self.device_failures: list[str] = []

    def start(self, name: str) -> None:
        self.names.add(name)

    def failed(self, line: str) -> None:
        """A model actor's broken device (``ACTOR on node N: GPU ...: error``)."""
        self.device_failures.append(line)

    def failures(self) -> list[str]:
        return list(self.device_failures)

    def done(self, shard: int, items: int) -> None:
        self.items[shard] = items

    def started(self) -> list[str]:
        return sorted(self.names)

    def take(self) -> dict[int, int]:
        """The items finished per shard reported since the last call."""
        items, self.items = self.items, {}
        return items


def one_thread() -> None:
    """One OpenCV and one torch thread in this actor (it holds one CPU; with or without GPU
    pools, a worker must not spread over the node's other CPUs). torch, when not imported yet,
    reads ``OMP_NUM_THREADS`` at import."""
    import cv2

    cv2.setNumThreads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def thread_counts() -> dict[str, int]:
    """OpenCV's and torch's threads in this process (torch imported to ask)."""
    import cv2
    import torch

    return {"opencv": cv2.getNumThreads(), "torch": torch.get_num_threads()}


def board_actor(name: str | None) -> Any:
    import ray

    return ray.get_actor(name) if name else None


def tell_started(board: str | None) -> None:
    import ray

    if board:
        board_actor(board).start.remote(ray.get_runtime_context().get_actor_name())


class ShardWorker:
    """Makes whole shards: reads a task's input, runs the steps (model steps of pooled stages
    on their actors), writes the tar and the stats file into OUT; tells the board the items
    it has finished after every batch."""

    def __init__(
        self,
        config: SynthConfig,
        runtime: Runtime,
        out_dir: str,
        stages: Sequence[Stage],
        pools: Sequence[Sequence[str] | None],
        batch_sizes: Sequence[int | None],
        position: int,
        board: str | None = None,
        call_timeout: float = 300.0,
    ) -> None:
        import ray

        tell_started(board)
        one_thread()
        self.run_tag = run_of(board)
        self.board = board_actor(board)
        self.error: str | None = None
        self.node = ray.get_runtime_context().get_node_id()
        parts: list[tuple[Process, int | None]] = []
        for stage, pool, size in zip(stages, pools, batch_sizes, strict=True):
            name = stage.resources.stage if stage.resources else stage.steps[0]
            if pool and size:  # cut into the model's batches, spread over the pool
                crops = config if "edit" in stage.steps and ships_crops(config) else None
                verify = config if tuple(stage.steps) == ("verify",) else None
                remote = _RemoteStep(
                    pool,
                    size,
                    position,
                    crops,
                    call_timeout,
                    self.board,
                    name,
                    self.run_tag,
                    verify,
                )
                parts.append((remote, None))
                continue
            chain, self.error = build_chain(config, runtime, stage)
            if self.error:
                break
            parts.append((timed(chain, name, self.run_tag, model=size is not None), size))
        self.maker = ShardMaker(
            config, out_dir, Staged(parts), self.node, stop_if_cancelled, runtime.batch_size
        )

    def ready(self) -> str | None:
        return self.error

    def threads(self) -> dict[str, int]:
        return thread_counts()

    def run(self, task: ShardTask) -> ShardDone:
        finished = 0

        def on_batch(items: int) -> None:
            nonlocal finished
            stop_if_cancelled(items)  # the driver cancelled the task: abandon the shard
            finished += items
            if self.board is not None:  # fire and forget: a count, not a result
                self.board.done.remote(task.index, finished)

        self.maker.on_batch = on_batch
        stop_if_cancelled(0)  # cancelled while queued: no temporary file is opened
        done = self.maker(task)
        run_metrics(self.run_tag).shard_done(done.counts)
        return done


class ShardCancelled(Exception):
    """Raised inside a shard whose task the driver cancelled: the shard is abandoned."""


def stop_if_cancelled(items: int) -> None:
    """``ShardMaker``'s ``on_batch`` on a worker: end the shard once its task is cancelled."""
    import ray

    if ray.get_runtime_context().is_canceled():
        raise ShardCancelled("the run was interrupted")
