"""The in-process runner: every shard made in this process, one after the other.

It makes exactly the shards the Ray pipeline makes (same tasks, same :class:`ShardMaker`, same
steps), which is what tests and debugging use; see :mod:`counterfactual.synth.run` for the on-disk
contract and :mod:`counterfactual.synth.tasks` for which input makes which shard.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from counterfactual import fs
from counterfactual.image import ImageEditor
from counterfactual.method.detect import Detector
from counterfactual.progress import Progress
from counterfactual.readers.spec import RunInput
from counterfactual.records import ImageRecord, Status
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.run import RunConfig, RunResult, check_entry, run_shards
from counterfactual.synth.staging import Staged, start_steps
from counterfactual.synth.tasks import ShardDone, ShardMaker, ShardTask
from counterfactual.text import TextRewriter


class LocalRunner:
    """The :class:`~counterfactual.synth.run.Runner` that makes every shard in this process,
    one after the other: :meth:`start` loads the steps' models (given ones are used as they
    are), :meth:`run` makes each shard with one :class:`ShardMaker`."""

    name = "local"

    def __init__(
        self,
        config: SynthConfig,
        out_dir: fs.PathLike,
        runtime: Runtime,
        editor: ImageEditor | None = None,
        rewriter: TextRewriter | None = None,
        detector: Detector | None = None,
        on_batch: Callable[[int], None] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.config, self.out_dir, self.runtime = config, out_dir, runtime
        self.editor, self.rewriter, self.detector = editor, rewriter, detector
        self.on_batch, self.progress = on_batch, progress
        self.maker: ShardMaker | None = None

    def start(self, shards: int | None = None) -> None:  # one maker, whatever is left
        config, runtime = self.config, self.runtime
        steps = start_steps(config, None, self.editor, self.rewriter, self.detector, runtime)
        staged = Staged.local(config, steps, runtime)
        node = socket.gethostname()
        self.maker = ShardMaker(config, self.out_dir, staged, node, None, runtime.batch_size)

    def run(self, tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        if self.maker is None:
            raise RuntimeError("LocalRunner.run before start")
        for task in tasks:
            self.maker.on_batch = _counting(task.index, self.on_batch, self.progress)
            yield self.maker(task)

    def stop(self) -> None:
        self.maker = None

    def record(self) -> dict[str, Any]:
        return {}


def run_local(
    inputs: RunInput | Iterable[ImageRecord],
    out_dir: fs.PathLike,
    config: SynthConfig,
    editor: ImageEditor | None = None,
    rewriter: TextRewriter | None = None,
    detector: Detector | None = None,
    failures: Sequence[Status] = (),
    on_batch: Callable[[int], None] | None = None,
    on_shard: Callable[[ShardDone], None] | None = None,
    progress: Progress | None = None,
    runtime: Runtime | None = None,
) -> RunResult:
    """Make the shards of ``inputs`` in ``out_dir``, resuming a run of the same config there.

    ``inputs``: a :class:`RunInput`, or records (``failures``: images the reader could not
    turn into records join the status record). ``on_batch(items)`` is called after every batch
    of items, ``on_shard(done)`` after every shard; ``progress`` counts every shard, and the
    items of the shard in the making after every batch.
    ``runtime``: device, dtype and batch sizes (default: :class:`Runtime`'s, CPU). The entry
    checks (:func:`~counterfactual.synth.run.check_entry`: local model paths, the device, OUT)
    run first; hub models are left to the steps.
    """
    runtime = runtime or Runtime()
    check_entry(out_dir, config, runtime, here=True)
    runner = LocalRunner(config, out_dir, runtime, editor, rewriter, detector, on_batch, progress)
    run = RunConfig(RunInput.of(inputs, failures), out_dir, config, runtime, on_shard, progress)
    return run_shards(run, runner)


def _counting(
    shard: int, on_batch: Callable[[int], None] | None, progress: Progress | None
) -> Callable[[int], None]:
    """A shard's ``on_batch``: the caller's, and the shard's items so far to ``progress``."""
    finished = 0

    def batch_done(items: int) -> None:
        nonlocal finished
        finished += items
        if progress is not None:
            progress.shard_items(shard, finished)
        if on_batch is not None:
            on_batch(items)

    return batch_done
