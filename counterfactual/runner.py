"""The in-process runner: every step in this process, one batch at a time.

It makes exactly the shards the Ray pipeline makes (same layout, same steps, same writer), which
is what tests and debugging use; see :mod:`counterfactual.run` for the on-disk contract.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import TypeVar

from counterfactual.detect import Detector
from counterfactual.image import ImageEditor
from counterfactual.records import ImageRecord, Status
from counterfactual.run import RunResult, deliver, finish_run, layout, prepare_run
from counterfactual.shards import ShardAssembler
from counterfactual.stages import Chain, build_steps
from counterfactual.synth import SynthConfig
from counterfactual.text import TextRewriter

T = TypeVar("T")


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def run_local(
    records: Iterable[ImageRecord],
    out_dir: Path,
    config: SynthConfig,
    editor: ImageEditor | None = None,
    rewriter: TextRewriter | None = None,
    detector: Detector | None = None,
    failures: Sequence[Status] = (),
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Make the shards of ``records`` in ``out_dir``, resuming a run of the same config there.

    ``failures`` (images the reader could not turn into records) join the status record;
    ``progress(items_done, items_todo)`` is called after every batch.
    """
    run = prepare_run(Path(out_dir), layout(records, config, failures), config)
    assembler = ShardAssembler(run.out_dir, run.todo_sizes())
    total, done = sum(run.todo_sizes().values()), 0
    try:
        if total:
            steps = build_steps(config, editor=editor, rewriter=rewriter, detector=detector)
            chain = Chain(steps)
            for batch in batched(run.jobs(), config.batch_size):
                deliver(assembler, (job.done() for job in chain(batch)))
                done += len(batch)
                if progress is not None:
                    progress(done, total)
    finally:
        assembler.abort()
    return finish_run(run, assembler.committed, "local")
