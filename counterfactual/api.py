"""One call for notebooks: erase a class from one picture and from its caption.

>>> result = counterfactual.edit(picture, [("dog", (10, 20, 200, 150)), ("person", ...)],
...                              "A man walks his dog on the beach.", remove="dog")
>>> result.image, result.mask, result.caption, result.plan.evidence

:func:`edit` runs the same parts a synthesis run does, on one picture: the alpha rules
(:mod:`counterfactual.method.selection`: ``remove=None`` lets them choose a target with the
seed, as a run does; a class name picks the target, which the rules must still allow), the
mask (:mod:`counterfactual.method.masks`), the eraser (:mod:`counterfactual.image`, by the
command line's names: ``image_method``, ``inpaint_backend``, ``image_options`` with the flat
keys a run records, e.g. ``{"model": ..., "steps": 20}``) and the caption rewrite
(:mod:`counterfactual.text`). The defaults need no weights: OpenCV's inpainting on CPU and
np-removal with the installed spaCy model. :class:`Editor` loads the backends once for many
pictures (a diffusion inpainter); :func:`edit` builds one per call.

Contracts: the picture is a PIL image (any mode, made 8-bit sRGB), an ``(H, W, 3)`` or
``(H, W)`` ``uint8`` array, or a file path (read EXIF-upright); boxes are ``xywh`` pixels of
that picture as given, each ``(label, (x, y, w, h))`` or a dict with ``label`` (or
``category``, ``class``), ``bbox`` (or ``box``) and optionally ``segmentation`` (COCO
polygons) and ``iscrowd``. The mask is 8-bit, 255 = removed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from counterfactual.image import ImageConfig, make_editor
from counterfactual.image.base import EditRequest
from counterfactual.imageio import DEFAULT_MAX_PIXELS, SampleError, load_rgb, rgb8
from counterfactual.method.masks import MaskConfig, plan_mask
from counterfactual.method.selection import RemovalPlan, SelectionConfig, candidates, select
from counterfactual.records import Caption, ImageRecord, ObjectAnnotation
from counterfactual.text import (
    CLASS_NOT_IN_VOCABULARY,
    REMOVING_METHODS,
    RewriteRequest,
    TextConfig,
    make_rewriter,
)

if TYPE_CHECKING:
    from PIL import Image

Box = tuple[str, Sequence[float]] | Mapping[str, Any]
"""One object: ``(label, (x, y, w, h))`` or a dict (see the module doc)."""
_LABELS = ("label", "category", "class")
_BOXES = ("bbox", "box")


class EditError(ValueError):
    """The picture cannot be edited as asked. ``reason``: the status reason a run would record
    (``fewer-than-two-classes``, ``nothing-kept``, ``keep-overlap``, ``too-large``, a decode or
    model output failure: the README's table), or ``unknown-class`` (``remove`` names a class
    no box has), ``not-one-plan`` (no single target removes every named class) or
    ``class-not-in-vocabulary`` (the caption vocabulary has no words for a removed class:
    pass ``vocabulary=`` a word-list file that lists it);
    ``candidates``: every target the alpha rules weighed, with its evidence."""

    def __init__(self, message: str, reason: str, candidates: Sequence[RemovalPlan] = ()) -> None:
        super().__init__(message)
        self.reason = reason
        self.candidates = tuple(candidates)


@dataclass(frozen=True, slots=True)
class EditResult:
    """One counterfactual: ``image`` the edited picture (RGB), ``mask`` what was erased (mode
    ``L``, 255 = removed), ``caption`` the new caption, ``plan`` the removal plan with its
    evidence (``plan.removed``, ``plan.kept``, each ratio and threshold); ``original`` the
    picture as edited (RGB), ``removed_phrases`` what the rewrite cut, ``still_named`` the
    removed classes the new caption still names (a run would fail it as
    ``caption-still-names``; empty for methods that keep the words)."""

    image: Image.Image
    mask: Image.Image
    caption: str
    plan: RemovalPlan
    original: Image.Image
    removed_phrases: tuple[str, ...] = ()
    still_named: tuple[str, ...] = ()

    @property
    def removed(self) -> tuple[str, ...]:
        return self.plan.removed

    @property
    def kept(self) -> tuple[str, ...]:
        return self.plan.kept


class Editor:
    """The backends of :func:`edit`, loaded once; call it per picture. Options as
    :func:`edit`'s (the command line's names)."""

    def __init__(
        self,
        *,
        image_method: str = "inpaint",
        inpaint_backend: str = "opencv",
        image_options: Mapping[str, Any] | None = None,
        text_method: str = "np-removal",
        repair: bool = True,
        spacy_model: str | None = None,
        vocabulary: str | None = None,
        selection: SelectionConfig | None = None,
        mask_source: str = "box",
        dilate: int = 0,
        seed: int = 0,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        flat = {"method": image_method, "backend": inpaint_backend, **(image_options or {})}
        self.image_config = ImageConfig.from_flat(flat)
        self.text_config = TextConfig(method=text_method, spacy_model=spacy_model, repair=repair)
        self.selection = selection or SelectionConfig()
        self.mask_config = MaskConfig(source=mask_source, dilate=dilate)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
        self.seed = seed
        self.vocabulary = vocabulary
        self.editor = make_editor(self.image_config, device=device, dtype=dtype)
        self.rewriter = make_rewriter(self.text_config, vocabulary, device=device, dtype=dtype)
        self.check = None
        if text_method in REMOVING_METHODS:
            from counterfactual.text.np_removal import MentionCheck
            from counterfactual.vocab import load_vocabulary

            self.check = MentionCheck(load_vocabulary(vocabulary), spacy_model)

    def __call__(
        self,
        image: Image.Image | np.ndarray | str | os.PathLike[str],
        boxes: Sequence[Box],
        caption: str,
        remove: str | Sequence[str] | None = None,
    ) -> EditResult:
        """The counterfactual of one picture (see :func:`edit`)."""
        if not isinstance(caption, str):
            raise ValueError(f"caption must be a string, got {caption!r}")
        try:
            pixels = _rgb(image)
        except SampleError as err:
            raise EditError(
                f"cannot read the picture: {err.reason}: {err.detail}", err.reason
            ) from err
        h, w = pixels.shape[:2]
        objects = tuple(_object(i, box) for i, box in enumerate(boxes))
        record = ImageRecord("image", "", w, h, objects, (Caption("0", caption),))
        plan = self._plan(record, remove)
        self._check_words(plan)
        try:
            mask = plan_mask(record, plan, h, w, self.mask_config)
            request = EditRequest(pixels, mask, plan.removed, plan.kept, self.seed)
            edited = self.editor([request])[0]
        except SampleError as err:
            raise EditError(f"the edit failed: {err.reason}: {err.detail}", err.reason) from err
        if isinstance(edited, SampleError):
            raise EditError(f"the edit failed: {edited.reason}: {edited.detail}", edited.reason)
        text = RewriteRequest(caption, plan.removed, plan.kept, image=edited, seed=self.seed)
        rewritten = self.rewriter([text])[0]
        if rewritten.text is None:
            reason = rewritten.reason or "rewrite-failed"
            raise EditError(f"no new caption: {reason}", reason)
        still = self.check([rewritten.text], [plan.removed])[0] if self.check else []
        from PIL import Image

        return EditResult(
            image=Image.fromarray(edited, "RGB"),
            mask=Image.fromarray(mask, "L"),
            caption=rewritten.text,
            plan=plan,
            original=Image.fromarray(pixels, "RGB"),
            removed_phrases=tuple(rewritten.removed_phrases),
            still_named=tuple(still),
        )

    def _check_words(self, plan: RemovalPlan) -> None:
        """:class:`EditError` (``class-not-in-vocabulary``) when the caption vocabulary has no
        words for a class the plan removes: the caption would come back unchanged, a wrong
        pair, and the check could not see the class named."""
        if self.check is None:
            return
        lacking = self.check.vocabulary.lacking(plan.removed)
        if lacking:
            from counterfactual.vocab import lacking_line

            what = "the class to remove" if len(lacking) == 1 else "the classes to remove"
            line = lacking_line(lacking, self.vocabulary, what, "vocabulary='FILE'")
            raise EditError(line, CLASS_NOT_IN_VOCABULARY, (plan,))

    def _plan(self, record: ImageRecord, remove: str | Sequence[str] | None) -> RemovalPlan:
        """The plan for ``remove`` (``None``: the rules' seeded draw), or :class:`EditError`."""
        weighed = candidates(record, self.selection)
        if remove is None:
            chosen = select(record, self.selection, seed=self.seed)
            if not chosen.plans:
                reason = chosen.reason or "no-valid-plan"
                raise EditError(f"no class can be removed: {reason}", reason, weighed.candidates)
            return chosen.plans[0]
        names = (remove,) if isinstance(remove, str) else tuple(remove)
        present = sorted({o.category for o in record.objects})
        unknown = [n for n in names if n not in present]
        if not names or unknown:
            raise EditError(
                f"cannot remove {', '.join(unknown) or 'nothing'}: the boxes' classes are "
                f"{', '.join(present) or 'none'}",
                "unknown-class",
                weighed.candidates,
            )
        if weighed.reason is not None and not weighed.candidates:
            raise EditError(f"no class can be removed: {weighed.reason}", weighed.reason)
        fits = [p for p in weighed.candidates if p.target in names and set(names) <= set(p.removed)]
        valid = [p for p in fits if p.valid]
        if valid:
            return valid[0]
        why = "; ".join(
            f"{p.target}: {p.rejected_by or 'removes only ' + ', '.join(p.removed)}"
            for p in weighed.candidates
            if p.target in names
        )
        reason = fits[0].rejected_by if fits else "not-one-plan"
        raise EditError(
            f"the alpha rules do not allow removing {', '.join(names)} "
            f"({why or 'no single target removes them all'})",
            reason or "not-one-plan",
            weighed.candidates,
        )


def edit(
    image: Image.Image | np.ndarray | str | os.PathLike[str],
    boxes: Sequence[Box],
    caption: str,
    remove: str | Sequence[str] | None = None,
    **options: Any,
) -> EditResult:
    """Erase ``remove`` (a class name, several that one plan removes together, or ``None``:
    the alpha rules choose with ``seed``) from ``image`` and from ``caption``.

    ``options`` are :class:`Editor`'s: ``image_method`` (``inpaint``, ``blur``, ``mean``,
    ``zero``), ``inpaint_backend`` (``opencv``, ``diffusers``, ``lama``), ``image_options``
    (flat keys such as ``model``, ``steps``), ``text_method`` (``np-removal``, ``prompt``,
    ``captioner``...), ``repair``, ``spacy_model``, ``vocabulary`` (the class word-list file
    the caption is matched with, one class a line: ``tripod, tripods, camera stand``; default
    COCO's 80 classes: a removed class it lacks is an :class:`EditError`, never a caption kept
    silently), ``selection`` (a
    :class:`SelectionConfig`: alphas), ``mask_source``, ``dilate``, ``seed``, ``device``,
    ``dtype``. :class:`EditError` (a ``ValueError``) when the rules allow no such removal,
    naming the rule and holding every candidate's evidence."""
    return Editor(**options)(image, boxes, caption, remove)


def _rgb(image: Any) -> np.ndarray:
    if isinstance(image, str | os.PathLike):
        return load_rgb(os.fspath(image), DEFAULT_MAX_PIXELS)
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or not (
            image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)
        ):
            raise ValueError(
                f"an image array must be (H, W, 3) or (H, W) uint8, got {image.dtype} {image.shape}"
            )
        rgb = np.stack([image] * 3, axis=-1) if image.ndim == 2 else image
        return np.ascontiguousarray(rgb)
    from PIL import Image

    if isinstance(image, Image.Image):
        return np.asarray(rgb8(image))
    raise ValueError(f"image must be a PIL image, a uint8 array or a path, got {type(image)}")


def _object(index: int, box: Any) -> ObjectAnnotation:
    """One box as an annotation; ``ValueError`` naming the box by its index."""
    segmentation, crowd = None, False
    if isinstance(box, Mapping):
        label = next((box[k] for k in _LABELS if k in box), None)
        bbox = next((box[k] for k in _BOXES if k in box), None)
        if box.get("segmentation"):
            segmentation = tuple(tuple(float(v) for v in p) for p in box["segmentation"])
        crowd = bool(box.get("iscrowd", False))
    elif isinstance(box, Sequence) and not isinstance(box, str) and len(box) == 2:
        label, bbox = box
    else:
        raise ValueError(f"box {index}: expected (label, (x, y, w, h)) or a dict, got {box!r}")
    if not isinstance(label, str) or not label:
        raise ValueError(f"box {index}: the label must be a class name, got {label!r}")
    try:
        x, y, w, h = (float(v) for v in bbox)  # type: ignore[union-attr]
    except (TypeError, ValueError) as err:
        raise ValueError(f"box {index} ({label}): expected x, y, w, h, got {bbox!r}") from err
    if not all(np.isfinite((x, y, w, h))) or w <= 0 or h <= 0:
        raise ValueError(f"box {index} ({label}): w and h must be > 0 and finite, got {bbox!r}")
    return ObjectAnnotation((x, y, w, h), label, crowd, segmentation)


__all__: Sequence[str] = ("Box", "EditError", "EditResult", "Editor", "edit")
