"""Caption text as it enters a run: invisible and control characters out, whitespace tidy.

Every reader passes each caption through :func:`clean_text` before it becomes a
:class:`~counterfactual.records.Caption` (Flickr30k cleans the marked-up line, so phrase offsets
index the clean text), and the caption keeps the count as ``Caption.cleaned``; a sample's json
shows it as ``caption_cleaned`` when it is not zero. The rules:

- control characters (Unicode category ``Cc``: NUL, ESC, DEL, C1 controls, ...) are removed,
  except those Python counts as whitespace (tab, newline, carriage return, vertical tab, form
  feed, the file/group/record separators, NEL), which become a space;
- lone surrogates (``Cs``, e.g. from a JSON ``"\\ud800"``) are removed: they cannot be written
  as UTF-8;
- four invisible format characters that carry nothing in a caption are removed: zero-width
  space U+200B, word joiner U+2060, soft hyphen U+00AD and the byte-order mark / zero-width
  no-break space U+FEFF. Other format characters are kept because text needs them: the
  zero-width joiner U+200D (emoji sequences), the zero-width non-joiner U+200C (Persian,
  Indic scripts), bidirectional marks and the tag characters of flag emoji;
- every run of whitespace (including the spaces made above and the no-break space) becomes one
  space, and the ends are stripped.

The other format characters and compatibility forms (fullwidth letters, ligatures) stay in the
caption; class words are matched on the caption as a reader sees it
(:mod:`counterfactual.fold`), so they hide no class from ``np-removal`` or the caption check.

``removed`` counts the characters of the first three rules; tidying whitespace is not counted,
so a caption with a double space reports 0.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

INVISIBLE = frozenset("\u200b\u2060\u00ad\ufeff")
"""Format characters removed from captions (see the module docstring for those kept)."""
_SPACES = re.compile(r"\s+")
_SUSPECT = re.compile(r"[\x00-\x1f\x7f-\x9f\u00ad\u200b\u2060\ufeff\ud800-\udfff]")
"""Characters that may need cleaning; text without any takes the fast path."""


@dataclass(frozen=True, slots=True)
class CleanText:
    """``text`` after cleaning and ``removed``, the control, surrogate and invisible format
    characters removed or turned into spaces."""

    text: str
    removed: int


def _clean_char(ch: str) -> str:
    if ch in INVISIBLE:
        return ""
    category = unicodedata.category(ch)
    if category == "Cc":
        return " " if ch.isspace() else ""
    if category == "Cs":
        return ""
    return ch


def clean_text(text: str) -> CleanText:
    """``text`` cleaned by the module's rules. ``TypeError`` for anything but a ``str``."""
    if not isinstance(text, str):
        raise TypeError(f"caption text must be a str, got {type(text).__name__}")
    removed = 0
    if _SUSPECT.search(text):
        kept = []
        for ch in text:
            out = _clean_char(ch) if _SUSPECT.match(ch) else ch
            removed += out != ch
            kept.append(out)
        text = "".join(kept)
    return CleanText(_SPACES.sub(" ", text).strip(), removed)


__all__ = ["INVISIBLE", "CleanText", "clean_text"]
