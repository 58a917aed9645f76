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

How many actors of each stage, with what share of a GPU, is
:func:`counterfactual.synth.layout.plan_layout`'s answer for the cluster's nodes (the inpainter
one per GPU, the light stages beside it); :func:`dry_run` prints it without starting anything.
Before any shard starts, impossible setups fail in seconds with one line: a layout the cluster
cannot hold, an actor whose model does not load; and nothing waits without a bound: an actor
not placed within ``place_timeout`` or not loaded within ``load_timeout`` ends the run with one
line. The actors tell a :class:`RunBoard` when they start and how many items each shard has
finished, so progress moves as items finish. A shard worker that is lost (its process or node
died) leaves the pool and its shards go to the others. ``ray.init()`` starts a local Ray, or
joins the cluster named by ``RAY_ADDRESS`` (or ``--ray-address``); under ``ray job submit`` it
joins the job's cluster.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from counterfactual import fs
from counterfactual.messages import cut, one_line
from counterfactual.options import declare
from counterfactual.pipelines.metrics import run_metrics, run_of, timed
from counterfactual.progress import Progress
from counterfactual.readers.spec import RunInput
from counterfactual.records import ImageRecord, Status
from counterfactual.synth import signals
from counterfactual.synth.job import Job
from counterfactual.synth.layout import MODEL_CPUS, Cluster, Layout, Node, plan_layout
from counterfactual.synth.models import absolute_models, local_model_paths
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.run import RunResult, preflight, run_shards, started
from counterfactual.synth.runlock import pid_running, pid_start
from counterfactual.synth.staging import (
    Chain,
    Process,
    SetupError,
    Stage,
    Staged,
    in_chunks,
    plan_stages,
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


@dataclass(frozen=True, slots=True)
class RayOptions:
    """How the work is spread over the cluster; none of it changes the output.

    ``cpu_actors``: shard workers (default: the cluster's CPUs left after the model actors).
    ``model_actors``: actors per model stage, ``gpus_per_actor``: GPUs per actor of the heavy
    stage (default: :func:`~counterfactual.synth.layout.plan_layout`'s rules; on CPU no model
    actors, the workers run the models themselves, unless ``model_actors`` is set).
    ``model_batch_size``: items per model call (default: the step's own batch size).
    ``in_flight``: tasks queued per worker. ``address``: a cluster to join (default:
    ``RAY_ADDRESS``, else local). ``num_cpus`` and ``dashboard`` apply to a local Ray only.
    ``place_timeout``: seconds an actor may wait for the cluster to place it;
    ``load_timeout``: seconds it may take to load its model; past either the run ends with
    one line. ``verbose``: Ray's own logs and worker output on the driver's terminal.
    ``keep_ray_logs``: keep the folder a local Ray wrote its session logs in (outside OUT, in
    the system temp dir: :func:`ray_temp_dir`) instead of removing it at the end of the run.
    """

    cpu_actors: int | None = declare(
        None,
        help="shard workers (default: the cluster's CPUs left after the model actors)",
        kind="positive_int",
    )
    model_actors: int | None = declare(
        None,
        help="actors per model stage (default: the inpainter one per GPU, a light stage one "
        "per 4 GPUs; on CPU none, the shard workers run the models themselves)",
        kind="positive_int",
    )
    gpus_per_actor: float | None = declare(
        None,
        help="GPUs per actor of the heavy stage (the inpainter), in (0, 8]; a fraction shares "
        "one GPU (default: one actor per GPU, leaving 0.1 GPU per light stage: detector, "
        "captioner, verifier)",
        kind="gpu_share",
    )
    model_batch_size: int | None = declare(
        None,
        help="items per model call (default: each model step's own batch size)",
        kind="positive_int",
    )
    address: str | None = declare(
        None, help="cluster to join (default: RAY_ADDRESS)", flags=("--ray-address",)
    )
    num_cpus: int | None = declare(
        None, help="CPUs of a local Ray (default: all of this machine's)", kind="positive_int"
    )
    dashboard: bool = declare(
        True,
        help="do not start the Ray dashboard (local Ray)",
        kind="no-flag",
        flags=("--no-dashboard",),
        dest="dashboard",
    )
    in_flight: int = declare(
        2, help="shard tasks queued per worker (default %(default)s)", kind="positive_int"
    )
    place_timeout: float = declare(
        120.0,
        help="seconds an actor may wait for the cluster to place it before the run ends with "
        "one line (default: %(default)g)",
        kind="positive_float",
    )
    load_timeout: float = declare(
        1800.0,
        help="seconds a placed actor may take to load its model (default: %(default)g)",
        kind="positive_float",
    )
    call_timeout: float = declare(
        300.0,
        help="seconds a shard worker waits for one model batch before it sends the batch to "
        "another actor of the stage (the bound is the larger of this and 20 times the slowest "
        "batch the worker has seen; default: %(default)g)",
        kind="positive_float",
    )
    failure_window: int = declare(
        200,
        help="a model stage's last items looked at: more than half of them failed with "
        "model-error ends the run with one line (default: %(default)s)",
        kind="positive_int",
    )
    verbose: bool = declare(
        False,
        help="Ray's own logs and the workers' output on this terminal",
        kind="flag",
        flags=("-v", "--verbose"),
    )
    keep_ray_logs: bool = declare(
        False,
        help="keep the folder a local Ray writes its session logs in (in the system temp dir, "
        "outside OUT; its path is printed at the end and kept in manifest.json) instead of "
        "removing it when the run ends",
        kind="flag",
    )

    def __post_init__(self) -> None:
        names = ("cpu_actors", "model_actors", "model_batch_size", "num_cpus", "in_flight")
        for name in (*names, "failure_window"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.gpus_per_actor is not None and not 0 < self.gpus_per_actor <= 8:
            raise ValueError(f"gpus_per_actor must be in (0, 8], got {self.gpus_per_actor}")
        for name in ("place_timeout", "load_timeout", "call_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")


# ------------------------------------------------------------------------------ actors


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
        _tell_started(board)
        one_thread()
        self.board = board
        self.chain, self.error = _build(config, runtime, stage)
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
                ray.get(_board(self.board).failed.remote(f"{where}: {err}"), timeout=5)
        os._exit(1)  # the CUDA context is unusable: Ray restarts the process (max_restarts)


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


def _board(name: str | None) -> Any:
    import ray

    return ray.get_actor(name) if name else None


def _tell_started(board: str | None) -> None:
    import ray

    if board:
        _board(board).start.remote(ray.get_runtime_context().get_actor_name())


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

        _tell_started(board)
        one_thread()
        self.run_tag = run_of(board)
        self.board = _board(board)
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
            chain, self.error = _build(config, runtime, stage)
            if self.error:
                break
            parts.append((timed(chain, name, self.run_tag, model=size is not None), size))
        self.maker = ShardMaker(
            config, out_dir, Staged(parts), self.node, _stop_if_cancelled, runtime.batch_size
        )

    def ready(self) -> str | None:
        return self.error

    def threads(self) -> dict[str, int]:
        return thread_counts()

    def run(self, task: ShardTask) -> ShardDone:
        finished = 0

        def on_batch(items: int) -> None:
            nonlocal finished
            _stop_if_cancelled(items)  # the driver cancelled the task: abandon the shard
            finished += items
            if self.board is not None:  # fire and forget: a count, not a result
                self.board.done.remote(task.index, finished)

        self.maker.on_batch = on_batch
        _stop_if_cancelled(0)  # cancelled while queued: no temporary file is opened
        done = self.maker(task)
        run_metrics(self.run_tag).shard_done(done.counts)
        return done


# ------------------------------------------------------------------------------ cluster


def init_ray(
    work_dir: fs.PathLike | None, options: RayOptions, temp_dir: Path | None = None
) -> dict[str, Any]:
    """Start or join Ray once per process; return what the manifest records about it.
    A local Ray keeps its session files, logs and sockets in ``temp_dir``, else in
    ``WORK/.ray`` when that path is short enough for Ray's sockets, else in a fresh
    :func:`ray_temp_dir`."""
    import ray

    dashboard = None
    plain_ray_lines()
    if not ray.is_initialized():
        quiet = {} if options.verbose else {"log_to_driver": False, "logging_level": logging.ERROR}
        address = options.address or os.environ.get("RAY_ADDRESS")
        try:
            if address:
                ctx = ray.init(address=address, **quiet)
            else:
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                ctx = ray.init(
                    num_cpus=options.num_cpus,
                    include_dashboard=options.dashboard and _has_dashboard(),
                    dashboard_host="127.0.0.1",
                    _temp_dir=str(temp_dir or _work_ray_dir(work_dir) or ray_temp_dir()),
                    **quiet,
                )
        except Exception as err:  # noqa: BLE001  (ray.init raises bare Exception: a node timeout)
            ray.shutdown()  # whatever part of a local Ray came up
            raise ray_start_failure(err, address, options) from err
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


def ray_start_failure(err: BaseException, address: str | None, options: RayOptions) -> SetupError:
    """Why Ray did not start, and what to try, as one line: joining ``address`` (from
    ``--ray-address`` or ``RAY_ADDRESS``), or starting a local Ray."""
    cause = f"{type(err).__name__}: {one_line(err, 240)}"
    if address:
        named = "--ray-address" if options.address else "RAY_ADDRESS"
        return SetupError(
            f"Ray did not start: cannot join the cluster at {address!r} ({named}): {cause}; "
            f"check that it runs (ray status) and its address, or unset {named} to start a "
            "local Ray"
        )
    return SetupError(
        f"Ray did not start: a local Ray could not come up: {cause}; check free memory, "
        "/dev/shm and the process limits (ulimit -v, a container's memory), or run in one "
        "process (--runner local) or join a running cluster (--ray-address)"
    )


def plain_ray_lines() -> bool:
    """Ray's own lines on the driver (``(raylet) A worker died ...``) without colour codes
    unless stdout and stderr are terminals (Ray prints them to either): sets
    ``RAY_COLOR_PREFIX=0``, which Ray's printer reads each line, unless the user set it.
    Returns whether the lines are plain."""
    if "RAY_COLOR_PREFIX" not in os.environ and not (_tty(sys.stdout) and _tty(sys.stderr)):
        os.environ["RAY_COLOR_PREFIX"] = "0"
    return os.environ.get("RAY_COLOR_PREFIX") == "0"


def _tty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


RAY_DIR_LIMIT = 40
"""The longest folder a local Ray may keep its files in: its unix sockets
(``session_<time>_<pid>/sockets/plasma_store``, ...) must stay under 107 bytes."""


RAY_DIR_OWNER = "cf-owner.json"
"""The file in a :func:`ray_temp_dir` naming the process that made it (host, pid, its start):
a later run removes the folder once that process is gone (:func:`remove_stale_ray_dirs`)."""


def ray_temp_dir() -> Path:
    """A fresh folder ``cf-ray-*`` for a local Ray's session files, logs and sockets, outside
    OUT: in the system temp dir (``TMPDIR``), or in ``/tmp`` when that path is too long for
    Ray's sockets (:data:`RAY_DIR_LIMIT`). :func:`stop_ray` removes it; a killed run's is
    removed by the next run that makes one (:func:`remove_stale_ray_dirs`)."""
    base = tempfile.gettempdir()
    if len(base) + len("/cf-ray-12345678") > RAY_DIR_LIMIT and os.access("/tmp", os.W_OK):
        base = "/tmp"
    remove_stale_ray_dirs(Path(base))
    folder = Path(tempfile.mkdtemp(prefix="cf-ray-", dir=base))
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": pid_start(os.getpid())}
    fs.write_text(folder / RAY_DIR_OWNER, json.dumps(owner))
    return folder


def remove_stale_ray_dirs(base: Path) -> list[Path]:
    """Remove the ``cf-ray-*`` folders in ``base`` that this user's runs left when they were
    killed: those whose :data:`RAY_DIR_OWNER` names a process of this host that is gone. A
    folder without one (being made, or made by an earlier version) or of a live process
    is left. Returns the folders removed."""
    removed = []
    for folder in sorted(base.glob("cf-ray-*")):
        if folder.is_symlink() or not folder.is_dir() or not _owned_by_me(folder):
            continue
        owner = _ray_dir_owner(folder / RAY_DIR_OWNER)
        if owner is None or owner["host"] != socket.gethostname():
            continue
        if pid_running(owner["pid"], owner["pid_start"]):
            continue
        shutil.rmtree(folder, ignore_errors=True)  # links inside are removed, not followed
        removed.append(folder)
    return removed


def _owned_by_me(folder: Path) -> bool:
    try:
        return folder.lstat().st_uid == os.getuid()
    except (OSError, AttributeError):  # gone, or no uids (Windows)
        return False


def _ray_dir_owner(path: Path) -> dict[str, Any] | None:
    """A :data:`RAY_DIR_OWNER` file's host, pid and start, ``None`` when it is missing or not
    one."""
    if path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    start = data.get("pid_start")
    return {
        "host": data.get("host"),
        "pid": data["pid"],
        "pid_start": start if isinstance(start, int) else None,
    }


def _work_ray_dir(work_dir: fs.PathLike | None) -> Path | None:
    """``WORK/.ray`` when WORK is a local folder whose path is short enough for Ray's sockets."""
    if work_dir is None or fs.is_url(work_dir):
        return None
    path = Path(fs.as_path(work_dir)).resolve() / ".ray"
    if len(str(path)) > RAY_DIR_LIMIT:
        return None
    path.mkdir(parents=True, exist_ok=True)
    return path


def stop_ray(temp_dir: Path, keep_logs: bool = False) -> str | None:
    """Shut down the local Ray this process started in ``temp_dir`` (:func:`ray_temp_dir`) and
    remove the folder, or, with ``keep_logs``, keep it and return where its logs are."""
    import ray

    ray.shutdown()
    if keep_logs:
        return str(temp_dir / "session_latest" / "logs")
    for _ in range(3):  # a worker still exiting may write one more log line
        shutil.rmtree(temp_dir, ignore_errors=True)
        if not temp_dir.exists():
            break
        time.sleep(0.2)
    return None


def _has_dashboard() -> bool:
    try:
        import aiohttp  # noqa: F401  (ray[default] installs it with the dashboard)
    except ImportError:
        return False
    return True


def cluster_shape() -> Cluster:
    """The alive nodes of the Ray this process is connected to, with their CPUs and GPUs."""
    import ray

    nodes = []
    for node in ray.nodes():
        if node.get("Alive"):
            res = node.get("Resources") or {}
            nodes.append(Node(float(res.get("CPU", 0.0)), float(res.get("GPU", 0.0))))
    return Cluster(tuple(nodes))


def _missing_here(paths: dict[str, str]) -> tuple[str, dict[str, str]]:
    """On one node: its address and which of ``paths`` (option -> path) it does not see."""
    import ray

    address = ray.util.get_node_ip_address()
    return address, {option: p for option, p in paths.items() if not os.path.exists(p)}


def check_model_paths(paths: dict[str, str], gpu_only: bool, timeout: float) -> list[str]:
    """Every local model path (option -> absolute path) looked at on every alive node that may
    load it (with ``gpu_only`` the nodes with GPUs), by a task pinned to each node; the
    addresses of the nodes looked at, or :class:`SetupError` (one line) naming a path a node
    lacks, or a node that did not answer within ``timeout`` seconds."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not paths:
        return []
    nodes = [
        n
        for n in ray.nodes()
        if n.get("Alive") and (not gpu_only or (n.get("Resources") or {}).get("GPU", 0) > 0)
    ]
    look = ray.remote(num_cpus=0)(_missing_here)
    refs = [
        look.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(paths)
        for n in nodes
    ]
    done, late = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if late:
        raise SetupError(
            f"{len(late)} of {len(refs)} nodes did not say within {timeout:g} s "
            "(--place-timeout) whether they see the models; is the cluster busy?"
        )
    answers = ray.get(done)
    lacking = [(address, missing) for address, missing in answers if missing]
    if lacking:
        address, missing = lacking[0]
        option, path = next(iter(missing.items()))
        raise SetupError(
            f"{option} {path}: not on node {address} ({len(lacking)} of {len(answers)} nodes "
            "lack it); put the models on storage every node mounts at the same path (`make "
            "models TO=/shared/models`) and pass that path"
        )
    return [address for address, _ in answers]


def layout_actors(stages: Sequence[Stage], options: RayOptions, cluster: Cluster) -> Layout:
    """The run's layout (:func:`~counterfactual.synth.layout.plan_layout`) under ``options``;
    :class:`SetupError` (one line) when the cluster cannot hold it."""
    return plan_layout(
        stages,
        cluster,
        model_actors=options.model_actors,
        gpus_per_actor=options.gpus_per_actor,
        cpu_actors=options.cpu_actors,
        model_batch_size=options.model_batch_size,
    )


@dataclass(frozen=True)
class _Actor:
    """A started actor as the driver waits for it: its handle, name and what it asked for."""

    handle: Any
    name: str
    what: str


def _start(
    config: SynthConfig,
    runtime: Runtime,
    out_dir: str,
    stages: Sequence[Stage],
    layout: Layout,
    options: RayOptions,
    board: str,
) -> tuple[list[Any], list[Any]]:
    """Start the model actors and the workers; wait (bounded) until each is ready, or kill
    them and raise :class:`SetupError` with the first one that failed or timed out."""
    import ray

    run = board.removesuffix("-board")
    started: list[_Actor] = []
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
                started.append(_Actor(handle, name, what))
        models = list(started)
        _wait_ready(models, board, options, layout.cluster)  # the workers look them up by name
        # a lost worker is not restarted: its shards go to the others (_map_unordered)
        worker = ray.remote(ShardWorker)
        workers = []
        for i in range(layout.workers):
            name = f"{run}-worker-{i}"
            handle = worker.options(
                name=name, num_cpus=1, max_restarts=0, scheduling_strategy="SPREAD"
            ).remote(config, runtime, out_dir, stages, names, sizes, i, board, options.call_timeout)
            workers.append(
                _Actor(handle, name, f"shard worker {i + 1} of {layout.workers} (1 CPU)")
            )
            started.append(workers[-1])
        _wait_ready(workers, board, options, layout.cluster)
    except BaseException:
        _kill([actor.handle for actor in started])
        raise
    return [a.handle for a in models], [a.handle for a in workers]


KILL_WAIT = 10.0
"""Seconds the driver waits for killed actors to be reported dead."""


def _kill(actors: Sequence[Any], timeout: float = KILL_WAIT) -> None:
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
        ended, _ = ray.wait(list(probes), num_returns=len(probes), timeout=_POLL_SECONDS)
        alive = [probes[ref] for ref in probes if ref not in ended]
        for ref in ended:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                continue  # dead
            alive.append(probes[ref])  # answered before the kill reached it: ask again
        if alive:
            time.sleep(0.05)


def _wait_ready(
    actors: Sequence[_Actor], board: str, options: RayOptions, cluster: Cluster
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
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=_POLL_SECONDS)
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
            started = set(ray.get(_board(board).started.remote()))
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


_POLL_SECONDS = 0.5
"""How often the driver looks at the board while it waits (progress, placement)."""
_TASK_TRIES = 3
"""How often a shard is tried on a worker that is lost while it makes it."""


def _map_unordered(
    workers: Sequence[Any],
    tasks: Iterator[ShardTask],
    in_flight: int,
    board: str | None = None,
    on_items: Callable[[int, int], None] | None = None,
) -> Iterator[ShardDone]:
    """Each task on a free worker, at most ``in_flight`` queued per worker; results as they
    come. The driver holds only the tasks in flight. ``on_items(shard, items)`` hears the
    items finished so far of each shard in the making, from the board. A worker that is lost
    (its process or node died) leaves the pool and its shards go to the others, at most
    ``_TASK_TRIES`` times each: a lost worker costs the shards it was making, no more."""
    import ray

    slots = deque(w for _ in range(in_flight) for w in workers)
    running: dict[Any, tuple[Any, ShardTask]] = {}
    again: deque[ShardTask] = deque()
    tries: dict[int, int] = {}
    lost: set[int] = set()
    handle = _board(board) if on_items is not None else None
    metrics = run_metrics(run_of(board))
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
                if again:
                    raise SetupError(
                        f"all {len(workers)} shard workers were lost (their nodes or processes "
                        f"died); shard {again[0].index} and the rest were not made; rerun the same "
                        "command to resume"
                    )
                return
            metrics.queue_depth("shards", len(running))
            ready, _ = ray.wait(list(running), num_returns=1, timeout=_POLL_SECONDS)
            if handle is not None and on_items is not None:
                try:
                    reported = ray.get(handle.take.remote())
                except ray.exceptions.RayActorError:  # progress by shard only from now on
                    handle, reported = None, {}
                for shard, items in reported.items():
                    on_items(shard, items)
            if not ready:
                continue
            worker, task = running.pop(ready[0])
            try:
                done = _get(ready[0])
            except ray.exceptions.RayActorError:
                tries[task.index] = tries.get(task.index, 0) + 1
                if tries[task.index] >= _TASK_TRIES:
                    raise
                if id(worker) not in lost:
                    lost.add(id(worker))
                    print(
                        f"a shard worker was lost ({len(lost)} so far); its shards go to the others",
                        file=sys.stderr,
                    )
                slots = deque(w for w in slots if w is not worker)
                again.append(task)
                continue
            slots.append(worker)
            yield done
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


def dry_run(
    config: SynthConfig,
    options: RayOptions | None = None,
    runtime: Runtime | None = None,
    work_dir: fs.PathLike | None = None,
    check_paths: bool = True,
) -> Layout:
    """The layout a run would use: joins or starts Ray as :func:`run_ray` does (``work_dir``:
    where a local Ray keeps its files, ``WORK/.ray``, default a fresh :func:`ray_temp_dir`;
    a local Ray it starts is stopped and its folder removed before it returns), starts no
    actor and loads no model; :class:`SetupError` (one line) when the cluster cannot hold it,
    or (``check_paths``) a local model path is missing here or on a node that loads it."""
    options, runtime = options or RayOptions(), runtime or Runtime()
    if check_paths:
        preflight(config, runtime)
    stages = plan_stages(config, runtime)
    own = owns_ray(options)
    temp = (_work_ray_dir(work_dir) or ray_temp_dir()) if own else None
    try:
        init_ray(None, options, temp)
        layout = layout_actors(stages, options, cluster_shape())
        if check_paths:
            gpu_only = any(g > 0 for g in layout.gpus)
            check_model_paths(local_model_paths(config, runtime), gpu_only, options.place_timeout)
        return layout
    finally:
        if temp is not None:
            stop_ray(temp)


def owns_ray(options: RayOptions) -> bool:
    """Whether a run starts its own local Ray (none running in this process, no cluster
    named), which it stops and whose folder it removes at its end."""
    import ray

    return not ray.is_initialized() and not (options.address or os.environ.get("RAY_ADDRESS"))


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
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    options, runtime = options or RayOptions(), runtime or Runtime()
    preflight(config, runtime)
    stages = plan_stages(config, runtime)
    info: dict[str, Any] = {"skipped": "every shard was committed"}
    owned: list[Path] = []  # the folder of the local Ray this run starts, stops and removes
    out = str(fs.as_path(out_dir)) if fs.is_url(out_dir) else str(Path(out_dir).resolve())

    def execute(tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        first = next(tasks, None)
        if first is None:
            return
        info.clear()
        start = time.perf_counter()
        if owns_ray(options):
            owned.append(ray_temp_dir())
        info.update(init_ray(None, options, owned[0] if owned else None))
        if owned and options.keep_ray_logs:
            info["logs"] = str(owned[0] / "session_latest" / "logs")
        signals.rearm()  # ray.init replaced the SIGTERM handler with its own
        layout = layout_actors(stages, options, cluster_shape())
        gpu_only = any(g > 0 for g in layout.gpus)
        check_model_paths(local_model_paths(config, runtime), gpu_only, options.place_timeout)
        info["layout"] = asdict(layout)
        info["seconds"] = {"init": round(time.perf_counter() - start, 3)}
        if on_start is not None:
            on_start(info)
        actors: list[Any] = []
        board = f"cf-{uuid.uuid4().hex[:8]}-board"
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        actors.append(  # on the driver's node: it lives as long as the driver
            ray.remote(RunBoard).options(name=board, num_cpus=0, scheduling_strategy=here).remote()
        )
        on_items = None if progress is None else progress.shard_items
        try:
            placed = absolute_models(config)  # every node loads what the driver checked
            models, workers = _start(placed, runtime, out, stages, layout, options, board)
            actors += [*models, *workers]
            info["seconds"]["actors_ready"] = round(time.perf_counter() - start, 3)
            started(tasks)  # run.json now: a run that failed to start leaves none
            work = itertools.chain([first], tasks)
            yield from _map_unordered(workers, work, options.in_flight, board, on_items)
            info["seconds"]["shards_done"] = round(time.perf_counter() - start, 3)
        finally:
            _kill(actors)

    def extra() -> dict[str, Any]:
        return {
            "ray": {
                **info,
                "stages": [list(s.steps) for s in stages],
                "options": asdict(options),
            }
        }

    try:
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
    finally:
        if owned:
            logs = stop_ray(owned[0], options.keep_ray_logs)
            if logs is not None:
                print(f"Ray's logs: {logs}", file=sys.stderr)
