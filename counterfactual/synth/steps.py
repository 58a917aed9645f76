"""The per-item steps of a run, as callable classes over batches of :class:`Job`.

``Decode`` loads the picture, ``Edit`` erases the plan, ``Rewrite`` writes the new caption,
``Verify`` (when asked) checks that the result is a counterfactual, ``Encode`` packs the shard
sample. On a corpus without boxes, ``Detect`` finds the objects after ``Decode`` and ``Select``
applies the alpha rules to them, so the plan is made in the worker. Each step's ``__init__``
loads what it needs once (models, spaCy); ``__call__`` transforms one batch and returns it.

Each step declares itself (:meth:`declare`, a :class:`StepSpec`, read from the config without
loading anything): the job fields it needs, makes and drops (:data:`JOB_FIELDS`), and the
learned model it runs, if any, with its device and batch size (:class:`Resources`). How the
steps are ordered, built and grouped into stages is :mod:`counterfactual.synth.staging`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import numpy as np

from counterfactual.image import (
    EditRequest,
    ImageEditor,
    candidate_count,
    edit_region,
    image_model,
    make_editor,
    recorded_mask,
)
from counterfactual.image.best_of_n import BestOfN
from counterfactual.imageio import SampleError, encode_jpeg, encode_png
from counterfactual.messages import one_line
from counterfactual.method.detect import Detection, Detector, to_objects
from counterfactual.method.masks import plan_mask
from counterfactual.method.selection import CAPTION_UNCHANGED, select_many
from counterfactual.method.verify import (
    PreparedVerify,
    RemovalScorer,
    Verifier,
    VerifyRequest,
    class_boxes,
    prepare_verify,
)
from counterfactual.shards.pictures import load_record_picture
from counterfactual.shards.shards import Sample
from counterfactual.synth import costs
from counterfactual.synth.costs import inpaint_cost
from counterfactual.synth.job import JOB_FIELDS, Job, sample_meta
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.text import (
    CAPTION_STILL_NAMES,
    CLASS_NOT_IN_VOCABULARY,
    KEEPING_METHODS,
    REMOVING_METHODS,
    REWRITERS,
    RewriteRequest,
    RewriteResult,
    TextRewriter,
    make_rewriter,
    text_model,
)
from counterfactual.text.np_removal import MentionCheck
from counterfactual.vocab import load_vocabulary

_TEXT_RULES = {"text_checked": REMOVING_METHODS, "kept_named": KEEPING_METHODS}
"""The verifier's text check by the rewriters' declarations (plugins included)."""

MODEL_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, ValueError, OSError, MemoryError)
"""What a learned model may raise on a batch (CUDA out of memory is a ``RuntimeError``). The
batch is then retried one item at a time (out of memory: in halves first) and the items that
still fail get ``model-error``, unless the error says the device itself is broken
(:class:`DeviceFailure`)."""

DEVICE_ERRORS = (
    "CUDA error: an illegal memory access",
    "CUDA error: unspecified launch failure",
    "CUDA error: misaligned address",
    "CUDA error: device-side assert",
    "CUBLAS_STATUS_EXECUTION_FAILED",
    "CUBLAS_STATUS_INTERNAL_ERROR",
    "CUDNN_STATUS_EXECUTION_FAILED",
    "CUDA error: uncorrectable ECC error",
    "Xid",
)
"""Substrings of a model error after which the CUDA context is unusable: every later call on
that process fails, so the model's process must end (Ray restarts it) rather than fail items."""

OUT_OF_MEMORY_ERRORS = ("CUDA out of memory", "OutOfMemoryError", "out of memory")
"""Substrings of a model error that a smaller batch may avoid."""


class DeviceFailure(ValueError):
    """The device a model runs on is broken (:data:`DEVICE_ERRORS`): no item can be made on
    it; the message says which device and the error, on one line."""


class StageFailing(ValueError):
    """More than :attr:`FailureWindow.threshold` of a model stage's last items failed with
    ``model-error``: the run ends with this one line rather than fail every item."""


def is_device_failure(err: BaseException) -> bool:
    """Whether ``err`` says the device is unusable from now on (:data:`DEVICE_ERRORS`)."""
    text = str(err)
    return any(marker in text for marker in DEVICE_ERRORS)


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is a device (or host) running out of memory for the batch."""
    return isinstance(err, MemoryError) or any(m in str(err) for m in OUT_OF_MEMORY_ERRORS)


def free_device_cache() -> None:
    """``torch.cuda.empty_cache()`` when torch is loaded and CUDA is up; nothing otherwise."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@dataclass
class FailureWindow:
    """The share of ``model-error`` among a model stage's last ``size`` items: :meth:`add`
    raises :class:`StageFailing` once the window is full and the share is above
    ``threshold`` (a device that fails everything without saying so)."""

    stage: str
    size: int = 200
    threshold: float = 0.5
    _last: deque[bool] = field(default_factory=deque)

    def add(self, jobs: Sequence[Job]) -> None:
        """Count the jobs the stage ran (pass only those that had not failed before it)."""
        for job in jobs:
            self._last.append(job.failure is not None and job.failure.reason == "model-error")
            if len(self._last) > self.size:
                self._last.popleft()
        failed = sum(self._last)
        if len(self._last) == self.size and failed > self.threshold * self.size:
            raise StageFailing(
                f"stage {self.stage}: {failed} of its last {self.size} items failed with "
                f"model-error (more than {self.threshold:.0%}); the model or its device is "
                "failing, see the status rows' details; the run stops here, rerun to resume"
            )


@dataclass(frozen=True, slots=True)
class Resources:
    """What a model step runs on: ``stage``, the name of its stage (a Ray actor pool of that
    name runs it on GPUs), the ``model`` it loads and the command-line ``option`` that names it
    (for setup errors), its torch ``device`` and ``batch_size`` (items per model call).
    ``heavy``: the run's costly model (the inpainter), which the cluster layout
    (:mod:`counterfactual.synth.layout`) gives nearly every GPU; a light one (detector,
    captioner, verifier) runs on a share of a GPU beside it, sized by ``cost``: seconds per
    item on one GPU at its batch (:mod:`counterfactual.synth.costs`; 0: not declared)."""

    stage: str
    model: str
    option: str
    device: str
    batch_size: int
    heavy: bool = False
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class StepSpec:
    """A step as it declares itself, before anything loads: the job fields (:data:`JOB_FIELDS`)
    it ``needs``, ``makes`` and ``drops`` (pixels freed once no later step reads them), and the
    learned model it runs (``resources``; ``None``: a CPU step, run on the run's batches)."""

    name: str
    needs: frozenset[str] = frozenset()
    makes: frozenset[str] = frozenset()
    drops: frozenset[str] = frozenset()
    resources: Resources | None = None

    def __post_init__(self) -> None:
        unknown = (self.needs | self.makes | self.drops) - set(JOB_FIELDS)
        if unknown:
            raise ValueError(f"step {self.name}: unknown job fields {sorted(unknown)}")

    @property
    def uses_model(self) -> bool:
        """True when the step runs a learned model (GPU-capable, worth an actor pool)."""
        return self.resources is not None


def _seconds(cost: costs.StageCost | None) -> float:
    return 0.0 if cost is None else cost.seconds


def _fields(*names: str) -> frozenset[str]:
    return frozenset(names)


T = TypeVar("T")
R = TypeVar("R")


class Step(Protocol):
    """A step: ``spec`` is its :meth:`declare` under the config and runtime it was built with."""

    name: str
    spec: StepSpec

    def __call__(self, jobs: list[Job]) -> list[Job]: ...


class BatchStep:
    """What every step does around its work, in one place: ``__call__`` hands :meth:`run` the
    jobs of the batch that have not failed, in order, then spreads the seconds the call took
    evenly over the whole batch under the step's name (``Job.seconds``; a shard's stats and the
    manifest sum them). ``run`` changes the jobs in place; a job it cannot finish fails
    (:meth:`Job.fail`) and keeps its place, through :func:`each` (a ``SampleError`` of one job)
    or :func:`model_outputs` (a backend called on the batch)."""

    name: str
    spec: StepSpec

    @classmethod
    def applies(cls, config: SynthConfig) -> bool:
        return True

    def __call__(self, jobs: list[Job]) -> list[Job]:
        start = time.perf_counter()
        self.run([job for job in jobs if job.ok])
        share = (time.perf_counter() - start) / max(1, len(jobs))
        for job in jobs:
            job.seconds[self.name] = job.seconds.get(self.name, 0.0) + share
        return jobs

    def run(self, jobs: list[Job]) -> None:
        """The step's work on ``jobs``, none of which has failed."""
        raise NotImplementedError


def each(jobs: Iterable[Job], work: Callable[[Job], T]) -> list[tuple[Job, T]]:
    """``work`` on each job, paired with its job; a job whose work raises a ``SampleError``
    fails with its reason and is left out."""
    out: list[tuple[Job, T]] = []
    for job in jobs:
        try:
            out.append((job, work(job)))
        except SampleError as err:
            job.fail(err.reason, err.detail)
        except MemoryError as err:
            job.fail(OUT_OF_MEMORY, _memory_detail(err))
    return out


OUT_OF_MEMORY = "out-of-memory"
"""The reason of a job whose own work (decoding its picture, editing it) ran out of memory:
the job fails and the batch and the shard go on."""


def _memory_detail(err: MemoryError) -> str:
    return one_line(f"MemoryError {err}".strip())


def model_outputs(
    call: Callable[[list[R]], Sequence[T]],
    requests: Sequence[tuple[Job, R]],
    model_detail: str = "",
) -> list[tuple[Job, T]]:
    """``call`` on the requests as one batch, each output paired with its job; when the batch
    raises a ``SampleError`` (one bad request) or a model error, each request alone, and a job
    whose request still fails fails with its reason (or ``model-error``, ``model_detail`` before
    the exception) and is left out. Every step that calls a backend on a batch goes through
    here."""
    if not requests:
        return []
    try:
        outputs = list(call([request for _, request in requests]))
    except (SampleError, *MODEL_ERRORS) as err:
        _raise_if_device_failure(err)
        if len(requests) == 1:  # the request alone failed: its job's reason, not a retry
            _fail(requests[0][0], err, model_detail)
            return []
        if is_out_of_memory(err):  # halve, the cache freed first
            free_device_cache()
            half = (len(requests) + 1) // 2
            first = model_outputs(call, requests[:half], model_detail)
            return first + model_outputs(call, requests[half:], model_detail)
    else:
        return list(zip([job for job, _ in requests], outputs, strict=True))
    out: list[tuple[Job, T]] = []
    for job, request in requests:
        try:
            out.append((job, call([request])[0]))
        except (SampleError, *MODEL_ERRORS) as err:
            _raise_if_device_failure(err)
            _fail(job, err, model_detail)
    return out


def _fail(job: Job, err: BaseException, model_detail: str) -> None:
    """Fail ``job`` for the error its request alone raised: a ``SampleError``'s reason,
    ``out-of-memory`` for a ``MemoryError``, else ``model-error``."""
    if isinstance(err, SampleError):
        job.fail(err.reason, err.detail)
    elif isinstance(err, MemoryError):
        job.fail(OUT_OF_MEMORY, _memory_detail(err))
    else:
        job.fail("model-error", f"{model_detail}{err!r}")


def _raise_if_device_failure(err: BaseException) -> None:
    if is_device_failure(err):
        lines = str(err).splitlines()
        said = next(line for line in lines if any(m in line for m in DEVICE_ERRORS)).strip()
        raise DeviceFailure(one_line(f"{device_name()}: {said}")) from err


def device_name() -> str:
    """The CUDA device this process uses (``cuda:N``, with ``CUDA_VISIBLE_DEVICES`` when set),
    else ``cpu``."""
    import os

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return "cpu"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible else ""
    return f"GPU cuda:{torch.cuda.current_device()}{where}"


class Decode(BatchStep):
    """Load each job's picture (RGB), checked against the annotation, in the frame of its boxes
    (:mod:`counterfactual.shards.frames`, the job's ``exif`` rule); an EXIF-tagged picture's
    orientation and frame go to its sample json (``exif_orientation``, ``exif_frame``)."""

    name = "decode"

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        return StepSpec(cls.name, makes=_fields("image"))

    def __init__(
        self, config: SynthConfig, backend: None = None, runtime: Runtime | None = None
    ) -> None:
        self.spec = self.declare(config)
        self.max_pixels = config.max_pixels

    def run(self, jobs: list[Job]) -> None:
        for job, image in each(jobs, self._load):
            job.image = image

    def _load(self, job: Job) -> np.ndarray:
        picture = load_record_picture(job.item.record, self.max_pixels, job.exif)
        if picture.orientation != 1:
            job.methods["exif"] = {
                "exif_orientation": picture.orientation,
                "exif_frame": picture.frame,
            }
        return picture.pixels


class Edit(BatchStep):
    """Erase each job's plan: mask from the plan, then the configured image backend. The
    original picture is dropped here unless ``Verify`` compares it with the edit or ``Encode``
    writes it (``--pairs``)."""

    name = "edit"

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        image, runtime = config.image, runtime or Runtime()
        resources = None
        model = image_model(image)
        if model is not None:
            resources = Resources(
                "Inpaint",
                model,
                "--inpaint-model",
                runtime.device,
                runtime.inpaint_batch_size,
                heavy=True,
                cost=_seconds(inpaint_cost(image)),
            )
        return StepSpec(
            cls.name,
            needs=_fields("image", "plan"),
            makes=_fields("mask", "edited"),
            drops=frozenset() if config.verify.enabled or config.pairs else _fields("image"),
            resources=resources,
        )

    def __init__(
        self,
        config: SynthConfig,
        editor: ImageEditor | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        runtime = runtime or Runtime()
        self.spec = self.declare(config, runtime)
        self.config = config
        self.editor = editor or make_editor(config.image, **runtime.part("image"))
        candidates = candidate_count(config.image)
        if candidates > 1 and not isinstance(self.editor, BestOfN):
            vocabulary = load_vocabulary(config.vocabulary)
            verifier = Verifier(config.verify, vocabulary, **runtime.part("verify"), **_TEXT_RULES)
            self.editor = BestOfN(self.editor, candidates, RemovalScorer(verifier))
        self.info = self.editor.describe()
        self.keep_original = "image" not in self.spec.drops  # Verify compares it with the edit

    def run(self, jobs: list[Job]) -> None:
        for job, (edited, choice) in model_outputs(self._edit, each(jobs, self._request)):
            if isinstance(edited, SampleError):  # the model's output was not a picture
                job.fail(edited.reason, edited.detail)
                continue
            job.edited = edited
            if job.mask is not None:  # the region repainted (grown with --inpaint-grow)
                job.mask = recorded_mask(self.config.image, job.mask)
            if not self.keep_original:
                job.image = None
            job.methods["image_method"] = self.info
            if choice is not None:
                job.methods["best_of_n"] = choice

    def _request(self, job: Job) -> EditRequest:
        if job.image is None:
            raise ValueError(f"job {job.item.key} reached Edit without a decoded image")
        if job.mask is None:  # else cut with the picture (crop_for_edit)
            h, w = job.image.shape[:2]
            job.mask = plan_mask(job.item.record, job.plan, h, w, self.config.mask)
        plan = job.plan
        return EditRequest(job.image, job.mask, plan.removed, plan.kept, job.item.seed)

    def _edit(
        self, requests: Sequence[EditRequest]
    ) -> list[tuple[np.ndarray | SampleError, dict[str, Any] | None]]:
        """Per request: the edited image (or the failure of its model output) and, for
        best-of-n, its pick."""
        images = self.editor(requests)
        return list(zip(images, self._choices(len(requests)), strict=True))

    def _choices(self, n: int) -> list[dict[str, Any] | None]:
        if isinstance(self.editor, BestOfN):
            return list(self.editor.choices)
        return [None] * n


@dataclass(frozen=True, slots=True)
class Cut:
    """What :func:`crop_for_edit` took from a job: the whole picture and mask, and where the
    crop lies in them."""

    image: np.ndarray
    mask: np.ndarray
    box: tuple[int, int, int, int]


def ships_crops(config: SynthConfig) -> bool:
    """Whether an ``Edit`` run elsewhere (a model actor) may get crops instead of pictures: the
    backend declares its region, and no best-of-n (whose scorer looks around the mask)."""
    image = config.image
    return (
        image.method == "inpaint" and image_model(image) is not None and candidate_count(image) == 1
    )


def crop_for_edit(jobs: Sequence[Job], config: SynthConfig) -> list[Cut | None]:
    """Before ``Edit`` runs on another process: each job's mask made here and its picture and
    mask cut to the backend's region (:func:`counterfactual.image.edit_region`), so only the
    crop travels; per job what :func:`paste_edit` needs (``None``: sent as it was, e.g. a failed
    job or one whose mask cannot be made, which ``Edit`` fails with its reason)."""
    out: list[Cut | None] = []
    for job in jobs:
        cut = None
        if job.ok and job.image is not None and job.mask is None and job.item.plan is not None:
            h, w = job.image.shape[:2]
            try:
                mask = plan_mask(job.item.record, job.item.plan, h, w, config.mask)
            except SampleError:
                mask = None
            box = None if mask is None else edit_region(config.image, mask)
            if mask is not None and box is not None:
                x0, y0, x1, y1 = box
                cut = Cut(job.image, mask, box)
                job.image = np.ascontiguousarray(job.image[y0:y1, x0:x1])
                job.mask = np.ascontiguousarray(mask[y0:y1, x0:x1])
        out.append(cut)
    return out


def paste_edit(jobs: Sequence[Job], cuts: Sequence[Cut | None]) -> None:
    """After ``Edit`` came back (the same jobs, in order): each cut job's edited crop pasted
    into a copy of its whole picture, its whole mask back (with the crop's mask as ``Edit``
    recorded it: grown with ``--inpaint-grow``), and its picture back if ``Edit`` kept it (for
    ``Verify``)."""
    for job, cut in zip(jobs, cuts, strict=True):
        if cut is None or not job.ok or job.edited is None:
            continue
        x0, y0, x1, y1 = cut.box
        edited = cut.image.copy()
        edited[y0:y1, x0:x1] = job.edited
        mask = cut.mask
        if job.mask is not None and not np.array_equal(job.mask, mask[y0:y1, x0:x1]):
            mask = mask.copy()  # Edit recorded the grown region (--inpaint-grow)
            mask[y0:y1, x0:x1] = job.mask
        job.edited, job.mask = edited, mask
        if job.image is not None:
            job.image = cut.image


class Rewrite(BatchStep):
    """Write each job's new caption. Captioners read the edited picture, so they come after
    ``Edit``; the other methods only read the original caption and may come first."""

    name = "rewrite"

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        text, runtime = config.text, runtime or Runtime()
        needs = _fields("plan", "edited") if REWRITERS[text.method].reads_image else _fields("plan")
        model = text_model(text)
        if model is None:
            return StepSpec(cls.name, needs=needs, makes=_fields("caption"))
        resources = Resources(
            "Caption",
            model,
            "--captioner-model",
            runtime.device,
            runtime.text_batch_size,
            cost=costs.CAPTION.seconds,
        )
        return StepSpec(cls.name, needs=needs, makes=_fields("caption"), resources=resources)

    def __init__(
        self,
        config: SynthConfig,
        rewriter: TextRewriter | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        runtime = runtime or Runtime()
        self.spec = self.declare(config, runtime)
        self.needs_image = "edited" in self.spec.needs
        self.rewriter = rewriter or make_rewriter(
            config.text, config.vocabulary, **runtime.part("text")
        )
        self.info = self.rewriter.describe()
        self.skip_unchanged = config.text.skip_unchanged
        self.check = (
            MentionCheck(load_vocabulary(config.vocabulary), config.text.spacy_model)
            if config.text.method in REMOVING_METHODS
            else None
        )

    def run(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if not self._unmatched(job)]
        results = model_outputs(self.rewriter, [(job, self._request(job)) for job in jobs])
        for (job, result), named in zip(results, self._still_named(results), strict=True):
            if result.text is None:
                job.fail(result.reason)
            elif self.skip_unchanged and not result.removed_phrases:
                job.fail(CAPTION_UNCHANGED, "the caption mentions no removed class", "skipped")
            elif named:  # a wrong training pair: never written silently
                job.fail(CAPTION_STILL_NAMES, f"names {', '.join(named)}: {one_line(result.text)}")
            else:
                job.caption = result
                job.methods["text_method"] = self.info

    def _unmatched(self, job: Job) -> bool:
        """Fail ``job`` as ``class-not-in-vocabulary`` when its caption would be matched by
        words (no annotated phrases) that the vocabulary lacks for a removed class: the
        rewrite would keep the caption and the check would not see the class named."""
        if self.check is None or job.item.caption.phrases is not None:
            return False
        lacking = self.check.vocabulary.lacking(job.plan.removed)
        if lacking:
            job.fail(
                CLASS_NOT_IN_VOCABULARY,
                f"no words for {', '.join(lacking)} in the vocabulary (--vocabulary FILE)",
            )
        return bool(lacking)

    def _request(self, job: Job) -> RewriteRequest:
        if self.needs_image and job.edited is None:
            raise ValueError(f"job {job.item.key} reached the captioner without an image")
        it, plan = job.item, job.plan
        return RewriteRequest(
            caption=it.caption.text,
            removed=plan.removed,
            kept=plan.kept,
            phrases=it.caption.phrases,
            image=job.edited,
            seed=it.seed,
        )

    def _still_named(self, results: list[tuple[Job, RewriteResult]]) -> list[list[str]]:
        """The removed classes each new caption still names (:class:`MentionCheck`)."""
        if self.check is None:
            return [[] for _ in results]
        return self.check([r.text for _, r in results], [job.plan.removed for job, _ in results])


class Detect(BatchStep):
    """Find each job's objects with the open-vocabulary detector (:mod:`counterfactual.method.detect`),
    asked for the classes its caption mentions (or the vocabulary, per ``DetectConfig.queries``).
    The detections become the record's objects, in the pixels of the decoded picture, which
    also becomes the record's size."""

    name = "detect"

    @classmethod
    def applies(cls, config: SynthConfig) -> bool:
        return config.detect is not None

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        if config.detect is None:
            raise ValueError("the detect step needs SynthConfig.detect")
        runtime = runtime or Runtime()
        resources = Resources(
            "Detect",
            config.detect.model,
            "--detector-model",
            runtime.device,
            runtime.detect_batch_size,
            cost=costs.DETECT.seconds,
        )
        return StepSpec(
            cls.name, needs=_fields("image"), makes=_fields("objects"), resources=resources
        )

    def __init__(
        self,
        config: SynthConfig,
        detector: Callable[..., list[list[Detection]]] | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        runtime = runtime or Runtime()
        self.spec = self.declare(config, runtime)
        assert config.detect is not None  # declare refused it
        self.detector = detector or Detector(
            config.detect, load_vocabulary(config.vocabulary), **runtime.part("detect")
        )
        describe = getattr(self.detector, "describe", None)
        self.info = describe() if describe is not None else {"model": config.detect.model}

    def run(self, jobs: list[Job]) -> None:
        requests = [(job, self._request(job)) for job in jobs]
        for job, out in model_outputs(self._detect, requests, model_detail="detect: "):
            assert job.image is not None
            h, w = job.image.shape[:2]
            record = replace(job.item.record, objects=to_objects(out), width=w, height=h)
            job.item = replace(job.item, record=record)
            job.methods["detector"] = self.info

    def _request(self, job: Job) -> tuple[np.ndarray, str]:
        if job.image is None:
            raise ValueError(f"job {job.item.key} reached Detect without a decoded image")
        return job.image, job.item.caption.text

    def _detect(self, requests: Sequence[tuple[np.ndarray, str]]) -> list[list[Detection]]:
        return self.detector([r[0] for r in requests], [r[1] for r in requests])


class Select(BatchStep):
    """Apply the alpha rules and the policy to each job's detected objects: the job gets its
    plan, or is skipped with the selection's reason. With ``TextConfig.skip_unchanged`` only
    targets the caption mentions may be drawn (caption-aware selection: on a corpus the caption
    is the only text, so any other plan would pair an edit with an unchanged caption); an image
    with valid plans but none mentioned is skipped with ``caption-unchanged``."""

    name = "select"

    @classmethod
    def applies(cls, config: SynthConfig) -> bool:
        return config.detect is not None

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        return StepSpec(cls.name, needs=_fields("objects"), makes=_fields("plan"))

    def __init__(
        self, config: SynthConfig, backend: None = None, runtime: Runtime | None = None
    ) -> None:
        self.spec = self.declare(config)
        self.config, self.seed = config.selection, config.seed
        self.vocabulary = None
        if config.text.skip_unchanged:
            self.vocabulary = load_vocabulary(config.vocabulary)

    def run(self, jobs: list[Job]) -> None:
        todo = [job for job in jobs if job.item.plan is None]
        targets = None
        if self.vocabulary is not None:
            targets = [self.vocabulary.mentioned(job.item.caption.text) for job in todo]
        records = [job.item.record for job in todo]
        for job, chosen in zip(
            todo, select_many(records, self.config, targets=targets, seed=self.seed), strict=True
        ):
            if not chosen.plans:
                detail = ""
                if chosen.reason == CAPTION_UNCHANGED:
                    detail = f"the caption names no valid target ({', '.join(chosen.not_drawn)})"
                job.fail(chosen.reason, detail, "skipped")
                continue
            job.item = replace(job.item, plan=chosen.plans[0])
            job.methods["not_drawn"] = list(chosen.not_drawn)


class Verify(BatchStep):
    """Check each job's counterfactual (:mod:`counterfactual.method.verify`): the removed classes are no
    longer recognised on their boxes, the kept ones still are, the new caption names no removed
    class. ``record`` mode stores the result in the sample's json under ``verify``; ``filter``
    also fails a job that does not pass, with its first failed check (``verify-removal``,
    ``verify-retention``, ``verify-text``) as reason. With verification off it passes jobs on."""

    name = "verify"

    @classmethod
    def applies(cls, config: SynthConfig) -> bool:
        return config.verify.enabled

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        verify, runtime = config.verify, runtime or Runtime()
        if not verify.enabled:
            return StepSpec(cls.name)
        resources = Resources(
            "Verify",
            verify.model,
            "--verify-model",
            runtime.device,
            runtime.verify_batch_size,
            cost=costs.VERIFY.seconds,
        )
        return StepSpec(
            cls.name,
            needs=_fields("image", "edited", "caption", "plan"),
            makes=_fields("verify"),
            drops=frozenset() if config.pairs else _fields("image"),
            resources=resources,
        )

    def __init__(
        self,
        config: SynthConfig,
        verifier: Verifier | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        runtime = runtime or Runtime()
        self.spec = self.declare(config, runtime)
        self.config = config.verify
        self.text_method = config.text.method
        self.verifier: Verifier | None = None
        if self.config.enabled:
            self.verifier = verifier or Verifier(
                self.config,
                load_vocabulary(config.vocabulary),
                **runtime.part("verify"),
                **_TEXT_RULES,
            )

    def __call__(self, jobs: list[Job]) -> list[Job]:
        return jobs if self.verifier is None else super().__call__(jobs)

    def run(self, jobs: list[Job]) -> None:
        assert self.verifier is not None  # __call__ passes jobs on without one
        requests = [(job, self._request(job)) for job in jobs]
        for job, out in model_outputs(self.verifier, requests, model_detail="verify: "):
            if "image" in self.spec.drops:
                job.image = None
            job.verify = out
            if self.config.mode == "filter" and not out.passed:
                job.fail(out.failed[0], out.detail())

    def _request(self, job: Job) -> VerifyRequest | PreparedVerify:
        if job.verify_input is not None:  # cropped and preprocessed by the shard worker
            prepared, job.verify_input = job.verify_input, None
            return prepared
        return verify_request(job, self.text_method)


VERIFY_HEADROOM = 2.0
"""How much more verify capacity than the inpainter's rate :func:`verify_gpu_share` asks."""


def verify_gpu_share(
    verify_seconds: float, inpaint_seconds: float, headroom: float = VERIFY_HEADROOM
) -> float:
    """GPU share the ``Verify`` actors need per GPU of the inpainter so verification is not
    the limit: ``headroom`` times verify's measured seconds per item over the inpainter's
    (both on one device, as ``make bench``'s ``verify-cost`` section measures them), at most 1.
    With the crops prepared in the shard workers (:func:`prepare_for_verify`) an actor's own
    CPU only normalises on the device, so one CPU per actor is enough at any share. E.g. verify
    at 0.1 of LaMa's cost per item, on 8 GPUs: ``8 * verify_gpu_share(0.1, 1) = 1.6`` GPUs of
    verify actors (e.g. 4 actors of 0.4, or 0.2 on each GPU beside the inpainter)."""
    for name, value in (("verify_seconds", verify_seconds), ("inpaint_seconds", inpaint_seconds)):
        if not value > 0:
            raise ValueError(f"{name} must be > 0 seconds per item, got {value}")
    if not headroom >= 1:
        raise ValueError(f"headroom must be >= 1, got {headroom}")
    return min(1.0, headroom * verify_seconds / inpaint_seconds)


def verify_request(job: Job, text_method: str) -> VerifyRequest:
    """The :class:`VerifyRequest` of a job that has both pictures and its new caption."""
    if job.image is None or job.edited is None or job.caption is None:
        raise ValueError(f"job {job.item.key} reached Verify without both images and caption")
    record, plan = job.item.record, job.plan
    h, w = job.edited.shape[:2]
    return VerifyRequest(
        original=job.image,
        edited=job.edited,
        removed_boxes=class_boxes(record, plan.removed, h, w),
        kept_boxes=class_boxes(record, plan.kept, h, w),
        removed=plan.removed,
        kept=plan.kept,
        caption=job.caption.text,
        text_method=text_method,
    )


@dataclass(frozen=True, slots=True)
class Held:
    """The pictures :func:`prepare_for_verify` kept back in the shard worker."""

    image: np.ndarray
    edited: np.ndarray
    mask: np.ndarray | None


def prepare_for_verify(
    jobs: Sequence[Job], config: SynthConfig, prep: Callable[[list[Any]], np.ndarray]
) -> list[Held | None]:
    """Before ``Verify`` runs on a model actor: each job's crops cut and preprocessed here by
    ``prep`` (the verifier's :meth:`~counterfactual.method.verify.Verifier.pixel_prep`) into
    ``job.verify_input``, and its pictures and mask kept back, so only the model-size crops travel and
    the actor's CPU does no resizing. Per job what :func:`restore_after_verify` needs
    (``None``: sent as it was, e.g. a failed job or one whose pictures are bad, which
    ``Verify`` fails with its reason)."""
    out: list[Held | None] = []
    for job in jobs:
        held = None
        if job.ok and job.image is not None and job.edited is not None and job.caption is not None:
            try:
                job.verify_input = prepare_verify(
                    verify_request(job, config.text.method), config.verify, prep
                )
            except ValueError:
                job.verify_input = None
            if job.verify_input is not None:
                held = Held(job.image, job.edited, job.mask)
                job.image = job.edited = job.mask = None
        out.append(held)
    return out


def restore_after_verify(jobs: Sequence[Job], held: Sequence[Held | None], pairs: bool) -> None:
    """After ``Verify`` came back (the same jobs, in order): each prepared job that still
    stands gets its edited picture and mask back, and its original when ``--pairs`` writes
    it."""
    for job, kept in zip(jobs, held, strict=True):
        job.verify_input = None
        if kept is None or not job.ok:
            continue
        job.edited, job.mask = kept.edited, kept.mask
        job.image = kept.image if pairs else None


class Encode(BatchStep):
    """Pack each finished job into a shard sample (JPEG, caption, metadata) and drop its
    arrays, so only bytes travel to the writer."""

    name = "encode"

    @classmethod
    def declare(cls, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec:
        needs = _fields("plan", "mask", "edited", "caption")
        return StepSpec(
            cls.name,
            needs=needs | _fields("image") if config.pairs else needs,
            makes=_fields("sample"),
            drops=_fields("image", "mask", "edited"),
        )

    def __init__(
        self, config: SynthConfig, backend: None = None, runtime: Runtime | None = None
    ) -> None:
        self.spec = self.declare(config)
        self.quality = config.jpeg_quality
        self.seed = config.seed
        self.mask = config.mask if config.pairs else None

    def run(self, jobs: list[Job]) -> None:
        for job, (jpg, extra) in each(jobs, self._encode):
            assert job.caption is not None  # _encode checked it
            meta = sample_meta(job, self.seed, self.mask)
            job.sample = Sample(job.item.key, jpg, job.caption.text or "", meta, extra)
            job.image = job.mask = job.edited = None

    def _encode(self, job: Job) -> tuple[bytes, tuple[tuple[str, bytes], ...]]:
        """The edited picture as JPEG and, with ``--pairs``, the original and mask."""
        if job.edited is None or job.caption is None:
            raise ValueError(f"job {job.item.key} reached Encode unfinished")
        return encode_jpeg(job.edited, self.quality), self._pair(job)

    def _pair(self, job: Job) -> tuple[tuple[str, bytes], ...]:
        """``--pairs``: the original picture and the mask as shard members, else none."""
        if self.mask is None:
            return ()
        if job.image is None or job.mask is None:
            raise ValueError(f"job {job.item.key} reached Encode without its original and mask")
        return (
            ("mask.png", encode_png(job.mask)),
            ("orig.jpg", encode_jpeg(job.image, self.quality)),
        )


class StepType(Protocol):
    """A step class: whether it runs under a config, what it declares, and building it
    (``backend``: a model object to use instead of the one the config names)."""

    name: str

    def applies(self, config: SynthConfig) -> bool: ...

    def declare(self, config: SynthConfig, runtime: Runtime | None = None) -> StepSpec: ...

    def __call__(
        self, config: SynthConfig, backend: Any = None, runtime: Runtime | None = None
    ) -> Step: ...


STEPS: tuple[StepType, ...] = (Rewrite, Decode, Detect, Select, Edit, Verify, Encode)
"""Every step, in the order a run prefers: each runs as early as the fields it needs allow
(:func:`step_order`), so a rewriter that needs no picture runs first and the CPU steps after
it go from file to JPEG in one place, without shipping pixels around."""
STEP_CLASSES: dict[str, StepType] = {cls.name: cls for cls in STEPS}
