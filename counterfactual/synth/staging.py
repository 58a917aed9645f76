"""How a run's steps are ordered, started and grouped into stages.

The run's order follows from what the steps need (:func:`plan_steps`: each step as early as its
needs allow), a :class:`Chain` checks its order when it is built, and both runners group the
steps from the declarations alone (:func:`plan_stages`): the in-process runner chains them in one
process (:class:`Staged`); the Ray pipeline puts consecutive steps that load no learned model
into one CPU stage and each model step into its own actor pool. :func:`start_steps` builds the
steps and turns a step that cannot start into a one-line :class:`SetupError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from counterfactual.image import ImageEditor
from counterfactual.messages import one_line
from counterfactual.method.detect import Detection
from counterfactual.method.verify import Verifier
from counterfactual.synth.job import Job, planned_fields
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.steps import (
    STEP_CLASSES,
    STEPS,
    Detect,
    Edit,
    Resources,
    Rewrite,
    Step,
    StepSpec,
    Verify,
)
from counterfactual.text import TextRewriter


class SetupError(ValueError):
    """The run cannot start (a model that does not load, a stage the cluster cannot place); the
    message names the stage, the cause and the fix, on one line."""


def setup_failure(spec: StepSpec, err: BaseException) -> SetupError:
    """The error for a step that could not start: its stage, the cause, the option to fix."""
    res = spec.resources
    stage = res.stage if res is not None else spec.name
    fix = f"; check {res.option} and --device" if res is not None else ""
    return SetupError(f"{stage} could not start: {type(err).__name__}: {one_line(err)}{fix}")


def check_device(spec: StepSpec) -> None:
    """A model step on CUDA whose torch cannot use it: a :class:`SetupError` saying why (a
    CPU build, no driver, a driver too old for the build), before any model loads."""
    res = spec.resources
    if res is None or not str(res.device).startswith("cuda"):
        return
    from counterfactual.models.embed import check_cuda

    try:
        check_cuda(res.device)
    except ValueError as err:
        raise SetupError(f"{res.stage} could not start: {one_line(err)}") from err


def check_order(specs: Sequence[StepSpec], given: Iterable[str]) -> frozenset[str]:
    """The fields jobs holding ``given`` hold after ``specs`` ran in this order; a
    ``ValueError`` naming the first step that needs a field no step before it leaves."""
    have = frozenset(given)
    for i, spec in enumerate(specs):
        missing = spec.needs - have
        if missing:
            before = " -> ".join(s.name for s in specs[:i]) or "none"
            raise ValueError(
                f"step {spec.name} needs {', '.join(sorted(missing))}, which the steps before "
                f"it ({before}) do not make"
            )
        have = (have - spec.drops) | spec.makes
    return have


def plan_steps(config: SynthConfig, runtime: Runtime | None = None) -> tuple[StepSpec, ...]:
    """The run's steps as they declare themselves, in run order: among the steps whose needs
    are met, the first of :data:`STEPS` runs next."""
    todo = [cls.declare(config, runtime) for cls in STEPS if cls.applies(config)]
    have = planned_fields(config)
    order: list[StepSpec] = []
    while todo:
        ready = next((spec for spec in todo if spec.needs <= have), None)
        if ready is None:
            names = ", ".join(f"{s.name} ({', '.join(sorted(s.needs - have))})" for s in todo)
            raise ValueError(f"no step of this run makes what these need: {names}")
        todo.remove(ready)
        order.append(ready)
        have = (have - ready.drops) | ready.makes
    return tuple(order)


def step_order(config: SynthConfig) -> tuple[str, ...]:
    """The step names in run order (:func:`plan_steps`)."""
    return tuple(spec.name for spec in plan_steps(config))


def build_steps(
    config: SynthConfig,
    names: Sequence[str] | None = None,
    editor: ImageEditor | None = None,
    rewriter: TextRewriter | None = None,
    verifier: Verifier | None = None,
    detector: Callable[..., list[list[Detection]]] | None = None,
    runtime: Runtime | None = None,
) -> list[Step]:
    """Instantiate the named steps (default: the run's, in :func:`step_order`) to run under
    ``runtime``; ``editor``, ``rewriter``, ``verifier`` and ``detector`` replace the backend
    the config names."""
    backends: dict[str, Any] = {
        Edit.name: editor,
        Rewrite.name: rewriter,
        Verify.name: verifier,
        Detect.name: detector,
    }
    steps: list[Step] = []
    for name in names or step_order(config):
        if name not in STEP_CLASSES:
            raise ValueError(f"unknown step {name!r}; steps are {tuple(STEP_CLASSES)}")
        steps.append(STEP_CLASSES[name](config, backends.get(name), runtime))
    return steps


def start_steps(
    config: SynthConfig,
    names: Sequence[str] | None = None,
    editor: ImageEditor | None = None,
    rewriter: TextRewriter | None = None,
    detector: Callable[..., list[list[Detection]]] | None = None,
    runtime: Runtime | None = None,
) -> list[Step]:
    """:func:`build_steps`, one step at a time, with a step that cannot start (a model that
    does not load) reported as a one-line :class:`SetupError` naming its stage and the fix."""
    steps: list[Step] = []
    for name in names or step_order(config):
        if name in STEP_CLASSES:
            check_device(STEP_CLASSES[name].declare(config, runtime))
        try:
            steps += build_steps(config, [name], editor, rewriter, None, detector, runtime)
        except (OSError, RuntimeError, ImportError, ValueError) as err:
            if name not in STEP_CLASSES:
                raise
            raise setup_failure(STEP_CLASSES[name].declare(config, runtime), err) from err
    return steps


class Chain:
    """Several steps applied in order to one batch: one stage of a pipeline. ``given``: the
    fields its jobs hold when they arrive; an order in which a step would need a field no step
    before it makes is a ``ValueError`` here, when the chain is built."""

    def __init__(self, steps: Sequence[Step], given: Iterable[str]) -> None:
        self.steps = list(steps)
        check_order([step.spec for step in self.steps], given)

    def __call__(self, jobs: list[Job]) -> list[Job]:
        for step in self.steps:
            jobs = step(jobs)
        return jobs


@dataclass(frozen=True, slots=True)
class Stage:
    """Consecutive steps run in one place: a model step alone, the CPU steps between them
    together. ``given``: the job fields the stage receives."""

    specs: tuple[StepSpec, ...]
    given: frozenset[str] = frozenset()

    @property
    def steps(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    @property
    def resources(self) -> Resources | None:
        """The model step's resources (a model stage holds that one step), else ``None``."""
        return self.specs[0].resources

    @property
    def uses_model(self) -> bool:
        return self.resources is not None


def group_stages(specs: Sequence[StepSpec], given: Iterable[str]) -> list[Stage]:
    """Group steps in run order by what they declare: each model step alone, the CPU steps
    between them together; each stage knows the fields it receives."""
    check_order(specs, given)
    have = frozenset(given)
    stages: list[Stage] = []
    for spec in specs:
        if not spec.uses_model and stages and not stages[-1].uses_model:
            last = stages[-1]
            stages[-1] = Stage((*last.specs, spec), last.given)
        else:
            stages.append(Stage((spec,), have))
        have = (have - spec.drops) | spec.makes
    return stages


def plan_stages(config: SynthConfig, runtime: Runtime | None = None) -> list[Stage]:
    """The run's stages (:func:`group_stages` over :func:`plan_steps`)."""
    return group_stages(plan_steps(config, runtime), planned_fields(config))


def in_chunks(call: Callable[[list[Job]], list[Job]], jobs: list[Job], size: int) -> list[Job]:
    """``call`` on consecutive chunks of ``size`` jobs, results in order. Model steps get their
    batches this way in every runner, so a model sees the same batches (and computes the same
    floats) in process and on Ray."""
    out: list[Job] = []
    for start in range(0, len(jobs), size):
        out.extend(call(jobs[start : start + size]))
    return out


Process = Callable[[list[Job]], list[Job]]
"""Steps applied to one batch of jobs."""


class Staged:
    """A batch through the stages, one part per :class:`Stage`: ``(process, size)``, where a
    model stage's part gets chunks of ``size`` jobs (:func:`in_chunks`), so a model sees the
    same batches in every runner; ``size`` ``None``: the whole batch (CPU steps, or a part that
    chunks by itself, such as the Ray workers' remote model steps)."""

    def __init__(self, parts: Sequence[tuple[Process, int | None]]) -> None:
        self.parts = list(parts)

    @classmethod
    def local(
        cls, config: SynthConfig, steps: Sequence[Step], runtime: Runtime | None = None
    ) -> Staged:
        """Every stage in this process (the in-process runner's ``process``)."""
        by_name = {step.name: step for step in steps}
        parts: list[tuple[Process, int | None]] = []
        for stage in plan_stages(config, runtime):
            chain = Chain([by_name[name] for name in stage.steps], stage.given)
            res = stage.resources
            parts.append((chain, None if res is None else res.batch_size))
        return cls(parts)

    def __call__(self, jobs: list[Job]) -> list[Job]:
        for process, size in self.parts:
            jobs = process(jobs) if size is None else in_chunks(process, jobs, size)
        return jobs
