"""Progress of a run, for a person watching it: a bar on a terminal, plain lines in a log.

Both runners report through :class:`Progress`. On a terminal it draws a tqdm bar (or, when
tqdm is not installed, one line rewritten in place); elsewhere (a log file, a Ray driver's
captured stderr) it writes one line at most every ``interval`` seconds and a final line::

    synth: 1,234/3,000 items (41%), 3/10 shards, 1,100 written, 120 skipped, 14 failed, 85.3 items/s, ETA 0:00:21

The rate is the items done since the start divided by the time elapsed; the ETA is the items
left divided by that rate. With an unknown item total (a WebDataset corpus whose size is only
learnt as it is read) there is no percentage and no ETA.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TextIO


@dataclass
class Counts:
    """What a run has done so far. ``total_items`` is ``None`` while unknown."""

    items: int = 0
    total_items: int | None = None
    shards: int = 0
    total_shards: int = 0
    written: int = 0
    skipped: int = 0
    failed: int = 0


def _clock_text(seconds: float) -> str:
    """``H:MM:SS`` of a duration, rounded to the second."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def format_line(
    counts: Counts, elapsed: float, *, label: str = "synth", final: bool = False
) -> str:
    """One progress line; ``elapsed`` in seconds since the run started.

    The percentage is rounded down (100% only when every item is done). ``final`` replaces the
    ETA by the time the run took.
    """
    c = counts
    if c.total_items is None:
        parts = [f"{c.items:,} items"]
    else:
        pct = 100 if c.total_items <= 0 else min(100, 100 * c.items // c.total_items)
        parts = [f"{c.items:,}/{c.total_items:,} items ({pct}%)"]
    parts += [
        f"{c.shards:,}/{c.total_shards:,} shards",
        f"{c.written:,} written",
        f"{c.skipped:,} skipped",
        f"{c.failed:,} failed",
    ]
    rate = c.items / elapsed if elapsed > 0 else None
    if rate is not None:
        parts.append(f"{rate:,.1f} items/s")
    if final:
        parts.append(f"{_clock_text(elapsed)} elapsed")
    elif rate and c.total_items is not None:
        parts.append(f"ETA {_clock_text(max(0, c.total_items - c.items) / rate)}")
    return f"{label}: " + ", ".join(parts)


def _postfix(c: Counts) -> str:
    return (
        f"{c.shards}/{c.total_shards} shards, {c.written:,} written, "
        f"{c.skipped:,} skipped, {c.failed:,} failed"
    )


def _load_tqdm() -> Any | None:
    try:
        return importlib.import_module("tqdm").tqdm
    except ImportError:
        return None


class Progress:
    """Counts a run's progress and shows it on ``stream``; a context manager (``close`` on exit).

    ``bar``: ``None`` draws a bar only when ``stream.isatty()``; ``True``/``False`` force it.
    The bar is tqdm's; without tqdm it is one line rewritten in place at most every
    ``min(interval, 0.5)`` seconds. ``clock`` (seconds, monotonic) times the plain lines, the
    rate and the ETA; tests inject a fake one. ``label`` starts each line. ``update`` may be
    called from several threads.
    """

    def __init__(
        self,
        total_items: int | None,
        total_shards: int,
        *,
        stream: TextIO | None = None,
        interval: float = 5.0,
        bar: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "synth",
    ) -> None:
        if total_items is not None and total_items < 0:
            raise ValueError(f"total_items must be >= 0 or None, got {total_items}")
        if total_shards < 0:
            raise ValueError(f"total_shards must be >= 0, got {total_shards}")
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval}")
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.interval = interval
        self.label = label
        self.counts = Counts(total_items=total_items, total_shards=total_shards)
        self._clock = clock
        self._start = clock()
        self._last_line = self._start
        self._lock = threading.Lock()
        self._closed = False
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty()) if isatty is not None else False
        self.bar = bar
        self._tqdm: Any | None = None
        if bar:
            tqdm = _load_tqdm()
            if tqdm is not None:
                self._tqdm = tqdm(
                    total=total_items,
                    unit="item",
                    desc=label,
                    file=self.stream,
                    dynamic_ncols=True,
                    smoothing=0.1,
                )
                self._tqdm.set_postfix_str(_postfix(self.counts), refresh=False)

    @property
    def elapsed(self) -> float:
        return self._clock() - self._start

    def update(
        self,
        items: int = 0,
        written: int = 0,
        skipped: int = 0,
        failed: int = 0,
        shards: int = 0,
        total_items_delta: int = 0,
    ) -> None:
        """Add to the counts. ``total_items_delta`` grows (or shrinks) the item total; on an
        unknown total it starts one from 0, so the total then counts the items found so far."""
        with self._lock:
            c = self.counts
            c.items += items
            c.written += written
            c.skipped += skipped
            c.failed += failed
            c.shards += shards
            if total_items_delta:
                c.total_items = (c.total_items or 0) + total_items_delta
            if self._closed:
                return
            if self._tqdm is not None:
                if total_items_delta:
                    self._tqdm.total = c.total_items
                if written or skipped or failed or shards:
                    self._tqdm.set_postfix_str(_postfix(c), refresh=False)
                self._tqdm.update(items)  # refreshes at tqdm's own pace
                if total_items_delta and not items:
                    self._tqdm.refresh()
                return
            now = self._clock()
            if now - self._last_line >= (min(self.interval, 0.5) if self.bar else self.interval):
                self._last_line = now
                self._write(format_line(c, now - self._start, label=self.label))

    def _write(self, line: str, *, final: bool = False) -> None:
        if self.bar:  # the fallback bar: one line rewritten in place
            self.stream.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """Close the bar, or write the final line; once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._tqdm is not None:
                self._tqdm.set_postfix_str(_postfix(self.counts), refresh=False)
                self._tqdm.close()
                return
            self._write(
                format_line(self.counts, self.elapsed, label=self.label, final=True), final=True
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
