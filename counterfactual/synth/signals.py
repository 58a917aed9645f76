"""A run that ends gracefully on SIGINT, SIGTERM and SIGHUP.

Ctrl-C sends SIGINT; Kubernetes, Slurm and spot preemption send SIGTERM; a closed terminal or
ssh session sends SIGHUP. While :func:`watch` is active (the driver's loop,
:func:`counterfactual.synth.run.run_shards`), the first of them raises :class:`Interrupted` in
the main thread: the run abandons its in-flight shards (their temporary files and uploads are
removed), records itself in ``manifest.json`` as interrupted and releases OUT's lock; the
command prints one line and exits with ``128 + signal number`` (130, 143, 129), as a shell
reports a process that a signal ended. A second signal while that cleanup runs ends the process
at once (``os._exit``), with the same line and code.

:class:`Interrupted` is a :class:`KeyboardInterrupt`, so code that already stops on Ctrl-C
(a notebook, a ``try``/``except KeyboardInterrupt``) stops on the others too. Handlers are
installed in the main thread only; elsewhere :func:`watch` does nothing.
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals that end a run gracefully (SIGHUP where the platform has it)."""


class Interrupted(KeyboardInterrupt):
    """A run stopped by a signal: :attr:`name` (``SIGTERM``), :attr:`exit_code` (128 + its
    number) and :attr:`message`, the one line the command prints."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(self.message)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    @property
    def message(self) -> str:
        return f"interrupted by {self.name}; rerun the same command to resume"


class Stopped(KeyboardInterrupt):
    """A run stopped from inside, by a thread that found it must not go on (its lock lost:
    :func:`stop_main`): :attr:`message`, the one line the command prints, and
    :attr:`exit_code`. A :class:`KeyboardInterrupt`, as :class:`Interrupted` is, so that no
    ``except Exception`` of the code it lands in takes it for a sample's failure."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        self.message = message
        self.exit_code = exit_code
        super().__init__(message)


class _Watch:
    """The handlers' state: the first signal raises, any later one exits at once."""

    def __init__(self) -> None:
        self.depth = 0
        self.first: int | None = None
        self.saved: dict[int, Any] = {}
        self.pending: Stopped | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.first is not None:  # cleanup is under way: the user wants out now
            stop = Interrupted(signum)
            os.write(sys.stderr.fileno(), f"{stop.message}\n".encode())
            os._exit(stop.exit_code)
        self.first = signum
        pending, self.pending = self.pending, None
        if pending is not None and signum == signal.SIGINT:  # stop_main's, not the user's
            raise pending
        raise Interrupted(signum)

    def install(self) -> None:
        for sig in SIGNALS:
            current = signal.getsignal(sig)
            if current != self.handle:
                self.saved.setdefault(sig, current)
                signal.signal(sig, self.handle)

    def restore(self) -> None:
        for sig, previous in self.saved.items():
            # None: a handler set outside Python (Ray's C++ one), which cannot be put back
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self.saved.clear()
        self.first = None


_WATCH = _Watch()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def watch() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` inside the block (see the module
    doc); the previous handlers are back after it. Nested blocks share one set of handlers."""
    if not _main_thread():
        yield
        return
    if _WATCH.depth == 0:
        _WATCH.install()
    _WATCH.depth += 1
    try:
        yield
    finally:
        _WATCH.depth -= 1
        if _WATCH.depth == 0:
            _WATCH.restore()


def stop_main(message: str, exit_code: int = 2) -> None:
    """From another thread: raise :class:`Stopped` in the main thread at once, the way a
    signal's handler raises :class:`Interrupted` (its wait or sleep is cut short), while
    :func:`watch` is active; nothing otherwise (the run is over)."""
    if _WATCH.depth == 0 or _WATCH.first is not None:
        return
    _WATCH.pending = Stopped(message, exit_code)
    _thread.interrupt_main(signal.SIGINT)


def rearm() -> None:
    """Install the handlers again inside :func:`watch`, after a library replaced them (Ray's
    ``ray.init`` sets its own SIGTERM handler, which ends the driver with a stack dump)."""
    if _WATCH.depth and _main_thread():
        _WATCH.install()
