"""Class co-occurrence over images: counts, PMI, and heat-maps before and after adding D'.

Presence is image-level: an image contains class ``a`` when at least one of its objects of
class ``a`` is visible (its box, clipped to the image, has a positive area), the class set
``C`` of the alpha rules (:mod:`counterfactual.method.selection`). ``counts[a, b]`` is the number of
images containing both ``a`` and ``b``; the diagonal ``counts[a, a]`` is the number of images
containing ``a``; ``n_images`` counts every image, with or without objects.

PMI (:meth:`CooccurrenceStats.pmi`) is ``log(p(a, b) / (p(a) p(b)))`` =
``log(n_ab / E_ab)`` with the count expected under independence ``E_ab = n_a n_b / N``.
Smoothing ``s`` adds the same pseudo-count to the observed and the expected count,
``log((n_ab + s) / (E_ab + s))``: ``s = 0`` is plain PMI (``-inf`` for pairs never seen
together); ``s > 0`` keeps every value finite and pulls pairs seen in few images towards 0
(independence); a pair of classes the counts never saw scores exactly 0.

A synthetic sample of a run (``plan.kept`` in its ``json``) is one image containing exactly
its kept classes: :func:`counterfactual.shards.samples.synthetic_class_sets` reads them from a run's shards and
:meth:`CooccurrenceStats.combined` adds them to the counts of the dataset (``D ∪ D'``).
"""

from __future__ import annotations

import decimal
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from counterfactual._lazy import require
from counterfactual.boxtable import BoxTable, snap_bits_of
from counterfactual.records import ImageRecord

MEASURES = ("pmi", "frequency")
DPI = 100


def present_classes(record: ImageRecord) -> frozenset[str]:
    """The classes with at least one visible object (box ``xywh`` pixels, clipped to the image,
    of positive area on the snapping grid, as :meth:`BoxTable.snapped`): the class set the
    alpha rules work on."""
    found = set()
    scale = 2.0 ** snap_bits_of(record.width, record.height)
    for obj in record.objects:
        x, y, w, h = obj.bbox
        x0, x1 = max(0.0, x), min(float(record.width), x + w)
        y0, y1 = max(0.0, y), min(float(record.height), y + h)
        # round() is half to even, as np.rint
        if round(x1 * scale) > round(x0 * scale) and round(y1 * scale) > round(y0 * scale):
            found.add(obj.category)
    return frozenset(found)


_LN = decimal.Context(prec=40)


def _log_ratio(num: Fraction, den: Fraction) -> float:
    """``log(num / den)`` of exact fractions, correctly rounded in decimal and then to float:
    integer arithmetic, so the same bits on every CPU (numpy's ``log`` dispatches to SIMD
    code whose last bit differs between AVX2 and AVX-512 hosts)."""
    if den == 0:
        return math.nan if num == 0 else math.inf
    if num == 0:
        return -math.inf
    exact = num / den
    ratio = _LN.divide(decimal.Decimal(exact.numerator), decimal.Decimal(exact.denominator))
    return float(_LN.ln(ratio))


@dataclass(frozen=True, slots=True, eq=False)
class CooccurrenceStats:
    """Image-level co-occurrence counts of ``classes`` (sorted names) over ``n_images`` images.

    ``counts`` is a symmetric ``(k, k)`` int64 matrix: ``counts[i, j]`` images contain both
    ``classes[i]`` and ``classes[j]``, ``counts[i, i]`` images contain ``classes[i]``.
    """

    classes: tuple[str, ...]
    counts: np.ndarray
    n_images: int

    def __post_init__(self) -> None:
        k = len(self.classes)
        if len(set(self.classes)) != k:
            raise ValueError("co-occurrence classes must be distinct")
        if self.counts.shape != (k, k):
            raise ValueError(f"counts must be {k}x{k} for {k} classes, got {self.counts.shape}")
        if not np.array_equal(self.counts, self.counts.T):
            raise ValueError("co-occurrence counts must be symmetric")
        if (self.counts < 0).any() or (self.counts > self.n_images).any():
            raise ValueError(f"co-occurrence counts must lie in [0, n_images={self.n_images}]")

    @classmethod
    def from_class_sets(
        cls, sets: Iterable[Iterable[str]], classes: Iterable[str] = ()
    ) -> CooccurrenceStats:
        """Counts over images given as class sets (one set per image); ``classes`` may name
        classes that occur in none of them."""
        rows = [frozenset(s) for s in sets]
        names = tuple(sorted(set(classes).union(*rows)))
        index = {c: i for i, c in enumerate(names)}
        presence = np.zeros((len(rows), len(names)), dtype=bool)
        for r, present in enumerate(rows):
            presence[r, [index[c] for c in present]] = True
        return cls(names, _cooccurrence(presence), len(rows))

    @classmethod
    def from_records(cls, records: Iterable[ImageRecord]) -> CooccurrenceStats:
        """Counts over ``records`` (every record is one image), by :func:`present_classes`."""
        return cls.from_table(BoxTable.from_records(list(records)))

    @classmethod
    def from_table(cls, table: BoxTable) -> CooccurrenceStats:
        """Counts over the images of a :class:`BoxTable` (every entry is one image)."""
        _, visible = table.clipped()
        present = np.unique(table.category[visible])
        names = tuple(sorted(table.classes[c] for c in present.tolist()))
        index = {c: i for i, c in enumerate(names)}
        code = np.full(len(table.classes), -1, dtype=np.intp)
        for c in present.tolist():
            code[c] = index[table.classes[c]]
        presence = np.zeros((len(table), len(names)), dtype=bool)
        presence[table.owner[visible], code[table.category[visible]]] = True
        return cls(names, _cooccurrence(presence), len(table))

    @classmethod
    def streamed(cls, records: Iterable[ImageRecord], chunk: int = 4096) -> CooccurrenceStats:
        """:meth:`from_records` over a stream, a chunk at a time (only counts are kept)."""
        total = cls((), np.zeros((0, 0), dtype=np.int64), 0)
        batch: list[ImageRecord] = []
        for record in records:
            batch.append(record)
            if len(batch) == chunk:
                total, batch = total.combined(cls.from_records(batch)), []
        return total.combined(cls.from_records(batch)) if batch else total

    @property
    def index(self) -> dict[str, int]:
        return {c: i for i, c in enumerate(self.classes)}

    def count(self, a: str, b: str) -> int:
        """Images containing both ``a`` and ``b`` (``a == b``: images containing ``a``)."""
        index = self.index
        if a not in index or b not in index:
            return 0
        return int(self.counts[index[a], index[b]])

    def aligned(self, classes: Sequence[str]) -> np.ndarray:
        """The counts of ``classes``, in that order (0 for classes these counts never saw)."""
        index = self.index
        rows = [index.get(c, -1) for c in classes]
        out = np.zeros((len(classes), len(classes)), dtype=np.int64)
        for i, ri in enumerate(rows):
            for j, rj in enumerate(rows):
                if ri >= 0 and rj >= 0:
                    out[i, j] = self.counts[ri, rj]
        return out

    def combined(self, other: CooccurrenceStats) -> CooccurrenceStats:
        """The counts of both sets of images together (classes united)."""
        names = tuple(sorted(set(self.classes) | set(other.classes)))
        return CooccurrenceStats(
            names, self.aligned(names) + other.aligned(names), self.n_images + other.n_images
        )

    def top_classes(self, n: int) -> tuple[str, ...]:
        """The ``n`` classes present in most images (ties by name)."""
        order = sorted(
            range(len(self.classes)), key=lambda i: (-self.counts[i, i], self.classes[i])
        )
        return tuple(self.classes[i] for i in order[:n])

    def frequency(self) -> np.ndarray:
        """``p(a, b)``: ``counts / n_images`` (float64; zeros when there are no images)."""
        return self.counts / max(self.n_images, 1)

    def pmi(self, smoothing: float = 1.0) -> np.ndarray:
        """``log((n_ab + s) / (n_a n_b / N + s))``, float64 ``(k, k)`` (see the module doc).

        With ``smoothing = 0`` a pair never seen together is ``-inf`` and a class in no image
        gives ``nan``; the diagonal is the self-information ``log((n_a + s) / (n_a^2 / N + s))``.
        """
        if not smoothing >= 0.0 or not math.isfinite(smoothing):
            raise ValueError(f"smoothing must be a finite number >= 0, got {smoothing}")
        diag = np.diag(self.counts).tolist()
        n = max(self.n_images, 1)
        s = Fraction(smoothing)
        cache: dict[tuple[int, int], float] = {}
        out = np.empty(self.counts.shape, dtype=np.float64)
        for (a, b), count in np.ndenumerate(self.counts):
            key = (int(count), diag[a] * diag[b])
            if (value := cache.get(key)) is None:
                value = cache[key] = _log_ratio(key[0] + s, Fraction(key[1], n) + s)
            out[a, b] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "classes": list(self.classes),
            "n_images": self.n_images,
            "counts": self.counts.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CooccurrenceStats:
        try:
            classes = tuple(str(c) for c in data["classes"])
            counts = np.array(data["counts"], dtype=np.int64).reshape(len(classes), len(classes))
            return cls(classes, counts, int(data["n_images"]))
        except (KeyError, TypeError) as err:
            raise ValueError(f"not co-occurrence counts: {err}") from err

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict()), encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CooccurrenceStats:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


def _cooccurrence(presence: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
    """``presence.T @ presence`` as int64 for a boolean (images, classes) matrix, in float64
    chunks (exact: each chunk adds at most ``chunk`` to a count)."""
    k = presence.shape[1]
    out = np.zeros((k, k), dtype=np.int64)
    for start in range(0, presence.shape[0], chunk):
        part = presence[start : start + chunk].astype(np.float64)
        out += np.rint(part.T @ part).astype(np.int64)
    return out


def values(
    stats: CooccurrenceStats, classes: Sequence[str], measure: str, smoothing: float
) -> np.ndarray:
    """The ``measure`` (``pmi`` or ``frequency``) of ``classes`` x ``classes``, float64."""
    if measure not in MEASURES:
        raise ValueError(f"measure {measure!r} is not one of {MEASURES}")
    sub = CooccurrenceStats(tuple(classes), stats.aligned(classes), stats.n_images)
    return sub.pmi(smoothing) if measure == "pmi" else sub.frequency()


def figure_size(n: int) -> tuple[float, float]:
    """Inches of a heat-map figure of ``n`` classes (three panels); pixels are ``DPI`` times."""
    side = 1.2 + 0.3 * max(n, 2)
    return (3 * (side + 1.4), side + 1.0)


def heatmap(
    before: CooccurrenceStats,
    after: CooccurrenceStats,
    classes: Sequence[str],
    path: str | Path,
    measure: str = "pmi",
    smoothing: float = 1.0,
) -> Path:
    """A PNG of three panels over ``classes``: ``before`` (D), ``after`` (D ∪ D') and after
    minus before. The diagonal (``pmi``: self-information; ``frequency``: ``p(a)``) and
    undefined values are grey, so the pairs set the colour scale."""
    matplotlib = require("matplotlib", "eval")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(classes)
    if n < 1:
        raise ValueError("a heat-map needs at least one class")
    mats = [values(s, classes, measure, smoothing) for s in (before, after)]
    mats.append(mats[1] - mats[0])
    blank = np.eye(n, dtype=bool)
    mats = [np.where(blank | ~np.isfinite(m), np.nan, m) for m in mats]
    label = "PMI" if measure == "pmi" else "p(a, b)"
    titles = (
        f"before: D ({before.n_images} images)",
        f"after: D ∪ D' ({after.n_images} images)",
        "after − before",
    )
    both = np.concatenate([mats[0].ravel(), mats[1].ravel()])
    finite = both[np.isfinite(both)]
    if measure == "pmi":
        bound = float(np.abs(finite).max()) if finite.size else 1.0
        scale = {"cmap": "RdBu_r", "vmin": -bound or -1.0, "vmax": bound or 1.0}
    else:
        top = float(finite.max()) if finite.size else 1.0
        scale = {"cmap": "viridis", "vmin": 0.0, "vmax": top or 1.0}
    diff = mats[2][np.isfinite(mats[2])]
    dbound = float(np.abs(diff).max()) if diff.size else 0.0
    fig, axes = plt.subplots(1, 3, figsize=figure_size(n), dpi=DPI)
    for ax, mat, title, i in zip(axes, mats, titles, range(3), strict=True):
        kw = scale if i < 2 else {"cmap": "PuOr_r", "vmin": -dbound or -1, "vmax": dbound or 1}
        cmap = matplotlib.colormaps[kw["cmap"]].with_extremes(bad="0.85")
        image = ax.imshow(mat, interpolation="nearest", **{**kw, "cmap": cmap})
        ax.set_xticks(range(n), classes, rotation=90, fontsize=7)
        ax.set_yticks(range(n), classes, fontsize=7)
        ax.set_xlabel("class")
        ax.set_ylabel("class")
        ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label=label if i < 2 else "Δ " + label)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _finite(matrix: np.ndarray) -> list[list[float | None]]:
    """Rows of floats for JSON; ``-inf`` and ``nan`` become ``null``."""
    return [[float(v) if math.isfinite(v) else None for v in row] for row in matrix.tolist()]


def report(
    before: CooccurrenceStats,
    after: CooccurrenceStats,
    classes: Sequence[str],
    measure: str = "pmi",
    smoothing: float = 1.0,
    synthetic_samples: int | None = None,
) -> dict[str, Any]:
    """The JSON beside a heat-map: the full counts before and after (each loads back with
    :meth:`CooccurrenceStats.from_dict`) and the plotted matrices of ``classes``."""
    b, a = (values(s, classes, measure, smoothing) for s in (before, after))
    return {
        "measure": measure,
        "smoothing": smoothing,
        "classes": list(classes),
        "synthetic": {"images": after.n_images - before.n_images, "samples": synthetic_samples},
        "before": before.to_dict(),
        "after": after.to_dict(),
        "matrices": {"before": _finite(b), "after": _finite(a), "difference": _finite(a - b)},
    }


__all__: Sequence[str] = (
    "DPI",
    "MEASURES",
    "CooccurrenceStats",
    "figure_size",
    "heatmap",
    "present_classes",
    "report",
    "values",
)
