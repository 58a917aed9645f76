"""Progress of a run, for a person watching it: a bar on a terminal, plain lines in a log.

Both runners report through :class:`Progress`. On a terminal it draws a tqdm bar (or, when
tqdm is not installed, one line rewritten in place); elsewhere (a log file, a Ray driver's
captured stderr) it writes one line at most every ``interval`` seconds and a final line::

    synth: 1,234/3,000 images (41%), 3/10 shards, 1,310 items, rows: 1,100 written, 120 skipped, 14 failed, 85.3 images/s, 90.1 items/s, ETA 0:00:21

What is counted is the run's *inputs*: images of an annotated dataset, rows of a corpus (the
``unit`` word), as their shards commit; and its *items* (an image's removal plan with a
caption, what the model steps work on) as they finish, before their shard commits
(:meth:`Progress.shard_items`), so the line moves at the speed of the GPUs even when a shard
takes many minutes. ``written``/``skipped``/``failed`` count rows of the status record, which has a
row for every input image and every plan, so they do not sum to the inputs. The rate is the
inputs done since the start divided by the time elapsed; the ETA is the inputs left divided by
that rate. With an unknown total (a WebDataset corpus whose size is only learnt as it is read)
there is no percentage and no ETA.
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
    """What a run has done so far: ``inputs`` (images or corpus rows) of ``total_inputs``
    (``None`` while unknown), shards, status rows by status, and ``items`` finished (those of
    committed shards and those reported so far of shards in the making)."""

    inputs: int = 0
    total_inputs: int | None = None
    shards: int = 0
    total_shards: int = 0
    written: int = 0
    skipped: int = 0
    failed: int = 0
    items: int = 0


def _clock_text(seconds: float) -> str:
    """``H:MM:SS`` of a duration, rounded to the second."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def format_line(
    counts: Counts,
    elapsed: float,
    *,
    label: str = "synth",
    final: bool = False,
    unit: str = "images",
) -> str:
    """One progress line; ``elapsed`` in seconds since the run started; ``unit`` names the
    inputs (``images``, ``rows``).

    The percentage is rounded down (100% only when every input is done). ``final`` replaces
    the ETA by the time the run took.
    """
    c = counts
    if c.total_inputs is None:
        parts = [f"{c.inputs:,} {unit}"]
    else:
        pct = 100 if c.total_inputs <= 0 else min(100, 100 * c.inputs // c.total_inputs)
        parts = [f"{c.inputs:,}/{c.total_inputs:,} {unit} ({pct}%)"]
    parts += [f"{c.shards:,}/{c.total_shards:,} shards"]
    if c.items:
        parts.append(f"{c.items:,} items")
    parts.append(_rows(c))
    rate = c.inputs / elapsed if elapsed > 0 else None
    if rate is not None:
        parts.append(f"{rate:,.1f} {unit}/s")
        if c.items:
            parts.append(f"{c.items / elapsed:,.1f} items/s")
    if final:
        parts.append(f"{_clock_text(elapsed)} elapsed")
    elif rate and c.total_inputs is not None:
        parts.append(f"ETA {_clock_text(max(0, c.total_inputs - c.inputs) / rate)}")
    return f"{label}: " + ", ".join(parts)


def _rows(c: Counts) -> str:
    return f"rows: {c.written:,} written, {c.skipped:,} skipped, {c.failed:,} failed"


def _postfix(c: Counts) -> str:
    items = f"{c.items:,} items, " if c.items else ""
    return f"{c.shards}/{c.total_shards} shards, {items}{_rows(c)}"


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
    rate and the ETA; tests inject a fake one. ``label`` starts each line; ``unit`` names the
    inputs (``images`` of a dataset, ``rows`` of a corpus). ``update`` may be called from
    several threads.
    """

    def __init__(
        self,
        total_inputs: int | None,
        total_shards: int,
        *,
        stream: TextIO | None = None,
        interval: float = 5.0,
        bar: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        label: str = "synth",
        unit: str = "images",
    ) -> None:
        if total_inputs is not None and total_inputs < 0:
            raise ValueError(f"total_inputs must be >= 0 or None, got {total_inputs}")
        if total_shards < 0:
            raise ValueError(f"total_shards must be >= 0, got {total_shards}")
        if interval < 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval}")
        self.stream: TextIO = stream if stream is not None else sys.stderr
        self.interval = interval
        self.label = label
        self.unit = unit
        self.counts = Counts(total_inputs=total_inputs, total_shards=total_shards)
        self._clock = clock
        self._start = clock()
        self._last_line = self._start
        self._lock = threading.Lock()
        self._closed = False
        self._partial: dict[int, int] = {}  # items so far of shards in the making
        self._committed: set[int] = set()
        if bar is None:
            isatty = getattr(self.stream, "isatty", None)
            bar = bool(isatty()) if isatty is not None else False
        self.bar = bar
        self._tqdm: Any | None = None
        if bar:
            tqdm = _load_tqdm()
            if tqdm is not None:
                self._tqdm = tqdm(
                    total=total_inputs,
                    unit=unit.removesuffix("s"),
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
        inputs: int = 0,
        written: int = 0,
        skipped: int = 0,
        failed: int = 0,
        shards: int = 0,
        total_inputs_delta: int = 0,
        items: int = 0,
        shard: int | None = None,
    ) -> None:
        """Add to the counts. ``total_inputs_delta`` grows (or shrinks) the input total; on an
        unknown total it starts one from 0, so the total then counts the inputs found so far.
        ``shard``: the shard these counts commit; its ``items`` replace those
        :meth:`shard_items` reported of it."""
        with self._lock:
            c = self.counts
            c.inputs += inputs
            c.written += written
            c.skipped += skipped
            c.failed += failed
            c.shards += shards
            c.items += items
            if shard is not None:
                self._committed.add(shard)
                c.items -= self._partial.pop(shard, 0)
            if total_inputs_delta:
                c.total_inputs = (c.total_inputs or 0) + total_inputs_delta
            self._show(
                inputs, bool(written or skipped or failed or shards or items), total_inputs_delta
            )

    def shard_items(self, shard: int, items: int) -> None:
        """Items of ``shard`` finished so far, before it commits (a worker tells after each
        batch). The latest report counts: a shard begun again on another worker (its first
        worker was lost) starts again from 0. Reports of a committed shard are ignored."""
        with self._lock:
            if shard in self._committed:
                return
            self.counts.items += items - self._partial.get(shard, 0)
            self._partial[shard] = items
            self._show(0, True, 0)

    def _show(self, inputs: int, postfix: bool, total_inputs_delta: int) -> None:
        """Draw the bar or write a line when one is due (the lock held)."""
        c = self.counts
        if self._closed:
            return
        now = self._clock()
        if self._tqdm is not None:
            if total_inputs_delta:
                self._tqdm.total = c.total_inputs
            if postfix:
                self._tqdm.set_postfix_str(_postfix(c), refresh=False)
            self._tqdm.update(inputs)  # refreshes at tqdm's own pace
            if (total_inputs_delta and not inputs) or (
                postfix and not inputs and now - self._last_line >= 0.5
            ):
                self._last_line = now
                self._tqdm.refresh()
            return
        if now - self._last_line >= (min(self.interval, 0.5) if self.bar else self.interval):
            self._last_line = now
            self._write(format_line(c, now - self._start, label=self.label, unit=self.unit))

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
                format_line(
                    self.counts, self.elapsed, label=self.label, final=True, unit=self.unit
                ),
                final=True,
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
