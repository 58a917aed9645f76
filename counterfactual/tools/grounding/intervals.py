"""Table 1 of the Toloka VQA paper (Ustalov et al., 2023): 95% confidence intervals per subset.

For each subset (one Toloka CSV) and each quantity, the interval of the mean is
``mean ± z · sd / sqrt(n)`` with ``z = 1.96`` and ``sd`` the sample standard deviation
(``n - 1``; the population one gives the same printed figures). The quantities are the image
width and height, the box width ``right - left`` and height ``bottom - top`` (pixels, the
continuous convention of :mod:`~counterfactual.tools.grounding.metrics`; "+1 pixel" boxes would move
the box intervals off the paper's) and the question length in characters, spaces included.

The paper prints the intervals as whole numbers rounded outwards (lower bound down, upper bound
up): :meth:`Interval.rounded` gives them, and reproduces Table 1's two test subsets exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from counterfactual.tools.grounding.metrics import TolokaFile, read_toloka_csv

Z_95 = 1.96
TABLE1_COLUMNS = ("image_width", "image_height", "box_width", "box_height", "question_length")
"""The quantities of Table 1, in its column order."""
COLUMN_TITLES = {
    "image_width": "Image width",
    "image_height": "Image height",
    "box_width": "Box width",
    "box_height": "Box height",
    "question_length": "Question length",
}


@dataclass(frozen=True, slots=True)
class Interval:
    """``mean ± z · sd / sqrt(n)``: ``low`` and ``high`` bounds, ``sd`` with ``n - 1``."""

    n: int
    mean: float
    sd: float
    low: float
    high: float

    def rounded(self, digits: int = 0) -> tuple[float, float]:
        """The bounds rounded outwards to ``digits`` decimals, as Table 1 prints them."""
        scale = 10.0**digits
        return (math.floor(self.low * scale) / scale, math.ceil(self.high * scale) / scale)

    def as_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "sd": self.sd, "low": self.low, "high": self.high}


def mean_interval(values: ArrayLike, z: float = Z_95) -> Interval:
    """The normal-approximation interval of the mean of ``values`` (1-D, finite, two or
    more)."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"an interval needs 1-D values, two or more, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("an interval needs finite values")
    if isinstance(z, bool) or not math.isfinite(z) or z <= 0:
        raise ValueError(f"z must be a finite number > 0, got {z!r}")
    mean = float(array.mean())
    sd = float(array.std(ddof=1))
    half = z * sd / math.sqrt(array.size)
    return Interval(n=int(array.size), mean=mean, sd=sd, low=mean - half, high=mean + half)


def table1_values(subset: TolokaFile) -> dict[str, np.ndarray]:
    """The per-row quantities of Table 1 for one subset, by column name (float64 arrays)."""
    rows = subset.rows
    boxes = np.array([row.box for row in rows], dtype=np.float64).reshape(-1, 4)
    return {
        "image_width": np.array([row.width for row in rows], dtype=np.float64),
        "image_height": np.array([row.height for row in rows], dtype=np.float64),
        "box_width": boxes[:, 2] - boxes[:, 0],
        "box_height": boxes[:, 3] - boxes[:, 1],
        "question_length": np.array([len(row.question) for row in rows], dtype=np.float64),
    }


@dataclass(frozen=True, slots=True)
class SubsetIntervals:
    """One row of Table 1: the subset's ``name``, its number of instances and an
    :class:`Interval` per column of :data:`TABLE1_COLUMNS`."""

    name: str
    n: int
    intervals: dict[str, Interval]

    def as_dict(self) -> dict[str, Any]:
        return {
            "subset": self.name,
            "n": self.n,
            **{column: self.intervals[column].as_dict() for column in TABLE1_COLUMNS},
        }


def subset_intervals(path: str | Path, z: float = Z_95, name: str | None = None) -> SubsetIntervals:
    """Table 1's row for the Toloka CSV at ``path`` (``name``: its file stem unless given)."""
    subset = read_toloka_csv(path)
    if len(subset.rows) < 2:
        raise ValueError(f"{path}: an interval needs two or more rows, got {len(subset.rows)}")
    values = table1_values(subset)
    return SubsetIntervals(
        name=name if name is not None else Path(path).stem,
        n=len(subset.rows),
        intervals={column: mean_interval(values[column], z) for column in TABLE1_COLUMNS},
    )


def format_table1(rows: Sequence[SubsetIntervals], digits: int = 0) -> str:
    """Rows as a Markdown table laid out like Table 1, bounds rounded outwards."""
    header = ["Subset", "# of instances", *(COLUMN_TITLES[c] for c in TABLE1_COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.name, f"{row.n:,}"]
        for column in TABLE1_COLUMNS:
            low, high = row.intervals[column].rounded(digits)
            cells.append(f"({low:.{digits}f}, {high:.{digits}f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
