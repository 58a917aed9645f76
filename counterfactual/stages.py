"""The per-item steps of a run, as callable classes over batches of :class:`Job`.

A :class:`Job` is one work item on its way to a shard: ``Decode`` loads the picture, ``Edit``
erases the plan, ``Rewrite`` writes the new caption, ``Verify`` (when asked) checks that the
result is a counterfactual, ``Encode`` packs the shard sample. Each
step's ``__init__`` loads what it needs once (models, spaCy); ``__call__`` transforms one batch
and returns it. A job that fails keeps its place in the batch with a :class:`Status` saying why,
and later steps pass it through, so every item reaches the writer exactly once.

The in-process runner chains the steps in one process; the Ray pipeline puts consecutive steps
that load no learned model into one CPU stage and each model step into its own actor pool.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from counterfactual import __version__
from counterfactual.image import EditRequest, ImageEditor, make_editor
from counterfactual.image.best_of_n import BestOfN
from counterfactual.imageio import SampleError, encode_jpeg
from counterfactual.masks import plan_mask
from counterfactual.records import Status
from counterfactual.shards import Sample
from counterfactual.synth import SynthConfig, WorkItem, load_record_image
from counterfactual.text import RewriteRequest, RewriteResult, TextRewriter, make_rewriter
from counterfactual.verify import (
    RemovalScorer,
    Verifier,
    VerifyRequest,
    class_boxes,
)
from counterfactual.vocab import load_vocabulary

CAPTION_UNCHANGED = "caption-unchanged"
"""Status reason of a plan skipped because its caption would not change (``skip_unchanged``)."""
MODEL_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, ValueError, OSError, MemoryError)
"""What a learned model may raise on a batch (CUDA out of memory is a ``RuntimeError``). The
batch is then retried one item at a time and the items that still fail get ``model-error``."""


@dataclass(frozen=True, slots=True)
class Done:
    """A finished job as the writer takes it: where it goes, its sample (``None`` when it
    failed), its status row and the seconds each step spent on it."""

    shard: int
    index: int
    sample: Sample | None
    status: Status
    seconds: dict[str, float]


@dataclass(slots=True)
class Job:
    """One work item between steps. ``shard``/``index`` place it in the output; arrays are
    ``uint8`` RGB ``HxWx3`` (``mask``: ``HxW``, 255 = repaint) and are dropped once encoded;
    ``image`` (the original) is dropped by ``Edit``, or by ``Verify`` when verification is on.
    ``verify`` is :meth:`VerifyResult.to_dict` once verified."""

    shard: int
    index: int
    item: WorkItem
    image: np.ndarray | None = None
    mask: np.ndarray | None = None
    edited: np.ndarray | None = None
    caption: RewriteResult | None = None
    verify: dict[str, Any] | None = None
    methods: dict[str, Any] = field(default_factory=dict)
    sample: Sample | None = None
    failure: Status | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None

    def fail(self, reason: str | None, detail: str = "", status: str = "failed") -> None:
        """End the job here with ``reason`` (``status="skipped"``: nothing went wrong, there is
        just nothing to make)."""
        self.failure = Status(
            self.item.record.image_id,
            status,
            reason or "unknown",
            detail,
            self.item.key,
            self.item.plan.target,
        )
        self.image = self.mask = self.edited = None

    def done(self) -> Done:
        """What the writer needs of a finished job, without the record and the pixels."""
        return Done(self.shard, self.index, self.sample, self.status(), dict(self.seconds))

    def status(self) -> Status:
        """The row this job leaves in the status record."""
        if self.failure is not None:
            return self.failure
        if self.sample is None:
            raise ValueError(f"job {self.item.key} is neither encoded nor failed")
        rec = self.item.record
        return Status(rec.image_id, "written", None, "", self.item.key, self.item.plan.target)


class Step(Protocol):
    name: str
    uses_model: bool
    """True when the step runs a learned model (GPU-capable, worth an actor pool of its own)."""

    def __call__(self, jobs: list[Job]) -> list[Job]: ...


def _timed(name: str, jobs: Sequence[Job], start: float) -> None:
    share = (time.perf_counter() - start) / max(1, len(jobs))
    for job in jobs:
        job.seconds[name] = job.seconds.get(name, 0.0) + share


def _batch_or_each(
    call: Callable[[Sequence[Any]], Sequence[Any]],
    jobs: Sequence[Job],
    requests: Sequence[Any],
    model_detail: str = "",
) -> list[Any]:
    """``call(requests)`` as one batch; when that raises a ``SampleError`` (one bad request) or
    a model error, each request alone, and the ones that still fail become ``Status`` rows
    (their reason, or ``model-error`` with ``model_detail`` before the exception)."""
    if not requests:
        return []
    try:
        return list(call(requests))
    except (SampleError, *MODEL_ERRORS):
        pass  # retry one by one below
    out: list[Any] = []
    for job, request in zip(jobs, requests, strict=True):
        image_id = job.item.record.image_id
        try:
            out.append(call([request])[0])
        except SampleError as err:
            out.append(Status(image_id, "failed", err.reason, err.detail))
        except MODEL_ERRORS as err:
            out.append(Status(image_id, "failed", "model-error", f"{model_detail}{err!r}"))
    return out


class Decode:
    """Load each job's picture (EXIF-upright RGB), checked against the annotation."""

    name = "decode"
    uses_model = False

    def __init__(self, config: SynthConfig) -> None:
        self.max_pixels = config.max_pixels

    def __call__(self, jobs: list[Job]) -> list[Job]:
        start = time.perf_counter()
        for job in jobs:
            if not job.ok:
                continue
            try:
                job.image = load_record_image(job.item.record, self.max_pixels)
            except SampleError as err:
                job.fail(err.reason, err.detail)
        _timed(self.name, jobs, start)
        return jobs


class Edit:
    """Erase each job's plan: mask from the plan, then the configured image backend."""

    name = "edit"

    def __init__(self, config: SynthConfig, editor: ImageEditor | None = None) -> None:
        self.config = config
        self.uses_model = uses_model(config, self.name)
        self.editor = editor or make_editor(config.image)
        if config.image.candidates > 1 and not isinstance(self.editor, BestOfN):
            verifier = Verifier(config.verify, load_vocabulary(config.text.vocabulary))
            self.editor = BestOfN(self.editor, config.image.candidates, RemovalScorer(verifier))
        self.info = self.editor.describe()
        self.keep_original = config.verify.enabled  # Verify compares it with the edit

    def __call__(self, jobs: list[Job]) -> list[Job]:
        start = time.perf_counter()
        todo: list[Job] = []
        requests: list[EditRequest] = []
        for job in jobs:
            if not job.ok:
                continue
            if job.image is None:
                raise ValueError(f"job {job.item.key} reached Edit without a decoded image")
            h, w = job.image.shape[:2]
            try:
                job.mask = plan_mask(job.item.record, job.item.plan, h, w, self.config.mask)
            except SampleError as err:
                job.fail(err.reason, err.detail)
                continue
            it = job.item
            requests.append(
                EditRequest(job.image, job.mask, it.plan.removed, it.plan.kept, it.seed)
            )
            todo.append(job)
        for job, out in zip(todo, _batch_or_each(self._edit, todo, requests), strict=True):
            if isinstance(out, Status):
                job.fail(out.reason, out.detail)
            else:
                job.edited, choice = out
                if not self.keep_original:
                    job.image = None
                job.methods["image_method"] = self.info
                if choice is not None:
                    job.methods["best_of_n"] = choice
        _timed(self.name, jobs, start)
        return jobs

    def _edit(
        self, requests: Sequence[EditRequest]
    ) -> list[tuple[np.ndarray, dict[str, Any] | None]]:
        """Per request: the edited image and, for best-of-n, its pick."""
        images = self.editor(requests)
        return list(zip(images, self._choices(len(requests)), strict=True))

    def _choices(self, n: int) -> list[dict[str, Any] | None]:
        if isinstance(self.editor, BestOfN):
            return list(self.editor.choices)
        return [None] * n


class Rewrite:
    """Write each job's new caption. Captioners read the edited picture, so they come after
    ``Edit``; the other methods only read the original caption and may come first."""

    name = "rewrite"

    def __init__(self, config: SynthConfig, rewriter: TextRewriter | None = None) -> None:
        self.needs_image = config.text.method == "captioner"
        self.uses_model = uses_model(config, self.name)
        self.rewriter = rewriter or make_rewriter(config.text)
        self.info = self.rewriter.describe()
        self.skip_unchanged = config.text.skip_unchanged

    def __call__(self, jobs: list[Job]) -> list[Job]:
        start = time.perf_counter()
        todo = [job for job in jobs if job.ok]
        requests = []
        for job in todo:
            if self.needs_image and job.edited is None:
                raise ValueError(f"job {job.item.key} reached the captioner without an image")
            it = job.item
            requests.append(
                RewriteRequest(
                    caption=it.caption.text,
                    removed=it.plan.removed,
                    kept=it.plan.kept,
                    phrases=it.caption.phrases,
                    image=job.edited,
                    seed=it.seed,
                )
            )
        for job, result in zip(todo, self._rewrite(requests), strict=True):
            if result.text is None:
                job.fail(result.reason)
            elif self.skip_unchanged and not result.removed_phrases:
                job.fail(CAPTION_UNCHANGED, "the caption mentions no removed class", "skipped")
            else:
                job.caption = result
                job.methods["text_method"] = self.info
        _timed(self.name, jobs, start)
        return jobs

    def _rewrite(self, requests: list[RewriteRequest]) -> list[RewriteResult]:
        if not requests:
            return []
        try:
            return list(self.rewriter(requests))
        except MODEL_ERRORS:
            if len(requests) == 1:
                return [RewriteResult(None, (), "model-error")]
        out = []
        for request in requests:
            try:
                out.extend(self.rewriter([request]))
            except MODEL_ERRORS:
                out.append(RewriteResult(None, (), "model-error"))
        return out


def sample_meta(job: Job, seed: int) -> dict[str, Any]:
    """Everything needed to trace and reproduce a sample (SPEC 1.4)."""
    item, edited, caption = job.item, job.edited, job.caption
    if edited is None or caption is None or job.mask is None:
        raise ValueError(f"job {item.key} is not edited and rewritten")
    return {
        "key": item.key,
        "dataset": item.record.dataset,
        "split": item.record.split,
        "image_id": item.record.image_id,
        "file": item.record.file,
        "width": int(edited.shape[1]),
        "height": int(edited.shape[0]),
        "caption_id": item.caption.caption_id,
        "original_caption": item.caption.text,
        "caption": caption.text,
        "removed_phrases": list(caption.removed_phrases),
        "plan": item.plan.to_dict(),
        "mask_boxes": [list(b) for b in item.plan.mask_boxes],
        "mask_pixels": int(np.count_nonzero(job.mask)),
        "image_method": job.methods.get("image_method"),
        **({"best_of_n": job.methods["best_of_n"]} if "best_of_n" in job.methods else {}),
        "text_method": job.methods.get("text_method"),
        "seed": seed,
        "sample_seed": item.seed,
        "counterfactual_version": __version__,
        **({"verify": job.verify} if job.verify is not None else {}),
    }


class Verify:
    """Check each job's counterfactual (:mod:`counterfactual.verify`): the removed classes are no
    longer recognised on their boxes, the kept ones still are, the new caption names no removed
    class. ``record`` mode stores the result in the sample's json under ``verify``; ``filter``
    also fails a job that does not pass, with its first failed check (``verify-removal``,
    ``verify-retention``, ``verify-text``) as reason. With verification off it passes jobs on."""

    name = "verify"

    def __init__(self, config: SynthConfig, verifier: Verifier | None = None) -> None:
        self.config = config.verify
        self.uses_model = uses_model(config, self.name)
        self.text_method = config.text.method
        self.verifier: Verifier | None = None
        if self.config.enabled:
            self.verifier = verifier or Verifier(
                self.config, load_vocabulary(config.text.vocabulary)
            )

    def __call__(self, jobs: list[Job]) -> list[Job]:
        if self.verifier is None:
            return jobs
        start = time.perf_counter()
        todo = [job for job in jobs if job.ok]
        requests = [self._request(job) for job in todo]
        results = _batch_or_each(self.verifier, todo, requests, model_detail="verify: ")
        for job, out in zip(todo, results, strict=True):
            job.image = None
            if isinstance(out, Status):
                job.fail(out.reason, out.detail)
                continue
            job.verify = out.to_dict()
            if self.config.mode == "filter" and not out.passed:
                job.fail(out.failed[0], out.detail())
        _timed(self.name, jobs, start)
        return jobs

    def _request(self, job: Job) -> VerifyRequest:
        if job.image is None or job.edited is None or job.caption is None:
            raise ValueError(f"job {job.item.key} reached Verify without both images and caption")
        it = job.item
        h, w = job.edited.shape[:2]
        return VerifyRequest(
            original=job.image,
            edited=job.edited,
            removed_boxes=class_boxes(it.record, it.plan.removed, h, w),
            kept_boxes=class_boxes(it.record, it.plan.kept, h, w),
            removed=it.plan.removed,
            kept=it.plan.kept,
            caption=job.caption.text,
            text_method=self.text_method,
        )


class Encode:
    """Pack each finished job into a shard sample (JPEG, caption, metadata) and drop its
    arrays, so only bytes travel to the writer."""

    name = "encode"
    uses_model = False

    def __init__(self, config: SynthConfig) -> None:
        self.quality = config.jpeg_quality
        self.seed = config.seed

    def __call__(self, jobs: list[Job]) -> list[Job]:
        start = time.perf_counter()
        for job in jobs:
            if not job.ok:
                continue
            if job.edited is None or job.caption is None:
                raise ValueError(f"job {job.item.key} reached Encode unfinished")
            try:
                jpg = encode_jpeg(job.edited, self.quality)
            except SampleError as err:
                job.fail(err.reason, err.detail)
                continue
            job.sample = Sample(
                job.item.key, jpg, job.caption.text or "", sample_meta(job, self.seed)
            )
            job.image = job.mask = job.edited = None
        _timed(self.name, jobs, start)
        return jobs


def step_order(config: SynthConfig) -> tuple[str, ...]:
    """The step names in run order: a rewriter that needs no picture runs first, so the CPU
    steps after it can go from file to JPEG in one place without shipping pixels around."""
    verify = ("verify",) if config.verify.enabled else ()
    if config.text.method == "captioner":
        return ("decode", "edit", "rewrite", *verify, "encode")
    return ("rewrite", "decode", "edit", *verify, "encode")


STEPS: dict[str, type] = {
    "decode": Decode,
    "edit": Edit,
    "rewrite": Rewrite,
    "verify": Verify,
    "encode": Encode,
}


def build_steps(
    config: SynthConfig,
    names: Sequence[str] | None = None,
    editor: ImageEditor | None = None,
    rewriter: TextRewriter | None = None,
    verifier: Verifier | None = None,
) -> list[Step]:
    """Instantiate the named steps (default: all, in :func:`step_order`)."""
    steps: list[Step] = []
    for name in names or step_order(config):
        if name == "edit":
            steps.append(Edit(config, editor))
        elif name == "rewrite":
            steps.append(Rewrite(config, rewriter))
        elif name == "verify":
            steps.append(Verify(config, verifier))
        elif name in STEPS:
            steps.append(STEPS[name](config))
        else:
            raise ValueError(f"unknown step {name!r}; steps are {tuple(STEPS)}")
    return steps


def uses_model(config: SynthConfig, name: str) -> bool:
    """Whether step ``name`` runs a learned model under ``config``, without loading it."""
    if name == "edit":
        return config.image.method == "inpaint" and config.image.backend != "opencv"
    if name == "rewrite":
        return config.text.method == "captioner"
    if name == "verify":
        return config.verify.enabled
    return False


_MODEL_PART = {"edit": "image", "rewrite": "text", "verify": "verify"}
"""The part of :class:`SynthConfig` that holds a model step's device and batch size."""


def step_device(config: SynthConfig, name: str) -> str:
    """The torch device of a model step (``cpu`` for the others)."""
    if uses_model(config, name):
        return getattr(config, _MODEL_PART[name]).device
    return "cpu"


def step_batch_size(config: SynthConfig, name: str) -> int:
    """Items per call of step ``name``: the model's batch size, or the run's for CPU steps."""
    if uses_model(config, name):
        return getattr(config, _MODEL_PART[name]).batch_size
    return config.batch_size


class Chain:
    """Several steps applied in order to one batch: one stage of a pipeline."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)

    def __call__(self, jobs: list[Job]) -> list[Job]:
        for step in self.steps:
            jobs = step(jobs)
        return jobs
