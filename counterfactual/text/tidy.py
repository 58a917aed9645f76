"""Spacing and punctuation clean-up after phrases are cut out of a sentence."""

from __future__ import annotations

import re

_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_REPEATED_COMMAS = re.compile(r"(,\s*)+,")
_COMMA_BEFORE_STOP = re.compile(r",\s*([.;:!?])")
_LEADING = re.compile(r"^[\s,;:.]+")
_TRAILING_COMMA = re.compile(r"[\s,;:]+$")
_EMPTY_BRACKETS = re.compile(r"\(\s*\)|\[\s*\]")


def tidy(text: str, capitalize: bool = False) -> str:
    """Collapse whitespace, drop spaces before punctuation, doubled and dangling commas, empty
    brackets and leading punctuation; upper-case the first letter when ``capitalize``."""
    out = _EMPTY_BRACKETS.sub(" ", text)
    out = _SPACES.sub(" ", out)
    out = _SPACE_BEFORE_PUNCT.sub(r"\1", out)
    out = _REPEATED_COMMAS.sub(",", out)
    out = _COMMA_BEFORE_STOP.sub(r"\1", out)
    out = _LEADING.sub("", out)
    out = _TRAILING_COMMA.sub("", out).strip()
    if capitalize and out:
        out = out[0].upper() + out[1:]
    return out


def has_words(text: str) -> bool:
    return any(ch.isalnum() for ch in text)
