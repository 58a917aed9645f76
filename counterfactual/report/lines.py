"""What a sample's row says, worded once for both renderers (the PNG sheets and the HTML page):
method labels, the old caption cut into struck and kept pieces, and the verifier's verdict as
lines of text."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from counterfactual.method.verify import VerifyMeta


def method_label(described: Any) -> str:
    """``"blur"``, ``"inpaint:opencv"``, ... from a step's ``describe()`` dict in a sample json."""
    if not isinstance(described, dict):
        return "?" if described is None else str(described)
    method = str(described.get("method", "?"))
    return f"{method}:{described['backend']}" if described.get("backend") else method


def caption_segments(caption: str, removed_phrases: Iterable[str]) -> list[tuple[str, bool]]:
    """``caption`` cut into ``(text, removed)`` pieces: each removed phrase is marked where it
    first occurs after the previous one (case-insensitive), the rest in between unmarked."""
    spans: list[tuple[int, int]] = []
    lower, start = caption.lower(), 0
    for phrase in removed_phrases:
        phrase = str(phrase).strip()
        if not phrase:
            continue
        at = lower.find(phrase.lower(), start)
        if at < 0:
            at = lower.find(phrase.lower())
            if at < 0 or any(a < at + len(phrase) and at < b for a, b in spans):
                continue
        spans.append((at, at + len(phrase)))
        start = at + len(phrase)
    out: list[tuple[str, bool]] = []
    pos = 0
    for a, b in sorted(spans):
        if a > pos:
            out.append((caption[pos:a], False))
        out.append((caption[a:b], True))
        pos = b
    if pos < len(caption):
        out.append((caption[pos:], False))
    return out


@dataclass(frozen=True, slots=True)
class CheckLine:
    """One class's check, its numbers as text: a removed class's rank and probability before
    and after the edit (two each), a kept class's after it (one each)."""

    label: str
    """``"removed dog"`` or ``"kept cat"``."""
    ranks: tuple[str, ...]
    probs: tuple[str, ...]
    ok: bool
    problem: str
    """What a failed check is called: ``"still seen"`` (removed) or ``"lost"`` (kept)."""


@dataclass(frozen=True, slots=True)
class VerdictLines:
    """A sample's verdict (its json's ``verify``) as the lines a person reads."""

    passed: bool
    settings: str
    """``"model=M, k=K"``."""
    failed: tuple[str, ...]
    """The failed checks (``verify-removal``, ...), in the verifier's order."""
    checks: tuple[CheckLine, ...]
    """The removed classes, then the kept ones."""
    text: Mapping[str, Any] | None
    """The caption check, ``None`` when it was not made."""

    def text_summary(self, limit: int) -> str | None:
        """The caption check in at most ``limit`` characters."""
        return None if self.text is None else compact(self.text, limit)


def verdict_lines(v: VerifyMeta) -> VerdictLines:
    """The lines of a stored verdict (:class:`counterfactual.shards.samples.VerifyMeta`)."""
    checks = [
        CheckLine(
            f"removed {r.name}",
            (str(r.rank_before), str(r.rank_after)),
            (num(r.prob_before), num(r.prob_after)),
            r.removed,
            "still seen",
        )
        for r in v.removal
    ]
    checks += [
        CheckLine(f"kept {k.name}", (str(k.rank),), (num(k.prob),), k.kept, "lost")
        for k in v.retention
    ]
    text = None if v.text is None else v.text.to_dict()
    return VerdictLines(v.passed, f"model={v.model}, k={v.k}", v.failed, tuple(checks), text)


def num(x: Any) -> str:
    """A number as shown: floats to 3 significant digits, ``None`` as ``?``."""
    return f"{x:.3g}" if isinstance(x, float) else "?" if x is None else str(x)


def compact(d: Mapping[str, Any], limit: int = 160) -> str:
    """``k=v, ...`` in at most ``limit`` characters (cut with an ellipsis)."""
    text = ", ".join(
        f"{k}={num(v) if isinstance(v, float | int | type(None)) else json.dumps(v, ensure_ascii=False)}"
        for k, v in d.items()
    )
    return text if len(text) <= limit else text[: limit - 1] + "…"
