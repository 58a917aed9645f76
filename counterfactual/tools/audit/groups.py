"""Per-group accuracy and each group's gap to a reference group (GD-VCR, Yin et al., 2021,
Table 2: accuracy per region and the gap to West).

A prediction record has a group and either ``correct`` (true/false, 1/0, yes/no) or both
``prediction`` and ``answer``, which are compared as trimmed strings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from counterfactual.tools.audit.io import Row, read_rows

_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


@dataclass(frozen=True, slots=True)
class Outcome:
    group: str
    correct: bool


def _as_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"{where}: 'correct' must be true/false, 1/0 or yes/no, got {value!r}")


def outcome_of(row: Row, group_field: str = "group") -> Outcome:
    """The :class:`Outcome` of one record; ``ValueError`` naming its file and line."""
    group = row.get(group_field)
    if isinstance(group, bool) or not isinstance(group, str | int) or str(group).strip() == "":
        raise ValueError(f"{row.where}: {group_field!r} must be a non-empty string, got {group!r}")
    if "correct" in row.fields:
        return Outcome(str(group).strip(), _as_bool(row.fields["correct"], row.where))
    if "prediction" in row.fields and "answer" in row.fields:
        same = str(row.fields["prediction"]).strip() == str(row.fields["answer"]).strip()
        return Outcome(str(group).strip(), same)
    raise ValueError(f"{row.where}: needs 'correct', or both 'prediction' and 'answer'")


def read_outcomes(path: str | Path, group_field: str = "group") -> list[Outcome]:
    return [outcome_of(row, group_field) for row in read_rows(path)]


@dataclass(frozen=True, slots=True)
class GroupAccuracy:
    """``accuracy = correct / n`` (0..1); ``gap = accuracy - reference accuracy``."""

    group: str
    n: int
    correct: int
    accuracy: float
    gap: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "n": self.n,
            "correct": self.correct,
            "accuracy": self.accuracy,
            "gap": self.gap,
        }


@dataclass(frozen=True, slots=True)
class GroupReport:
    """The reference group first, then the others by name; ``overall`` pools every record."""

    reference: str
    groups: tuple[GroupAccuracy, ...]
    overall: GroupAccuracy

    def as_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "overall": self.overall.as_dict(),
            "groups": [g.as_dict() for g in self.groups],
        }

    def table(self) -> str:
        """Accuracy and gap in percent (points), as in GD-VCR's Table 2."""
        lines = [f"{'Group':<20} {'n':>6} {'Acc %':>7} {f'Gap ({self.reference})':>14}"]
        for row in (self.overall, *self.groups):
            lines.append(
                f"{row.group:<20} {row.n:>6} {100 * row.accuracy:>7.2f} {100 * row.gap:>+14.2f}"
            )
        return "\n".join(lines)


def group_accuracy(
    outcomes: Iterable[Outcome], reference: str, overall_label: str = "all"
) -> GroupReport:
    """Accuracy of every group and its gap to ``reference``; ``ValueError`` when there are no
    outcomes or ``reference`` is not one of the groups."""
    counts: dict[str, list[int]] = {}
    for outcome in outcomes:
        tally = counts.setdefault(outcome.group, [0, 0])
        tally[0] += 1
        tally[1] += outcome.correct
    if not counts:
        raise ValueError("no predictions to score")
    if reference not in counts:
        raise ValueError(f"reference group {reference!r} is not among the groups {sorted(counts)}")
    ref_acc = counts[reference][1] / counts[reference][0]

    def row(group: str, n: int, correct: int) -> GroupAccuracy:
        return GroupAccuracy(group, n, correct, correct / n, correct / n - ref_acc)

    order = [reference, *sorted(g for g in counts if g != reference)]
    n_all = sum(n for n, _ in counts.values())
    c_all = sum(c for _, c in counts.values())
    return GroupReport(
        reference=reference,
        groups=tuple(row(g, *counts[g]) for g in order),
        overall=row(overall_label, n_all, c_all),
    )


def group_report_from_file(
    path: str | Path, reference: str, group_field: str = "group"
) -> GroupReport:
    return group_accuracy(read_outcomes(path, group_field), reference)
