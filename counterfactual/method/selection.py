"""Which classes can be removed from an image: the alpha rules of Kim et al. (SPEC 1.1).

For an image with class set ``C`` and a candidate class ``r``:

1. ``B_r`` is the union of all boxes of ``r`` (crowd boxes included).
2. ``C_plus = {c != r : area(B_r ∩ B_c) / area(B_c) > alpha2}`` is removed with ``r``;
   ``R = {r} ∪ C_plus`` and ``K = C - R``, which must not be empty.
3. Keep rule: ``area(B_R ∩ B_k) / area(B_k) < alpha1`` for every kept ``k``.
4. Size rule: ``area(B_R) / (W * H) < alpha3``.

Areas are exact areas of unions (see :mod:`counterfactual.method.geometry`). Boxes are clipped to the
image first; an object whose clipped box has zero area cannot be seen, so it takes no part (its
class does not count towards ``C``) and is listed in ``ignored``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET, UnsetType

from counterfactual.boxtable import BoxTable
from counterfactual.draws import draw_index
from counterfactual.jsonrecord import Box, Number, Record, convert, unique, upgrade_keyed
from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.method.geometry import at_least, class_cells, class_overlaps, exceeds
from counterfactual.options import declare
from counterfactual.records import ImageRecord

POLICIES = ("uniform", "all", "spurious")
SPURIOUS_SMOOTHING = 1.0
"""PMI smoothing of the ``spurious`` policy (see :meth:`CooccurrenceStats.pmi`)."""

# Rejection reasons of a candidate class, and of an image with no valid plan.
NOTHING_KEPT = "nothing-kept"
KEEP_OVERLAP = "keep-overlap"
TOO_LARGE = "too-large"
FEWER_THAN_TWO_CLASSES = "fewer-than-two-classes"
NO_REMOVABLE_CLASS = "no-removable-class"
CAPTION_UNCHANGED = "caption-unchanged"
"""No valid plan removes a class the caption mentions, so none would change the caption."""


@dataclass(frozen=True, slots=True)
class SelectionConfig:
    alpha1: float = declare(
        0.4,
        help="keep rule: a kept class's box may lie less than this fraction inside the removed "
        "area, in (0, 1], at most alpha2 (default %(default)s)",
        kind="positive_fraction",
    )
    alpha2: float = declare(
        0.8,
        help="co-removal: a class whose box lies more than this fraction inside the target's "
        "is removed with it, in (0, 1] (default %(default)s)",
        kind="positive_fraction",
    )
    alpha3: float = declare(
        0.7,
        help="size rule: the removed area must be less than this fraction of the picture, in "
        "(0, 1) (default %(default)s)",
        kind="open_unit_interval",
    )
    policy: str = declare(
        "uniform",
        help="plans kept per image: uniform (one, seeded draw), all, or spurious (the target "
        "with the highest mean PMI with the kept classes over the dataset) "
        "(default: %(default)s)",
        choices=POLICIES,
    )
    """``uniform``: one valid plan per image, drawn with the seed; ``all``: every valid plan;
    ``spurious``: the valid plan whose target co-occurs most over-proportionally with its kept
    classes over the dataset (see :func:`select_many`), ties drawn with the seed. The seed is
    the run's (``SynthConfig.seed``), passed to :func:`select_many`."""

    def __post_init__(self) -> None:
        # alpha1 = 0 or alpha3 = 0 refuse every plan, alpha3 >= 1 switches the size rule off
        for name, low, high, text in (
            ("alpha1", 0.0, 1.0, "(0, 1]"),
            ("alpha2", 0.0, 1.0, "(0, 1]"),
            ("alpha3", 0.0, math.nextafter(1.0, 0.0), "(0, 1)"),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise ValueError(f"{name} must be a number in {text}, got {value!r}")
            if not low < value <= high:  # NaN fails too
                raise ValueError(f"{name} must be in {text}, got {value}")
        if self.alpha1 > self.alpha2:
            raise ValueError(f"alpha1 ({self.alpha1}) must not exceed alpha2 ({self.alpha2})")
        if self.policy not in POLICIES:
            raise ValueError(f"policy {self.policy!r} is not one of {POLICIES}")


@dataclass(frozen=True, slots=True)
class RemovalPlan:
    """One candidate class ``target`` of one image, valid or not, with its evidence.

    ``co_removal[c]`` = area(B_target ∩ B_c) / area(B_c), compared with ``alpha2``;
    ``keep_overlap[k]`` = area(B_R ∩ B_k) / area(B_k) for each kept ``k``, compared with
    ``alpha1``; ``removed_fraction`` = area(B_R) / (W * H), compared with ``alpha3``.
    ``mask_boxes`` are the removed boxes, ``xywh`` pixels, clipped to the image.
    ``rejected_by`` is ``None`` for a valid plan, else the rule that failed.
    """

    image_id: str
    target: str
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    co_removal: dict[str, float]
    keep_overlap: dict[str, float]
    removed_fraction: float
    mask_boxes: tuple[tuple[float, float, float, float], ...]
    alpha1: float
    alpha2: float
    alpha3: float
    rejected_by: str | None = None
    pmi: dict[str, float] | None = None
    """``spurious`` policy only: PMI(target, k) for each kept ``k``; the plan's score is their
    mean. ``None`` under the other policies (and then absent from :meth:`to_dict`)."""

    @property
    def kind(self) -> str:
        return "single" if len(self.removed) == 1 else "multi"

    @property
    def valid(self) -> bool:
        return self.rejected_by is None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, with each ratio next to the threshold it was compared with.

        Per-class evidence is a list of records with a fixed set of keys, one per class in
        the plan's class order (``co_removal``: ``class``, ``ratio``, ``alpha2``,
        ``co_removed``; ``keep_overlap``: ``class``, ``ratio``, ``alpha1``, ``ok``;
        ``pmi.with_kept``: ``class``, ``pmi``), never an object keyed by class name, so every
        sample's json has one schema (Arrow, Hugging Face ``datasets``). Older shards hold
        objects keyed by class name; :meth:`PlanMeta.from_dict` reads both.
        """
        return self.row().to_dict()

    def row(self) -> PlanMeta:
        """The plan as a sample's json holds it (:meth:`to_dict` as a struct)."""
        return _row(
            self.image_id,
            self.target,
            tuple(self.removed),
            tuple(self.kept),
            self.co_removal.items(),
            self.keep_overlap.items(),
            self.removed_fraction,
            tuple((x, y, w, h) for x, y, w, h in self.mask_boxes),
            (self.alpha1, self.alpha2, self.alpha3),
            self.rejected_by,
            self.pmi,
        )


# The JSON form of a plan (RemovalPlan.to_dict, a sample's json, what `select` writes), field
# order = key order.
class CoRemoval(Record, gc=False):
    """Another class's overlap with the target's boxes, compared with ``alpha2``."""

    name: str = msgspec.field(name="class")
    ratio: Number
    alpha2: Number
    co_removed: bool


class KeepOverlap(Record, gc=False):
    """A kept class's overlap with the removed boxes, compared with ``alpha1``."""

    name: str = msgspec.field(name="class")
    ratio: Number
    alpha1: Number
    ok: bool


class RemovedFraction(Record, gc=False):
    """The removed boxes' share of the picture, compared with ``alpha3``."""

    ratio: Number
    alpha3: Number
    ok: bool


class PMIWith(Record, gc=False):
    name: str = msgspec.field(name="class")
    pmi: Number


class PMIEvidence(Record, gc=False):
    """``spurious`` policy: the PMI of the target with each kept class and their aggregate."""

    with_kept: tuple[PMIWith, ...]
    score: Number
    aggregate: str
    smoothing: Number

    def __post_init__(self) -> None:
        unique(self.with_kept, "with_kept")


class Evidence(Record, gc=False):
    """Each ratio of a plan with its threshold (:meth:`RemovalPlan.to_dict`); a part the plan
    does not have is absent (``UNSET``: ``pmi`` outside the ``spurious`` policy)."""

    co_removal: tuple[CoRemoval, ...] | UnsetType = UNSET
    keep_overlap: tuple[KeepOverlap, ...] | UnsetType = UNSET
    removed_fraction: RemovedFraction | UnsetType = UNSET
    pmi: PMIEvidence | UnsetType = UNSET

    def __post_init__(self) -> None:
        for part in ("co_removal", "keep_overlap"):
            records = getattr(self, part)
            if records is not UNSET:
                unique(records, part)


class PlanMeta(Record, gc=False):
    """The removal plan as a sample's json and ``select`` hold it (:meth:`RemovalPlan.row`,
    :meth:`RemovalPlan.to_dict`): ``evidence`` holds each ratio with its threshold (and the PMI under the
    ``spurious`` policy); ``mask_boxes`` are the removed boxes (``xywh``, clipped to the
    picture). The per-class evidence is a list of records ``{"class": name, ...}``; the older
    layout (objects keyed by class name) is read by :meth:`from_dict` (and
    :meth:`counterfactual.shards.samples.SampleMeta.from_dict`). ``select``'s rows
    (:func:`select_rows`) hold lists where a decoded plan holds tuples, and ``image_id`` as the
    input file has it (an int there): the same json either way."""

    image_id: str
    target: str
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    kind: str
    valid: bool
    rejected_by: str | None
    evidence: Evidence
    mask_boxes: tuple[Box, ...]

    @classmethod
    def from_dict(cls, d: Any) -> PlanMeta:
        """A plan's json, in the current or the older layout."""
        return convert(upgrade_keyed(d, PLAN_KEYED), cls)

    def ratios(self, part: str) -> dict[str, float]:
        """``class -> ratio`` of ``co_removal`` or ``keep_overlap`` (``pmi`` for the PMI with
        each kept class), in the plan's class order; empty when absent."""
        ev = self.evidence
        if part == "pmi":
            return {} if ev.pmi is UNSET else {r.name: r.pmi for r in ev.pmi.with_kept}
        if part not in ("co_removal", "keep_overlap"):
            raise ValueError(f"evidence part {part!r} is not one of co_removal, keep_overlap, pmi")
        records = getattr(ev, part)
        return {} if records is UNSET else {r.name: r.ratio for r in records}


PLAN_KEYED = (
    ("evidence", "co_removal"),
    ("evidence", "keep_overlap"),
    ("evidence", "pmi", "with_kept"),
)
"""The plan's per-class parts that older shards hold as objects keyed by class name, by path
(:func:`~counterfactual.jsonrecord.upgrade_keyed`)."""


def _row(
    image_id: str,
    target: str,
    removed: tuple[str, ...],
    kept: tuple[str, ...],
    co_removal: Iterable[tuple[str, float]],
    keep_overlap: Iterable[tuple[str, float]],
    removed_fraction: float,
    mask_boxes: tuple[Box, ...],
    alphas: tuple[float, float, float],
    rejected_by: str | None,
    pmi: dict[str, float] | None,
) -> PlanMeta:
    alpha1, alpha2, alpha3 = alphas
    # The flags repeat the decisions, which compare exact areas (a ratio rounded to alpha
    # itself is decided on the exact fraction): valid plans and plans rejected by the size
    # rule passed the keep rule for every kept class.
    valid = rejected_by is None
    keep_ok = valid or rejected_by == TOO_LARGE
    fraction_ok = valid or (rejected_by != TOO_LARGE and removed_fraction < alpha3)
    evidence = Evidence(
        tuple(CoRemoval(c, r, alpha2, c in removed) for c, r in co_removal),
        tuple(KeepOverlap(k, r, alpha1, keep_ok or r < alpha1) for k, r in keep_overlap),
        RemovedFraction(removed_fraction, alpha3, fraction_ok),
        _pmi_evidence(pmi),
    )
    kind = _KINDS[len(removed) > 1]
    return PlanMeta(image_id, target, removed, kept, kind, valid, rejected_by, evidence, mask_boxes)


_KINDS = ("single", "multi")


def _pmi_evidence(pmi: dict[str, float] | None) -> PMIEvidence | UnsetType:
    if pmi is None:
        return UNSET
    with_kept = tuple(PMIWith(k, v) for k, v in pmi.items())
    return PMIEvidence(with_kept, spurious_score(pmi.values()), "mean", SPURIOUS_SMOOTHING)


@dataclass(frozen=True, slots=True)
class Selection:
    """Every candidate of one image. ``reason`` says why there is no valid plan, if none."""

    image_id: str
    candidates: tuple[RemovalPlan, ...]
    """Every candidate with its evidence (filled by :func:`candidates`, empty from ``select``)."""
    ignored: int = 0
    reason: str | None = None
    plans: tuple[RemovalPlan, ...] = field(default=())
    """The valid candidates the policy chose."""
    not_drawn: tuple[str, ...] = field(default=())
    """Target classes of the valid candidates the policy did not choose."""


@dataclass(frozen=True, slots=True)
class _Chunk:
    """The rules' arrays for images evaluated together (the same padded box count ``m``,
    at most ``k`` classes): row ``j`` is image ``images[j]`` of the table."""

    images: list[int]
    n_classes: list[int]
    n_boxes: list[int]
    classes: list[list[int]]  # class codes of each row, first-seen order (k entries, -1 pad)
    boxes: np.ndarray  # (n, m, 4) visible boxes, xyxy, clipped; padding boxes are empty
    group: np.ndarray  # (n, m) class slot of each box (k for padding)
    co_ratio: np.ndarray  # (n, k, k) [r, c] = area(B_r ∩ B_c) / area(B_c)
    removed: np.ndarray  # (n, k, k) [r, c]: c is removed when r is the target
    keep_ratio: np.ndarray  # (n, k, k) [r, k'] = area(B_R ∩ B_k') / area(B_k')
    fraction: np.ndarray  # (n, k) area(B_R) / (W * H)
    code: list[list[int]]  # index in _REJECTIONS of each candidate (k entries)


@dataclass(frozen=True, slots=True)
class _Evaluated:
    """Every candidate of every image of a table."""

    chunks: list[_Chunk]
    where: list[tuple[int, int] | None]
    """Per image, ``(chunk, row)``, or ``None`` when it has fewer than two visible classes."""
    ignored: list[int]
    """Per image, the objects whose clipped box has no area."""
    chunk_of: np.ndarray
    """Per image, its chunk (-1 for none), and ``row_of`` its row there: ``where`` as arrays."""
    row_of: np.ndarray


_REJECTIONS: tuple[str | None, ...] = (None, NOTHING_KEPT, KEEP_OVERLAP, TOO_LARGE)
# Cells per chunk of images evaluated together (bounds memory for images with many boxes).
_CHUNK_CELLS = 2_000_000
_DENSE_BOXES = 256
"""Images padded to at most this many boxes are evaluated on the dense cell grid, many at once
(``class_cells``: cells grow with the square of the boxes); more, one at a time by the sweep
(``class_overlaps``: memory linear in the boxes)."""


def _bucket(n: int) -> int:
    """Pad box counts to a few sizes so images with similar counts are evaluated together."""
    if n <= 8:
        return n
    step = 1 << max(0, n.bit_length() - 3)  # 4 sizes per doubling
    return -(-n // step) * step


def _ragged(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``counts[j]`` items from ``starts[j]`` on: ``(row, column, source index)``."""
    total = int(counts.sum())
    row = np.repeat(np.arange(len(counts)), counts)
    column = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return row, column, np.repeat(starts, counts) + column


def _evaluate(table: BoxTable, config: SelectionConfig) -> _Evaluated:
    """Evaluate every candidate of every image of ``table``, vectorised over images with
    similar box counts."""
    n_images = len(table)
    snapped = table.snapped()
    vis = np.flatnonzero(snapped.visible)
    owner, category = table.owner[vis], table.category[vis]
    # (image, class) groups of the visible boxes in first-seen order within each image
    key = owner * max(1, len(table.classes)) + category
    unique, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    group_owner, group_class = owner[first[order]], category[first[order]]
    n_classes = np.bincount(group_owner, minlength=n_images)
    group_start = np.cumsum(n_classes) - n_classes
    slot = np.empty(len(unique), dtype=np.intp)
    slot[order] = np.arange(len(unique)) - group_start[group_owner]
    box_slot = slot[inverse.reshape(-1)]
    n_boxes = np.bincount(owner, minlength=n_images)
    box_start = np.cumsum(n_boxes) - n_boxes
    ignored = (np.bincount(table.owner, minlength=n_images) - n_boxes).tolist()
    chunks: list[_Chunk] = []
    qualified = np.flatnonzero(n_classes >= 2)
    counts, back = np.unique(n_boxes[qualified], return_inverse=True)
    padded = np.array([_bucket(c) for c in counts.tolist()], dtype=np.intp)[back.reshape(-1)]
    # images of the same padded box count and class count together: no class padding
    shape = padded * (int(n_classes.max(initial=0)) + 1) + n_classes[qualified]
    order = np.argsort(shape, kind="stable")
    qualified, padded, shape = qualified[order], padded[order], shape[order]
    chunk_of = np.full(n_images, -1)
    row_of = np.zeros(n_images, dtype=np.intp)
    layout = _Layout(
        snapped.xyxy[vis],
        snapped.units[vis],
        snapped.bits,
        box_slot,
        box_start,
        n_boxes,
        group_class,
        group_start,
        n_classes,
    )
    bounds = [*np.unique(shape, return_index=True)[1].tolist(), len(shape)]
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        size = int(padded[lo])
        step = max(1, _CHUNK_CELLS // (size * (2 * size - 1) ** 2))
        for start in range(lo, hi, step):
            members = qualified[start : min(start + step, hi)]
            chunk_of[members] = len(chunks)
            row_of[members] = np.arange(len(members))
            chunks.append(_evaluate_chunk(table, layout, members, size, config))
    where: list[tuple[int, int] | None] = [
        None if c < 0 else (c, r) for c, r in zip(chunk_of.tolist(), row_of.tolist(), strict=True)
    ]
    return _Evaluated(chunks, where, ignored, chunk_of, row_of)


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where each image's visible boxes and classes are: ``boxes`` (xyxy pixels), ``units``
    (the same in snapping units, ``2**-bits[i]`` px) and ``slot`` (the class slot of each box)
    from ``box_start[i]``, ``n_boxes[i]`` of them; ``classes`` (class codes in first-seen
    order) from ``class_start[i]``, ``n_classes[i]`` of them."""

    boxes: np.ndarray
    units: np.ndarray
    bits: np.ndarray
    slot: np.ndarray
    box_start: np.ndarray
    n_boxes: np.ndarray
    classes: np.ndarray
    class_start: np.ndarray
    n_classes: np.ndarray


def _evaluate_chunk(
    table: BoxTable, layout: _Layout, images: np.ndarray, size: int, config: SelectionConfig
) -> _Chunk:
    n = len(images)
    n_classes = layout.n_classes[images]
    k_max = int(n_classes.max())
    n_boxes = layout.n_boxes[images]
    row, column, source = _ragged(layout.box_start[images], n_boxes)
    boxes = np.zeros((n, size, 4))
    boxes[row, column] = layout.boxes[source]
    units = np.zeros((n, size, 4))
    units[row, column] = layout.units[source]
    group = np.full((n, size), k_max)
    group[row, column] = layout.slot[source]
    row, column, source = _ragged(layout.class_start[images], n_classes)
    classes = np.full((n, k_max), -1)
    classes[row, column] = layout.classes[source]
    # The cell grid of each image (padding boxes are empty and cover no cell). Every area below
    # is an integer number of squared units, exact in float64 whatever the summation order, so
    # the dense grid (a few boxes, many images at once) and the sweep (many boxes, one image
    # in memory linear in its boxes) give the same bits.
    dense = size <= _DENSE_BOXES
    if dense:
        cover, cell_area = class_cells(units, group, k_max)
        weighted = cover * cell_area[:, None, :]
        inter = cover @ weighted.transpose(0, 2, 1)  # [r, c] = area(B_r ∩ B_c)
    else:
        inter = np.stack([class_overlaps(units[i], group[i], k_max).inter for i in range(n)])
    area = inter.diagonal(axis1=1, axis2=2)
    real = np.arange(k_max)[None, :] < n_classes[:, None]
    safe_area = np.where(real, area, 1.0)[:, None, :]  # a real class has a positive area
    co_ratio = inter / safe_area
    removed = exceeds(inter, safe_area, config.alpha2) & real[:, None, :]
    removed |= np.eye(k_max, dtype=bool)[None]
    bits = layout.bits[images]
    image_area = np.ldexp(table.width[images] * table.height[images], 2 * bits)  # in units
    # A single-class candidate removes B_r only: its keep overlaps are its co-removal overlaps
    # and its removed area is area(B_r). Only multi-class candidates need the union B_R.
    keep_inter = inter.copy()  # [r, k'] = area(B_R ∩ B_k')
    removed_area = area.copy()  # [r] = area(B_R)
    multi_i, multi_r = np.nonzero(removed.sum(axis=2) > 1)
    if len(multi_i) and not dense:
        for i in np.unique(multi_i).tolist():
            r = multi_r[multi_i == i]
            union = class_overlaps(units[i], group[i], k_max, unions=removed[i, r])
            keep_inter[i, r] = union.union_inter
            removed_area[i, r] = union.union_area
    elif len(multi_i):
        cover_r = np.minimum(
            np.einsum("pk,pkc->pc", removed[multi_i, multi_r].astype(np.float64), cover[multi_i]),
            1.0,
        )
        keep_inter[multi_i, multi_r] = np.einsum("pc,pkc->pk", cover_r, weighted[multi_i])
        removed_area[multi_i, multi_r] = (cover_r * cell_area[multi_i]).sum(axis=1)
    keep_ratio = keep_inter / safe_area
    fraction = removed_area / image_area[:, None]
    kept = ~removed & real[:, None, :]
    keep_fails = (kept & at_least(keep_inter, safe_area, config.alpha1)).any(axis=2)
    too_large = at_least(removed_area, image_area[:, None], config.alpha3)
    code = np.where(~kept.any(axis=2), 1, np.where(keep_fails, 2, np.where(too_large, 3, 0)))
    return _Chunk(
        images=images.tolist(),
        n_classes=n_classes.tolist(),
        n_boxes=n_boxes.tolist(),
        classes=classes.tolist(),
        boxes=boxes,
        group=group,
        co_ratio=co_ratio,
        removed=removed,
        keep_ratio=keep_ratio,
        fraction=fraction,
        code=code.tolist(),
    )


def _split(flat: list[Any], counts: np.ndarray) -> list[list[Any]]:
    """``flat`` cut into consecutive lists of ``counts[p]`` items."""
    ends = np.cumsum(counts).tolist()
    return [flat[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _rows(
    table: BoxTable,
    ev: _Evaluated,
    image: np.ndarray,
    target: np.ndarray,
    config: SelectionConfig,
    pmi: Sequence[dict[str, float] | None] | None = None,
    ids: Sequence[int | str] | None = None,
) -> list[PlanMeta]:
    """The :class:`PlanMeta` of candidates ``(image[p], target[p])``, in that order; ``pmi[p]``
    is pick ``p``'s PMI evidence, ``ids[image]`` the id to write (default: the table's). The
    rows of each chunk are made together: what every plan lists (removed and kept classes,
    evidence, removed boxes) is picked from the chunk's arrays as one flat list per field and
    cut into plans, so the only work per plan is a few slices and struct constructors."""
    out: list[Any] = [None] * len(image)
    ids = table.image_ids if ids is None else ids
    class_names = np.array([*table.classes, ""], dtype=object)  # code -1 (padding): ""
    alpha1, alpha2, alpha3 = config.alpha1, config.alpha2, config.alpha3
    chunk_of = ev.chunk_of[image]
    by_chunk = np.argsort(chunk_of, kind="stable")
    for positions in np.split(by_chunk, np.flatnonzero(np.diff(chunk_of[by_chunk])) + 1):
        if not len(positions):
            continue
        chunk = ev.chunks[chunk_of[positions[0]]]
        images, targets = image[positions], target[positions]
        at = ev.row_of[images]
        classes = np.asarray(chunk.classes)[at]
        names = class_names[classes]
        real = classes >= 0
        removed = chunk.removed[at, targets]
        other = np.arange(removed.shape[1]) != targets[:, None]
        code = np.asarray(chunk.code)[at, targets]
        # removed classes, the target first, then in class order
        first = np.argsort(other, axis=1, kind="stable")
        gone = np.take_along_axis(removed, first, axis=1)
        gone_names = _split(np.take_along_axis(names, first, axis=1)[gone].tolist(), gone.sum(1))
        kept = ~removed & real
        kept_names = names[kept].tolist()
        # evidence, each flag repeating its decision (see _row)
        co = other & real
        co_removal = map(
            CoRemoval,
            names[co].tolist(),
            chunk.co_ratio[at, targets][co].tolist(),
            repeat(alpha2),
            removed[co].tolist(),
        )
        keep_ratio = chunk.keep_ratio[at, targets]
        keep_ok = ((code == 0) | (code == 3))[:, None] | (keep_ratio < alpha1)
        keep_overlap = map(
            KeepOverlap,
            kept_names,
            keep_ratio[kept].tolist(),
            repeat(alpha1),
            keep_ok[kept].tolist(),
        )
        fraction = chunk.fraction[at, targets]
        fraction_ok = (code == 0) | ((code != 3) & (fraction < alpha3))
        evidence = map(
            Evidence,
            _split(list(co_removal), co.sum(1)),
            _split(list(keep_overlap), kept.sum(1)),
            map(RemovedFraction, fraction.tolist(), repeat(alpha3), fraction_ok.tolist()),
            [UNSET if pmi is None else _pmi_evidence(pmi[p]) for p in positions.tolist()],
        )
        # the removed boxes of every pick, xywh, one after the other
        padded = np.concatenate([removed, np.zeros((len(at), 1), bool)], axis=1)
        erased = np.take_along_axis(padded, chunk.group[at], axis=1)  # is each box's class removed
        xywh = chunk.boxes[at][erased]
        xywh[:, 2:] -= xywh[:, :2]
        rows = map(
            PlanMeta,
            map(ids.__getitem__, images.tolist()),
            names[np.arange(len(at)), targets].tolist(),
            gone_names,
            _split(kept_names, kept.sum(1)),
            map(_KINDS.__getitem__, (gone.sum(1) > 1).tolist()),
            (code == 0).tolist(),
            map(_REJECTIONS.__getitem__, code.tolist()),
            evidence,
            _split(xywh.tolist(), erased.sum(1)),
        )
        for p, row in zip(positions.tolist(), rows, strict=True):
            out[p] = row
    return out


def _plans(
    table: BoxTable,
    ev: _Evaluated,
    picks: Sequence[tuple[int, int]],
    config: SelectionConfig,
    pmi: Sequence[dict[str, float] | None] | None = None,
) -> list[RemovalPlan]:
    """The :class:`RemovalPlan` of candidates ``(image, r)``, in the order given (from their
    :func:`_rows`)."""
    image, target = np.array(picks, dtype=np.intp).reshape(-1, 2).T
    out = []
    for (i, _), row, evidence in zip(
        picks, _rows(table, ev, image, target, config, pmi), pmi or repeat(None), strict=False
    ):
        out.append(
            RemovalPlan(
                image_id=table.image_ids[i],
                target=row.target,
                removed=tuple(row.removed),
                kept=tuple(row.kept),
                co_removal={e.name: e.ratio for e in row.evidence.co_removal},
                keep_overlap={e.name: e.ratio for e in row.evidence.keep_overlap},
                removed_fraction=row.evidence.removed_fraction.ratio,
                mask_boxes=tuple(map(tuple, row.mask_boxes)),
                alpha1=config.alpha1,
                alpha2=config.alpha2,
                alpha3=config.alpha3,
                rejected_by=row.rejected_by,
                pmi=evidence,
            )
        )
    return out


def candidates_table(table: BoxTable, config: SelectionConfig) -> list[Selection]:
    """Evaluate every class of each image of ``table`` as the removal target (no policy
    applied)."""
    ev = _evaluate(table, config)
    picks = [
        (i, r)
        for i, place in enumerate(ev.where)
        if place is not None
        for r in range(ev.chunks[place[0]].n_classes[place[1]])
    ]
    plans = iter(_plans(table, ev, picks, config))
    out = []
    for i, place in enumerate(ev.where):
        ident = table.image_ids[i]
        if place is None:
            out.append(Selection(ident, (), ev.ignored[i], FEWER_THAN_TWO_CLASSES))
        else:
            k = ev.chunks[place[0]].n_classes[place[1]]
            out.append(Selection(ident, tuple(next(plans) for _ in range(k)), ev.ignored[i]))
    return out


def candidates_many(records: Sequence[ImageRecord], config: SelectionConfig) -> list[Selection]:
    """Evaluate every class of each record as the removal target (no policy applied), the
    records together."""
    return candidates_table(BoxTable.from_records(records), config)


def candidates(record: ImageRecord, config: SelectionConfig) -> Selection:
    """Evaluate every class of ``record`` as the removal target (no policy applied)."""
    return candidates_many([record], config)[0]


def spurious_score(pmis: Iterable[float]) -> float:
    """The ``spurious`` policy's score of a plan: the mean PMI of its target with each kept
    class (``-inf`` when there are none, which a valid plan never has)."""
    values = list(pmis)
    return math.fsum(values) / len(values) if values else -math.inf


class _PMILookup:
    """PMI of two class names from a :class:`CooccurrenceStats`; 0 (independence) for a class
    the counts never saw, which is also what smoothing gives a pair with no counts."""

    def __init__(self, stats: CooccurrenceStats) -> None:
        self.matrix = stats.pmi(SPURIOUS_SMOOTHING).tolist()
        self.index = stats.index

    def __call__(self, a: str, b: str) -> float:
        i, j = self.index.get(a), self.index.get(b)
        return 0.0 if i is None or j is None else self.matrix[i][j]


def _spurious_pick(
    image_id: str,
    names: list[str],
    removed: list[list[bool]],
    valid: list[int],
    pmi: _PMILookup,
    seed: int,
) -> tuple[int, dict[str, float]]:
    """The valid target with the highest score, a seeded draw among equal scores
    (``removed[r]``: the classes candidate ``r`` removes)."""
    evidence, scores = [], []
    for r in valid:
        kept = [c for i, c in enumerate(names) if not removed[r][i]]
        values = {k: pmi(names[r], k) for k in kept}
        evidence.append(values)
        scores.append(spurious_score(values.values()))
    best = max(scores)
    tol = 1e-12 * max(1.0, abs(best)) if math.isfinite(best) else 0.0
    ties = [n for n, score in enumerate(scores) if score >= best - tol]
    n = ties[draw_index(seed, image_id, len(ties))] if len(ties) > 1 else ties[0]
    return valid[n], evidence[n]


def select_table(
    table: BoxTable,
    config: SelectionConfig,
    stats: CooccurrenceStats | None = None,
    targets: Sequence[Collection[str] | None] | None = None,
    seed: int = 0,
) -> list[Selection]:
    """:func:`select_many` on the images of a :class:`BoxTable` (one selection per image, in
    table order)."""
    ev = _evaluate(table, config)
    done, chosen = _choose(table, ev, config, stats, targets, seed)
    picks = [(i, r) for i, rs, _, _ in chosen for r in rs]
    evidence = [pmi for _, rs, _, pmi in chosen for _ in rs]
    plans = iter(_plans(table, ev, picks, config, evidence))
    for i, rs, others, _ in chosen:
        mine = tuple(next(plans) for _ in rs)
        done[i] = Selection(table.image_ids[i], (), ev.ignored[i], None, mine, others)
    return done  # type: ignore[return-value]


def select_rows(
    table: BoxTable,
    config: SelectionConfig,
    stats: CooccurrenceStats | None = None,
    seed: int = 0,
    rejected: bool = False,
    ids: Sequence[int | str] | None = None,
) -> tuple[list[PlanMeta], int, int]:
    """:func:`select_table`'s chosen plans as :class:`PlanMeta` (encoded, the bytes of
    :meth:`RemovalPlan.to_dict`), image by image
    in table order (and with ``rejected`` after each image's plans its refused candidates),
    built from the rules' arrays without making the plans: what ``counterfactual select``
    writes. ``image_id`` is ``ids[image]`` (default: the table's ids). Returns
    ``(rows, plans, refused)``."""
    _check_seed(seed)
    ev = _evaluate(table, config)
    image, target, code = _candidates(ev)
    valid = code == 0
    chosen, evidence = valid, None
    if config.policy == "uniform":  # _choose's draw, on the arrays
        chosen = np.zeros(len(code), dtype=bool)
        at = np.flatnonzero(valid)
        n_valid = np.bincount(image[at], minlength=len(table))
        has = np.flatnonzero(n_valid)
        idents, counts = table.image_ids, n_valid[has].tolist()
        draws = [draw_index(seed, idents[i], n) for i, n in zip(has.tolist(), counts, strict=True)]
        chosen[at[(np.cumsum(n_valid) - n_valid)[has] + np.array(draws, dtype=np.intp)]] = True
    elif config.policy == "spurious":
        chosen = np.zeros(len(code), dtype=bool)
        first = np.searchsorted(image, np.arange(len(table)))  # an image's candidates: r = 0, 1, ..
        _, picked = _choose(table, ev, config, stats, None, seed)
        pmi = {int(first[i]) + rs[0]: pmi for i, rs, _, pmi in picked}
        chosen[list(pmi)] = True
    # each image's plans, then (with ``rejected``) its refused candidates, by target
    order = np.lexsort((target, ~chosen, image))
    order = order[(chosen | (rejected & ~valid))[order]]
    if config.policy == "spurious":
        evidence = [pmi.get(p) for p in order.tolist()]
    rows = _rows(table, ev, image[order], target[order], config, evidence, ids)
    return rows, int(chosen.sum()), int((~valid).sum()) if rejected else 0


def _candidates(ev: _Evaluated) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate of every image as ``(image, target, code)`` arrays, by image then
    target (``code``: index in ``_REJECTIONS``)."""
    parts = [(np.zeros(0, dtype=np.intp),) * 3]
    for chunk in ev.chunks:
        codes = np.asarray(chunk.code)
        rows, targets = np.nonzero(np.arange(codes.shape[1]) < np.c_[chunk.n_classes])
        parts.append((np.asarray(chunk.images)[rows], targets, codes[rows, targets]))
    image, target, code = (np.concatenate(column) for column in zip(*parts, strict=True))
    order = np.lexsort((target, image))
    return image[order], target[order], code[order]


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def _choose(
    table: BoxTable,
    ev: _Evaluated,
    config: SelectionConfig,
    stats: CooccurrenceStats | None,
    targets: Sequence[Collection[str] | None] | None,
    seed: int,
) -> tuple[
    list[Selection | None], list[tuple[int, list[int], tuple[str, ...], dict[str, float] | None]]
]:
    """The policy on evaluated candidates: a :class:`Selection` for each image with no plan,
    and for the others ``(image, chosen targets, targets not drawn, PMI evidence)``."""
    _check_seed(seed)
    pmi = None
    if config.policy == "spurious":
        pmi = _PMILookup(stats if stats is not None else CooccurrenceStats.from_table(table))
    if targets is not None and len(targets) != len(table):
        raise ValueError(f"{len(targets)} target limits for {len(table)} records")
    done: list[Selection | None] = [None] * len(table)
    chosen: list[tuple[int, list[int], tuple[str, ...], dict[str, float] | None]] = []
    for i, place in enumerate(ev.where):
        ident = table.image_ids[i]
        if place is None:
            done[i] = Selection(ident, (), ev.ignored[i], FEWER_THAN_TWO_CLASSES)
            continue
        chunk, j = ev.chunks[place[0]], place[1]
        code = chunk.code[j]
        valid = [r for r in range(chunk.n_classes[j]) if code[r] == 0]
        if not valid:
            done[i] = Selection(ident, (), ev.ignored[i], NO_REMOVABLE_CLASS)
            continue
        allowed = None if targets is None else targets[i]
        if config.policy == "all" and allowed is None:
            chosen.append((i, valid, (), None))
            continue
        names = [table.classes[c] for c in chunk.classes[j][: chunk.n_classes[j]]]
        if allowed is not None:
            if not (limited := [r for r in valid if names[r] in allowed]):
                others = tuple(names[r] for r in valid)
                done[i] = Selection(ident, (), ev.ignored[i], CAPTION_UNCHANGED, (), others)
                continue
            valid = limited
        evidence, picked = None, valid
        if config.policy == "uniform":
            picked = [valid[draw_index(seed, ident, len(valid))]]
        elif pmi is not None:
            removed = chunk.removed[j].tolist()
            pick, evidence = _spurious_pick(ident, names, removed, valid, pmi, seed)
            picked = [pick]
        others = tuple(names[r] for r in valid if r not in picked)
        chosen.append((i, picked, others, evidence))
    return done, chosen


def select_many(
    records: Sequence[ImageRecord],
    config: SelectionConfig,
    stats: CooccurrenceStats | None = None,
    targets: Sequence[Collection[str] | None] | None = None,
    seed: int = 0,
) -> list[Selection]:
    """Apply the rules and the policy to each record: ``plans`` holds the chosen valid plans;
    ``seed`` (the run's) keys the draws.

    Only chosen plans are built (use :func:`candidates` for the evidence of every candidate).
    Images are evaluated together, so a batch is much faster than one call per image.

    ``targets`` (one entry per record, ``None`` for no limit) limits the policy's choice to
    valid plans whose target is among the given classes, e.g. the classes the caption mentions
    (caption-aware selection on corpora whose caption is the only text); a record with valid
    plans but none of them allowed gets :data:`CAPTION_UNCHANGED` as its reason and their
    targets in ``not_drawn``.

    The ``spurious`` policy keeps, among an image's valid plans, the one whose target ``r`` is
    most over-represented next to the plan's kept classes ``K``: the highest mean over ``k`` in
    ``K`` of ``PMI(r, k)``, from the image-level co-occurrence ``stats`` of the whole dataset
    (smoothing :data:`SPURIOUS_SMOOTHING`); equal scores are broken by the same seeded draw as
    ``uniform``, among the tied plans. ``stats`` defaults to the counts of ``records``, so pass
    the dataset's counts when ``records`` is one batch of it. Other aggregates are possible and
    not offered: ``max`` picks a target by its single strongest partner (one rare pair decides),
    ``sum`` favours targets with many kept classes; the mean compares plans that keep different
    numbers of classes fairly. ``stats`` is ignored by the other policies.
    """
    return select_table(BoxTable.from_records(records), config, stats, targets, seed)


def select(
    record: ImageRecord,
    config: SelectionConfig,
    stats: CooccurrenceStats | None = None,
    seed: int = 0,
) -> Selection:
    """:func:`select_many` for one record (pass the dataset's ``stats`` for ``spurious``)."""
    return select_many([record], config, stats, seed=seed)[0]


__all__: Sequence[str] = (
    "CAPTION_UNCHANGED",
    "PLAN_KEYED",
    "POLICIES",
    "SPURIOUS_SMOOTHING",
    "CoRemoval",
    "Evidence",
    "KeepOverlap",
    "PMIEvidence",
    "PMIWith",
    "PlanMeta",
    "RemovalPlan",
    "RemovedFraction",
    "Selection",
    "SelectionConfig",
    "candidates",
    "candidates_many",
    "candidates_table",
    "draw_index",
    "select",
    "select_many",
    "select_rows",
    "select_table",
    "spurious_score",
)
