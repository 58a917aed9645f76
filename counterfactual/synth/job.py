"""One work item between the steps of a run, and what it leaves behind.

A :class:`Job` carries one item on its way to a shard: the record and plan it started from, the
pixels and captions the steps make for it (:data:`JOB_FIELDS`), and its failure, if any, as a
:class:`Status` row. A job that fails keeps its place in its batch and later steps pass it
through, so every item reaches the writer exactly once, as a :class:`Done`. :func:`sample_meta`
is the json a finished job leaves in its shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from counterfactual._version import __version__
from counterfactual.method.masks import MaskConfig
from counterfactual.method.selection import RemovalPlan
from counterfactual.method.verify import PreparedVerify, VerifyResult
from counterfactual.records import Status
from counterfactual.shards.frames import DEFAULT_RULE, FrameRule
from counterfactual.shards.samples import (
    BestOfNMeta,
    DetectedObject,
    MaskMeta,
    SampleMeta,
)
from counterfactual.shards.shards import Sample
from counterfactual.synth.plan import SynthConfig, WorkItem
from counterfactual.text import RewriteResult


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
    ``image`` (the original) is dropped by ``Edit``, or by ``Verify`` when verification is on,
    or by ``Encode`` with ``--pairs`` (which writes it as ``orig.jpg``).
    ``verify`` is the :class:`VerifyResult` once verified. ``exif``: the run's frame of the boxes
    on EXIF-tagged pictures whose size cannot tell it (``Decode`` reads it)."""

    shard: int
    index: int
    item: WorkItem
    image: np.ndarray | None = None
    mask: np.ndarray | None = None
    edited: np.ndarray | None = None
    caption: RewriteResult | None = None
    verify: VerifyResult | None = None
    methods: dict[str, Any] = field(default_factory=dict)
    sample: Sample | None = None
    failure: Status | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    exif: FrameRule = DEFAULT_RULE
    verify_input: PreparedVerify | None = None
    """Verify's crops, preprocessed in the shard worker (:func:`~counterfactual.synth.steps.
    prepare_for_verify`) when the pictures stay there; ``None``: ``Verify`` crops them."""

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
            self.target,
            self.url,
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
        return Status(rec.image_id, "written", None, "", self.item.key, self.target, self.url)

    @property
    def url(self) -> str | None:
        """The url the picture was downloaded from, when its downloader recorded one."""
        origin = self.item.record.origin
        return origin.url if origin is not None else None

    @property
    def target(self) -> str | None:
        """The removal target, once planned (``None`` before ``Select`` on detected boxes)."""
        return None if self.item.plan is None else self.item.plan.target

    @property
    def plan(self) -> RemovalPlan:
        """The item's plan; a step that needs one must not run before ``Select``."""
        if self.item.plan is None:
            raise ValueError(f"job {self.item.key} has no plan yet (Select runs after Detect)")
        return self.item.plan


JOB_FIELDS = ("image", "objects", "plan", "mask", "edited", "caption", "verify", "sample")
"""What a step may need from a job or make for it: the :class:`Job` attributes of those names,
``objects`` the record's boxes and ``plan`` the item's :class:`RemovalPlan`."""
PLANNED = frozenset({"objects", "plan"})
"""What a job holds when it starts from annotated boxes (:func:`counterfactual.synth.plan.plan`
made its plan); with detected boxes it starts with nothing (:func:`planned_fields`)."""


def planned_fields(config: SynthConfig) -> frozenset[str]:
    """The fields a run's jobs hold before the first step."""
    return frozenset() if config.detect is not None else PLANNED


def sample_meta(job: Job, seed: int, mask: MaskConfig | None = None) -> dict[str, Any]:
    """Everything needed to trace and reproduce a sample (SPEC 1.4): a
    :class:`~counterfactual.shards.samples.SampleMeta` as its json; ``mask`` (``--pairs``): how
    the mask was made, recorded as its ``mask``."""
    item, edited, caption = job.item, job.edited, job.caption
    if edited is None or caption is None or job.mask is None:
        raise ValueError(f"job {item.key} is not edited and rewritten")
    best_of_n = job.methods.get("best_of_n")
    return SampleMeta(
        key=item.key,
        dataset=item.record.dataset,
        split=item.record.split,
        image_id=item.record.image_id,
        file=item.record.file,
        source=item.record.source,
        origin=item.record.origin,
        width=int(edited.shape[1]),
        height=int(edited.shape[0]),
        caption_id=item.caption.caption_id,
        original_caption=item.caption.text,
        caption=caption.text,
        caption_cleaned=item.caption.cleaned,
        removed_phrases=tuple(caption.removed_phrases),
        plan=job.plan.row(),
        mask_boxes=job.plan.mask_boxes,
        **_detection_meta(job),
        mask_pixels=int(np.count_nonzero(job.mask)),
        image_method=job.methods.get("image_method"),
        best_of_n=None if best_of_n is None else BestOfNMeta.from_dict(best_of_n),
        text_method=job.methods.get("text_method"),
        seed=seed,
        sample_seed=item.seed,
        counterfactual_version=__version__,
        **job.methods.get("exif", {}),
        verify=None if job.verify is None else job.verify.meta(),
        mask=None if mask is None else _mask_meta(job, mask),
    ).to_dict()


def _mask_meta(job: Job, mask: MaskConfig) -> MaskMeta:
    record = job.item.record
    boxes = "detector" if "detector" in job.methods else "dataset"
    return MaskMeta(mask.source, mask.dilate, boxes, (record.width, record.height))


def _detection_meta(job: Job) -> dict[str, Any]:
    """With detected boxes, the :class:`SampleMeta` fields of the detection: the detector, every
    object it kept (with its score) and the valid targets the policy did not draw."""
    if "detector" not in job.methods:
        return {}
    objects = job.item.record.objects
    return {
        "detector": job.methods["detector"],
        "objects": tuple(DetectedObject(o.category, o.bbox, o.score) for o in objects),
        "not_drawn": tuple(job.methods.get("not_drawn", ())),
    }
