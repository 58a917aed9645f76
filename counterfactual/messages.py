"""One line for every message a person reads: errors, warnings, status details.

A message is one line (its lines joined by spaces) of at most :data:`MAX_LINE` characters;
a longer one keeps its head and its tail (where the fix usually stands) around ``...``.
Bidirectional controls are shown escaped (``\\u202e``), so a caption or file name quoted in a
message cannot reorder what the terminal shows around it.
"""

from __future__ import annotations

MAX_LINE = 400
"""The most characters an error line, a warning or a status detail holds."""

ELLIPSIS = " ... "

BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
"""The characters that change the display order of the text around them (Unicode's bidi
controls): escaped in every message."""
_ESCAPED = {ord(c): f"\\u{ord(c):04x}" for c in BIDI_CONTROLS}


def one_line(text: object, limit: int = MAX_LINE) -> str:
    """``text`` as one line: whitespace runs (newlines included) become one space, and a line
    longer than ``limit`` is cut in the middle with ``...``."""
    line = " ".join(str(text).translate(_ESCAPED).split())
    return cut(line, limit)


def cut(text: str, limit: int = MAX_LINE) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around ``...``
    (the tail a quarter of the room)."""
    if limit < len(ELLIPSIS) + 2:
        raise ValueError(f"limit must be at least {len(ELLIPSIS) + 2}, got {limit}")
    if len(text) <= limit:
        return text
    room = limit - len(ELLIPSIS)
    tail = room // 4
    return text[: room - tail] + ELLIPSIS + text[len(text) - tail :]


def short(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: a value quoted inside a message."""
    return cut(" ".join(repr(value).split()), limit)
