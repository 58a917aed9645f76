"""One run per output folder: ``OUT/run.lock``.

A synth run (local or Ray) holds ``OUT/run.lock`` while it writes shards into OUT. The lock is
a small JSON object::

    {"host": "node-1", "pid": 123, "pid_start": 4567, "runner": "ray",
     "started": "2026-11-23T19:00:00Z", "heartbeat": "2026-11-23T19:05:00Z",
     "token": "3f2a...", "command": "counterfactual synth ..."}

Times are UTC, to the second. ``pid_start`` is the holder's start time in clock ticks since
boot (``/proc/PID/stat``), where the system has one, so that a pid reused by an unrelated
process does not keep a dead run's lock alive.

A lock is *alive* when its holder is on this host and its process runs (``os.kill(pid, 0)``,
not a zombie, same start time), or, for a holder on another host, when its heartbeat is at most
``stale_after`` seconds old. A live lock refuses the run (:class:`LockHeld`); a stale one is
taken over and the old holder reported in :attr:`RunLock.took_over`.

Creation is race-safe on a local (or mounted) filesystem: the lock is written whole under a
temporary name and hard-linked into place (``O_CREAT | O_EXCL`` where hard links are missing),
and only one of two drivers wins. On S3 the lock is written with ``If-None-Match: *``
(s3fs ``"xb"``), a conditional put that AWS S3, MinIO and moto honour: only one driver wins.
On other object stores (and S3-compatible stores that ignore the condition) creation is best
effort: the lock is written when absent and read back, and two drivers starting within the
same second could both win. Taking over a stale lock is exclusive locally (the stale file is
renamed aside first, so one driver gets it); on an object store it is best effort in the same
way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from counterfactual import fs

LOCK_NAME = "run.lock"
FIELDS = ("host", "pid", "runner", "started", "heartbeat", "token")
"""The fields every lock has (``pid_start`` and ``command`` may be missing or null)."""
_ATTEMPTS = 5


class LockHeld(ValueError):
    """OUT is in use by another run (or its lock file cannot be read)."""


class LockLost(RuntimeError):
    """The lock this run held was removed or taken over by another driver: the run stops,
    and the command prints the message as one line (exit 2)."""


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in ticks)`` of a process from ``/proc``; ``None`` without one."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[19])


def pid_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (what :func:`pid_running`
    compares), ``None`` without ``/proc``."""
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def pid_running(pid: int, pid_start: int | None = None) -> bool:
    """Whether process ``pid`` of this host runs: it exists, is not a zombie and, when
    ``pid_start`` is given and ``/proc`` has it, started at that tick."""
    if pid <= 0:
        return False
    if sys.platform == "win32":  # os.kill would end the process there: assume it runs
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state in ("Z", "X"):
        return False
    return pid_start is None or start == pid_start


def describe(holder: dict[str, Any]) -> str:
    """``pid 123 on host h, runner ray, since 2026-11-23T19:00:00Z``."""
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')}, "
        f"runner {holder.get('runner')}, since {holder.get('started')}"
    )


class RunLock:
    """``OUT/run.lock`` held for the length of a ``with`` block (or ``acquire``..``release``).

    ``out``: a local folder or an fsspec URL. ``runner``: ``"local"`` or ``"ray"`` (recorded).
    ``clock``: wall-clock seconds since the epoch (the heartbeat is compared across hosts).
    ``stale_after``: seconds without a heartbeat after which another host's lock is stale
    (default: ``COUNTERFACTUAL_LOCK_STALE_AFTER``, else 600); the holder's
    :meth:`start_heartbeat` thread rewrites the heartbeat every quarter of it, however long a
    shard takes (:meth:`heartbeat_if_due` does it from the caller's own loop instead).
    """

    def __init__(
        self,
        out: fs.PathLike,
        *,
        runner: str,
        clock: Callable[[], float] = time.time,
        stale_after: float | None = None,
    ) -> None:
        if not runner:
            raise ValueError("runner must name the runner, e.g. 'local' or 'ray'")
        if stale_after is None:
            stale_after = _stale_after_from_env()
        if not stale_after > 0:
            raise ValueError(f"stale_after must be > 0 seconds, got {stale_after}")
        self.out = fs.as_path(out)
        self.path = fs.join(self.out, LOCK_NAME)
        self.runner = runner
        self.stale_after = float(stale_after)
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.took_over: dict[str, Any] | None = None
        """The stale lock this run replaced, as read; ``None`` when there was none."""
        self.message: str | None = None
        """A sentence for the log when a stale lock was taken over."""
        self.held = False
        self._clock = clock
        self._record: dict[str, Any] = {}
        self._last_beat = 0.0
        self._writing = threading.Lock()  # the heartbeat thread and release take turns
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: LockLost | None = None
        """Set by the heartbeat thread when the lock was taken or removed (:meth:`check`)."""

    # -- reading and writing the file ------------------------------------------------------

    def read(self) -> dict[str, Any] | None:
        """The lock as it is now; ``None`` when there is none; :class:`LockHeld` when the file
        is not a lock."""
        try:
            text = fs.read_text(self.path)
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except ValueError:
            holder = None
        if not isinstance(holder, dict) or any(k not in holder for k in FIELDS):
            raise LockHeld(
                f"{self.path} exists but is not a run lock ({text[:80]!r}); if no synth is "
                "writing to this folder, delete it"
            )
        return holder

    def _create(self, data: bytes) -> None:
        """Write the lock only if there is none (``FileExistsError`` otherwise)."""
        p = fs.as_path(self.path)
        if isinstance(p, Path):
            _create_local(p, data)
            return
        fsys, inside = fs.filesystem(p)
        protocols = fsys.protocol if isinstance(fsys.protocol, tuple) else (fsys.protocol,)
        if "s3" in protocols:
            try:
                with fsys.open(inside, "xb") as fh:  # If-None-Match: *
                    fh.write(data)
            except OSError as err:
                if isinstance(err, FileExistsError) or err.errno != errno.ENOSYS:
                    raise
                # a store that does not implement conditional writes: best effort below
            else:
                return
        if fsys.exists(inside):
            raise FileExistsError(str(p))
        fs.write_bytes(p, data)
        # best effort: if another driver wrote in the same moment, the last write won
        with contextlib.suppress(FileNotFoundError):
            if json.loads(fs.read_text(p)).get("token") != self.token:
                raise FileExistsError(str(p))

    def _remove_if(self, token: str) -> bool:
        """Remove the lock if it still carries ``token``."""
        p = fs.as_path(self.path)
        if isinstance(p, Path):
            aside = fs.temp_name(p)
            try:
                os.rename(p, aside)  # exclusive: of several drivers, one moves it
            except FileNotFoundError:
                return False
            assert isinstance(aside, Path)
            data = aside.read_bytes()
            try:
                moved = json.loads(data).get("token")
            except ValueError:
                moved = None
            if moved != token:  # another driver's fresh lock: put it back
                with contextlib.suppress(FileExistsError):
                    _create_local(p, data)
                aside.unlink(missing_ok=True)
                return False
            aside.unlink(missing_ok=True)
            return True
        try:
            current = self.read()
        except LockHeld:
            return False
        if current is None or current.get("token") != token:
            return False
        fs.remove(p)
        return True

    # -- the lock's life -------------------------------------------------------------------

    def alive(self, holder: dict[str, Any]) -> bool:
        """Whether ``holder`` (a lock as read) still runs; see the module docstring."""
        if holder.get("host") == self.host:
            try:
                pid = int(holder["pid"])
            except (TypeError, ValueError):
                return False
            start = holder.get("pid_start")
            return pid_running(pid, int(start) if isinstance(start, int) else None)
        try:
            beat = _seconds(str(holder["heartbeat"]))
        except ValueError:
            return False
        return self._clock() - beat <= self.stale_after

    def _refusal(self, holder: dict[str, Any]) -> LockHeld:
        text = (
            f"{self.out} is in use by a running synth ({describe(holder)}); "
            "wait for it to end, or use another --out"
        )
        if holder.get("host") != self.host:
            text += (
                f" (a run on another host that stopped is taken over once its heartbeat, "
                f"now {holder.get('heartbeat')}, is {self.stale_after:g} s old)"
            )
        return LockHeld(text)

    def acquire(self) -> dict[str, Any] | None:
        """Take the lock; :class:`LockHeld` when a live run holds it. Returns the stale lock
        taken over (also :attr:`took_over`), or ``None``."""
        if self.held:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        fs.makedirs(self.out)
        now = self._clock()
        stat = _proc_stat(self.pid)
        self._record = {
            "host": self.host,
            "pid": self.pid,
            "pid_start": stat[1] if stat else None,
            "runner": self.runner,
            "started": _iso(now),
            "heartbeat": _iso(now),
            "token": self.token,
            "command": shlex.join(sys.argv),
        }
        data = json.dumps(self._record, indent=1).encode()
        for _ in range(_ATTEMPTS):
            try:
                self._create(data)
            except FileExistsError:
                holder = self.read()
                if holder is None:
                    continue  # released meanwhile
                if holder.get("token") == self.token:
                    # our own write: a conditional put whose answer was lost landed, and its
                    # retry was refused (a slow or flaky store)
                    self.held = True
                    self._last_beat = now
                    return self.took_over
                if self.alive(holder):
                    raise self._refusal(holder) from None
                if self._remove_if(str(holder["token"])):
                    self.took_over = holder
                    self.message = (
                        f"{self.path}: took over the lock of a synth that is no longer "
                        f"running ({describe(holder)}, last heartbeat {holder.get('heartbeat')})"
                    )
                continue
            self.held = True
            self._last_beat = now
            return self.took_over
        holder = self.read()
        raise (
            self._refusal(holder)
            if holder
            else LockHeld(f"{self.path}: could not take the lock; other drivers keep taking it")
        )

    def heartbeat(self) -> None:
        """Rewrite the heartbeat; :class:`LockLost` when the lock is no longer ours."""
        with self._writing:
            self._heartbeat()

    def _heartbeat(self) -> None:
        if not self.held:
            raise RuntimeError(f"{self.path} is not held by this RunLock")
        try:
            current = self.read()
        except LockHeld as err:
            raise LockLost(f"{self.path} was replaced: {err}; this run stopped") from err
        if current is None or current.get("token") != self.token:
            self.held = False
            who = f"now held by {describe(current)}" if current else "removed"
            raise LockLost(
                f"{self.path} was {who} while this run wrote to {self.out}: this run stopped "
                "(its shards so far are kept; rerun the same command to resume once no other "
                "run writes there)"
            )
        now = self._clock()
        self._record["heartbeat"] = _iso(now)
        fs.write_text(self.path, json.dumps(self._record, indent=1))
        self._last_beat = now

    def heartbeat_if_due(self) -> bool:
        """:meth:`heartbeat` when a quarter of ``stale_after`` passed since the last one;
        cheap to call after every result. Returns whether it wrote."""
        if self._clock() - self._last_beat < self.stale_after / 4:
            return False
        self.heartbeat()
        return True

    def start_heartbeat(
        self, interval: float | None = None, on_lost: Callable[[LockLost], None] | None = None
    ) -> None:
        """Rewrite the heartbeat every ``interval`` seconds (default: a quarter of
        ``stale_after``) from a daemon thread until :meth:`release`, independent of what the
        run is doing: a shard that takes an hour keeps its run alive to other hosts. A write
        that fails (the store is briefly down) is tried again at the next beat; a lock taken
        or removed by another driver stops the thread, is raised by :meth:`check` and is told
        to ``on_lost`` (from the thread) at once."""
        if not self.held:
            raise RuntimeError(f"{self.path} is not held by this RunLock")
        if self._thread is not None:
            return
        period = self.stale_after / 4 if interval is None else float(interval)
        if not period > 0:
            raise ValueError(f"heartbeat interval must be > 0 seconds, got {interval}")
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(period):
                try:
                    with self._writing:
                        if self._stop.is_set() or not self.held:
                            return
                        self._heartbeat()
                except LockLost as err:
                    self.lost = err
                    if on_lost is not None:
                        on_lost(err)
                    return
                except fs.store_failures():
                    continue  # the next beat tries again; stale_after is four beats away

        self._thread = threading.Thread(target=beat, name=f"heartbeat {self.path}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """:class:`LockLost` when the heartbeat thread found the lock taken or removed."""
        if self.lost is not None:
            raise self.lost

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.stale_after)

    def release(self) -> bool:
        """Stop the heartbeat and remove the lock if it is still ours (a lock another driver
        took is kept). Returns whether it removed it."""
        self._stop_heartbeat()
        with self._writing:
            if not self.held:
                return False
            self.held = False
            return self._remove_if(self.token)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.release()
            return
        try:
            self.release()
        except fs.store_failures():
            # the store that failed the run refuses the release too: the run's own error
            # says what happened, and the rerun takes over the lock this process left
            pass


STALE_AFTER_ENV = "COUNTERFACTUAL_LOCK_STALE_AFTER"


def _stale_after_from_env() -> float:
    """``COUNTERFACTUAL_LOCK_STALE_AFTER`` seconds, else 600 (``ValueError`` naming a bad
    value)."""
    text = os.environ.get(STALE_AFTER_ENV)
    if not text:
        return 600.0
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{STALE_AFTER_ENV}={text!r} is not a number of seconds") from None


def _create_local(path: Path, data: bytes) -> None:
    """Create ``path`` holding ``data`` only if it does not exist (``FileExistsError``); the
    file appears whole."""
    tmp = fs.temp_name(path)
    assert isinstance(tmp, Path)
    try:
        try:
            tmp.write_bytes(data)
        except OSError as err:
            raise (fs.disk_full(err, path) or err) from err
        try:
            os.link(tmp, path)
            return
        except FileExistsError:
            raise
        except OSError:
            pass  # a filesystem without hard links
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    finally:
        tmp.unlink(missing_ok=True)
