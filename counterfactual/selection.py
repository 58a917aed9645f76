"""Which classes can be removed from an image: the alpha rules of Kim et al. (SPEC 1.1).

For an image with class set ``C`` and a candidate class ``r``:

1. ``B_r`` is the union of all boxes of ``r`` (crowd boxes included).
2. ``C_plus = {c != r : area(B_r ∩ B_c) / area(B_c) > alpha2}`` is removed with ``r``;
   ``R = {r} ∪ C_plus`` and ``K = C - R``, which must not be empty.
3. Keep rule: ``area(B_R ∩ B_k) / area(B_k) < alpha1`` for every kept ``k``.
4. Size rule: ``area(B_R) / (W * H) < alpha3``.

Areas are exact areas of unions (see :mod:`counterfactual.geometry`). Boxes are clipped to the
image first; an object whose clipped box has zero area cannot be seen, so it takes no part (its
class does not count towards ``C``) and is listed in ``ignored``.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from counterfactual.cooccurrence import CooccurrenceStats
from counterfactual.geometry import box_cells
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
    alpha1: float = 0.4
    alpha2: float = 0.8
    alpha3: float = 0.7
    policy: str = "uniform"
    """``uniform``: one valid plan per image, drawn with ``seed``; ``all``: every valid plan;
    ``spurious``: the valid plan whose target co-occurs most over-proportionally with its kept
    classes over the dataset (see :func:`select_many`), ties drawn with ``seed``."""
    seed: int = 0

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
        if (
            isinstance(self.seed, bool)
            or not isinstance(self.seed, numbers.Integral)
            or self.seed < 0
        ):
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")


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
        objects keyed by class name; :class:`counterfactual.samples.PlanMeta` reads both.
        """
        out: dict[str, Any] = {
            "image_id": self.image_id,
            "target": self.target,
            "removed": list(self.removed),
            "kept": list(self.kept),
            "kind": self.kind,
            "valid": self.valid,
            "rejected_by": self.rejected_by,
            "evidence": {
                "co_removal": [
                    {"class": c, "ratio": r, "alpha2": self.alpha2, "co_removed": r > self.alpha2}
                    for c, r in self.co_removal.items()
                ],
                "keep_overlap": [
                    {"class": k, "ratio": r, "alpha1": self.alpha1, "ok": r < self.alpha1}
                    for k, r in self.keep_overlap.items()
                ],
                "removed_fraction": {
                    "ratio": self.removed_fraction,
                    "alpha3": self.alpha3,
                    "ok": self.removed_fraction < self.alpha3,
                },
            },
            "mask_boxes": [list(b) for b in self.mask_boxes],
        }
        if self.pmi is not None:
            out["evidence"]["pmi"] = {
                "with_kept": [{"class": k, "pmi": v} for k, v in self.pmi.items()],
                "score": spurious_score(self.pmi.values()),
                "aggregate": "mean",
                "smoothing": SPURIOUS_SMOOTHING,
            }
        return out


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
class _Evaluation:
    """Every candidate of one image as arrays; plans are built only when wanted."""

    record: ImageRecord
    names: list[str]
    boxes: np.ndarray  # (n, 4) xyxy, clipped, positive area
    group: list[int]  # class index of each box
    co_ratio: np.ndarray  # [r, c] = area(B_r ∩ B_c) / area(B_c)
    removed: np.ndarray  # [r, c]: c is removed when r is the target
    keep_ratio: np.ndarray  # [r, k] = area(B_R ∩ B_k) / area(B_k)
    fraction: np.ndarray  # [r] = area(B_R) / (W * H)
    rejected: list[str | None]
    ignored: int

    def plan(self, r: int, config: SelectionConfig) -> RemovalPlan:
        names = self.names
        rem = self.removed[r].tolist()
        co, keep = self.co_ratio[r].tolist(), self.keep_ratio[r].tolist()
        boxes = self.boxes.tolist()
        return RemovalPlan(
            image_id=self.record.image_id,
            target=names[r],
            removed=(names[r], *[c for i, c in enumerate(names) if rem[i] and i != r]),
            kept=tuple([c for i, c in enumerate(names) if not rem[i]]),
            co_removal={c: co[i] for i, c in enumerate(names) if i != r},
            keep_overlap={c: keep[i] for i, c in enumerate(names) if not rem[i]},
            removed_fraction=float(self.fraction[r]),
            mask_boxes=tuple(
                [
                    (x0, y0, x1 - x0, y1 - y0)
                    for (x0, y0, x1, y1), g in zip(boxes, self.group, strict=True)
                    if rem[g]
                ]
            ),
            alpha1=config.alpha1,
            alpha2=config.alpha2,
            alpha3=config.alpha3,
            rejected_by=self.rejected[r],
        )


_REJECTIONS: tuple[str | None, ...] = (None, NOTHING_KEPT, KEEP_OVERLAP, TOO_LARGE)
# Cells per chunk of images evaluated together (bounds memory for images with many boxes).
_CHUNK_CELLS = 2_000_000


def _bucket(n: int) -> int:
    """Pad box counts to a few sizes so images with similar counts are evaluated together."""
    if n <= 8:
        return n
    step = 1 << max(0, n.bit_length() - 3)  # 4 sizes per doubling
    return -(-n // step) * step


def _evaluate_many(
    records: Sequence[ImageRecord], config: SelectionConfig
) -> list[_Evaluation | tuple[int, str]]:
    """Evaluate every candidate of every record, vectorised over images with similar box counts.

    Returns, per record, its evaluation or ``(ignored objects, reason)`` when it does not qualify.
    """
    out: list[_Evaluation | tuple[int, str]] = [(0, FEWER_THAN_TWO_CLASSES)] * len(records)
    counts = [len(r.objects) for r in records]
    flat = np.array([o.bbox for r in records for o in r.objects], dtype=np.float64).reshape(-1, 4)
    owner = np.repeat(np.arange(len(records)), counts)
    widths = np.array([r.width for r in records], dtype=np.float64)[owner]
    heights = np.array([r.height for r in records], dtype=np.float64)[owner]
    flat[:, 2:] += flat[:, :2]
    flat[:, 0::2] = np.clip(flat[:, 0::2], 0.0, widths[:, None])
    flat[:, 1::2] = np.clip(flat[:, 1::2], 0.0, heights[:, None])
    visible = ((flat[:, 2] > flat[:, 0]) & (flat[:, 3] > flat[:, 1])).tolist()
    buckets: dict[int, list[tuple[int, list[str], list[int], list[int]]]] = {}
    offset = 0
    for i, record in enumerate(records):
        n = counts[i]
        idx = [offset + j for j in range(n) if visible[offset + j]]
        cats = [record.objects[j - offset].category for j in idx]
        offset += n
        names = list(dict.fromkeys(cats))
        if len(names) < 2:
            out[i] = (n - len(idx), FEWER_THAN_TWO_CLASSES)
            continue
        index = {c: k for k, c in enumerate(names)}
        size = _bucket(len(idx))
        buckets.setdefault(size, []).append((i, names, idx, [index[c] for c in cats]))
    for size, items in buckets.items():
        per_image = size * (2 * size - 1) ** 2
        step = max(1, _CHUNK_CELLS // per_image)
        for start in range(0, len(items), step):
            _evaluate_chunk(records, flat, items[start : start + step], size, config, out)
    return out


def _evaluate_chunk(
    records: Sequence[ImageRecord],
    flat: np.ndarray,
    items: list[tuple[int, list[str], list[int], list[int]]],
    size: int,
    config: SelectionConfig,
    out: list[_Evaluation | tuple[int, str]],
) -> None:
    n = len(items)
    k_max = max(len(names) for _, names, _, _ in items)
    boxes = np.zeros((n, size, 4))
    group = np.full((n, size), k_max)
    n_classes = np.empty(n, dtype=np.intp)
    for j, (_, names, idx, grp) in enumerate(items):
        boxes[j, : len(idx)] = flat[idx]
        group[j, : len(idx)] = grp
        n_classes[j] = len(names)
    # The cell grid of each image (padding boxes are empty and cover no cell).
    box_cover, cell_area = box_cells(boxes)
    onehot = (group[:, None, :] == np.arange(k_max)[None, :, None]).astype(np.float32)
    cover = np.minimum(onehot @ box_cover.astype(np.float32), 1.0).astype(np.float64)
    weighted = cover * cell_area[:, None, :]
    inter = cover @ weighted.transpose(0, 2, 1)  # [r, c] = area(B_r ∩ B_c)
    area = inter.diagonal(axis1=1, axis2=2)
    real = np.arange(k_max)[None, :] < n_classes[:, None]
    safe_area = np.where(real, area, 1.0)[:, None, :]
    co_ratio = inter / safe_area
    removed = (co_ratio > config.alpha2) & real[:, None, :]
    removed |= np.eye(k_max, dtype=bool)[None]
    image_area = np.array([records[i].width * records[i].height for i, *_ in items], float)
    # A single-class candidate removes B_r only: its keep ratios are its co-removal ratios and
    # its removed area is area(B_r). Only multi-class candidates need the union B_R.
    keep_ratio = co_ratio.copy()
    fraction = area / image_area[:, None]
    multi_i, multi_r = np.nonzero(removed.sum(axis=2) > 1)
    if len(multi_i):
        cover_r = np.minimum(
            np.einsum("pk,pkc->pc", removed[multi_i, multi_r].astype(np.float64), cover[multi_i]),
            1.0,
        )
        keep_ratio[multi_i, multi_r] = (
            np.einsum("pc,pkc->pk", cover_r, weighted[multi_i]) / safe_area[multi_i, 0]
        )
        fraction[multi_i, multi_r] = (cover_r * cell_area[multi_i]).sum(axis=1) / image_area[
            multi_i
        ]
    kept = ~removed & real[:, None, :]
    worst_keep = np.where(kept, keep_ratio, -1.0).max(axis=2)
    code = np.where(
        ~kept.any(axis=2),
        1,
        np.where(worst_keep >= config.alpha1, 2, np.where(fraction >= config.alpha3, 3, 0)),
    ).tolist()
    for j, (i, names, idx, grp) in enumerate(items):
        k = len(names)
        record = records[i]
        out[i] = _Evaluation(
            record=record,
            names=names,
            boxes=flat[idx],
            group=grp,
            co_ratio=co_ratio[j, :k, :k],
            removed=removed[j, :k, :k],
            keep_ratio=keep_ratio[j, :k, :k],
            fraction=fraction[j, :k],
            rejected=[_REJECTIONS[c] for c in code[j][:k]],
            ignored=len(record.objects) - len(idx),
        )


def candidates_many(records: Sequence[ImageRecord], config: SelectionConfig) -> list[Selection]:
    """Evaluate every class of each record as the removal target (no policy applied), the
    records together."""
    out = []
    for record, ev in zip(records, _evaluate_many(records, config), strict=True):
        if isinstance(ev, tuple):
            out.append(Selection(record.image_id, (), ev[0], ev[1]))
        else:
            plans = tuple(ev.plan(r, config) for r in range(len(ev.names)))
            out.append(Selection(record.image_id, plans, ev.ignored))
    return out


def candidates(record: ImageRecord, config: SelectionConfig) -> Selection:
    """Evaluate every class of ``record`` as the removal target (no policy applied)."""
    return candidates_many([record], config)[0]


def draw_index(seed: int, key: str, n: int) -> int:
    """A reproducible uniform draw in ``range(n)`` from ``seed`` and ``key``, independent of
    the order or process in which images are handled."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % n


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
    ev: _Evaluation, valid: list[int], pmi: _PMILookup, seed: int
) -> tuple[int, dict[str, float]]:
    """The valid target with the highest score, a seeded draw among equal scores."""
    evidence, scores = [], []
    for r in valid:
        rem = ev.removed[r].tolist()
        kept = [c for i, c in enumerate(ev.names) if not rem[i]]
        values = {k: pmi(ev.names[r], k) for k in kept}
        evidence.append(values)
        scores.append(spurious_score(values.values()))
    best = max(scores)
    tol = 1e-12 * max(1.0, abs(best)) if math.isfinite(best) else 0.0
    ties = [n for n, score in enumerate(scores) if score >= best - tol]
    n = ties[draw_index(seed, ev.record.image_id, len(ties))] if len(ties) > 1 else ties[0]
    return valid[n], evidence[n]


def select_many(
    records: Sequence[ImageRecord],
    config: SelectionConfig,
    stats: CooccurrenceStats | None = None,
    targets: Sequence[Collection[str] | None] | None = None,
) -> list[Selection]:
    """Apply the rules and the policy to each record: ``plans`` holds the chosen valid plans.

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
    pmi = None
    if config.policy == "spurious":
        pmi = _PMILookup(stats if stats is not None else CooccurrenceStats.from_records(records))
    if targets is not None and len(targets) != len(records):
        raise ValueError(f"{len(targets)} target limits for {len(records)} records")
    out = []
    for i, (record, ev) in enumerate(zip(records, _evaluate_many(records, config), strict=True)):
        if isinstance(ev, tuple):
            out.append(Selection(record.image_id, (), ev[0], ev[1]))
            continue
        valid = [r for r, why in enumerate(ev.rejected) if why is None]
        if not valid:
            out.append(Selection(record.image_id, (), ev.ignored, NO_REMOVABLE_CLASS))
            continue
        allowed = None if targets is None else targets[i]
        if allowed is not None:
            if not (chosen := [r for r in valid if ev.names[r] in allowed]):
                names = tuple(ev.names[r] for r in valid)
                out.append(Selection(record.image_id, (), ev.ignored, CAPTION_UNCHANGED, (), names))
                continue
            valid = chosen
        others: tuple[str, ...] = ()
        if config.policy == "uniform":
            pick = valid[draw_index(config.seed, record.image_id, len(valid))]
            others = tuple(ev.names[r] for r in valid if r != pick)
            valid = [pick]
        elif pmi is not None:
            pick, evidence = _spurious_pick(ev, valid, pmi, config.seed)
            others = tuple(ev.names[r] for r in valid if r != pick)
            plan = replace(ev.plan(pick, config), pmi=evidence)
            out.append(Selection(record.image_id, (), ev.ignored, None, (plan,), others))
            continue
        plans = tuple(ev.plan(r, config) for r in valid)
        out.append(Selection(record.image_id, (), ev.ignored, None, plans, others))
    return out


def select(
    record: ImageRecord, config: SelectionConfig, stats: CooccurrenceStats | None = None
) -> Selection:
    """:func:`select_many` for one record (pass the dataset's ``stats`` for ``spurious``)."""
    return select_many([record], config, stats)[0]


__all__: Sequence[str] = (
    "CAPTION_UNCHANGED",
    "POLICIES",
    "SPURIOUS_SMOOTHING",
    "RemovalPlan",
    "Selection",
    "SelectionConfig",
    "candidates",
    "candidates_many",
    "draw_index",
    "select",
    "select_many",
    "spurious_score",
)
