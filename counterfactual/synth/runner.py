"""The in-process runner: every shard made in this process, one after the other.

It makes exactly the shards the Ray pipeline makes (same tasks, same :class:`ShardMaker`, same
steps), which is what tests and debugging use; see :mod:`counterfactual.synth.run` for the on-disk
contract and :mod:`counterfactual.synth.tasks` for which input makes which shard.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator, Sequence

from counterfactual import fs
from counterfactual.image import ImageEditor
from counterfactual.method.detect import Detector
from counterfactual.progress import Progress
from counterfactual.readers.spec import RunInput
from counterfactual.records import ImageRecord, Status
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.run import RunResult, preflight, run_shards, started
from counterfactual.synth.staging import Staged, start_steps
from counterfactual.synth.tasks import ShardDone, ShardMaker, ShardTask
from counterfactual.text import TextRewriter


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
    ``runtime``: device, dtype and batch sizes (default: :class:`Runtime`'s, CPU).
    """
    runtime = runtime or Runtime()
    node = socket.gethostname()

    def execute(tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        maker: ShardMaker | None = None
        for task in tasks:
            if maker is None:  # models load only when there is work left
                steps = start_steps(config, None, editor, rewriter, detector, runtime)
                staged = Staged.local(config, steps, runtime)
                maker = ShardMaker(config, out_dir, staged, node, None, runtime.batch_size)
                started(tasks)  # run.json now: a run that failed to start leaves none
            maker.on_batch = _counting(task.index, on_batch, progress)
            yield maker(task)

    preflight(config, runtime)
    inputs = RunInput.of(inputs, failures)
    return run_shards(
        inputs, out_dir, config, execute, "local", on_shard, progress, runtime=runtime
    )


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
