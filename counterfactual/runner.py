"""The in-process runner: every shard made in this process, one after the other.

It makes exactly the shards the Ray pipeline makes (same tasks, same :class:`ShardMaker`, same
steps), which is what tests and debugging use; see :mod:`counterfactual.run` for the on-disk
contract and :mod:`counterfactual.tasks` for which input makes which shard.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Iterator, Sequence

from counterfactual import fs
from counterfactual.detect import Detector
from counterfactual.image import ImageEditor
from counterfactual.progress import Progress
from counterfactual.records import ImageRecord, Status
from counterfactual.run import RunResult, preflight, run_shards, setup_failure
from counterfactual.stages import Staged, build_steps, step_order
from counterfactual.synth import SynthConfig
from counterfactual.tasks import RunInput, ShardDone, ShardMaker, ShardTask
from counterfactual.text import TextRewriter


def as_input(inputs: RunInput | Iterable[ImageRecord], failures: Sequence[Status] = ()) -> RunInput:
    """``inputs`` as a :class:`RunInput` (plain records with the reader's ``failures``)."""
    if isinstance(inputs, RunInput):
        return inputs
    return RunInput(records=inputs, failures=tuple(failures))


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
) -> RunResult:
    """Make the shards of ``inputs`` in ``out_dir``, resuming a run of the same config there.

    ``inputs``: a :class:`RunInput`, or records (``failures``: images the reader could not
    turn into records join the status record). ``on_batch(items)`` is called after every batch
    of items, ``on_shard(done)`` after every shard; ``progress`` counts every shard.
    """
    node = socket.gethostname()

    def execute(tasks: Iterator[ShardTask]) -> Iterator[ShardDone]:
        maker: ShardMaker | None = None
        for task in tasks:
            if maker is None:  # models load only when there is work left
                steps = []
                for name in step_order(config):
                    try:
                        steps += build_steps(config, [name], editor, rewriter, None, detector)
                    except (OSError, RuntimeError, ImportError, ValueError) as err:
                        raise setup_failure(name, err) from err
                maker = ShardMaker(config, out_dir, Staged(config, steps), node, on_batch)
            yield maker(task)

    preflight(config)
    inputs = as_input(inputs, failures)
    return run_shards(inputs, out_dir, config, execute, "local", on_shard, progress)
