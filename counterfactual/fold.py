"""Caption text as a reader sees it, for matching class words: :func:`fold`, :func:`readings`.

A caption's bytes and what a person reads can differ: ``"Ａ ｐｅｒｓｏｎ"`` (fullwidth),
``"A\\u202eperson"`` (a bidi override), ``"per\\u200bson"`` (a zero-width space) and ``"Ρerson"``
(a Greek capital Rho) all read "person". Matching works on the folded text, never on the bytes;
the caption itself is not changed (a shard keeps the original caption as read, see
:mod:`counterfactual.readers.clean`). The folding, character by character:

- compatibility forms become their plain letters: NFKC of each character with the combining
  marks after it (fullwidth ``ｐ`` is ``p``, the ligature ``ﬁ`` is ``fi``, circled ``ⓟ`` and
  superscript ``ᵖ`` are ``p``), and a Latin letter loses its marks (``"pe\u0301rson"`` and
  ``"p\u0336erson"``, struck through, read "person");
- format characters (Unicode category ``Cf``): the bidirectional controls (:data:`BIDI`:
  embeddings, overrides, isolates, the marks) become a space, because they may split the line
  into runs shown apart ("A\\u202eperson" shows "A" and the run "person..." reversed), and
  :func:`folds` reads them joining the words around them as well ("per\\u200eson" shows
  "person"); every other one (zero-width space, joiner and non-joiner, word joiner, soft
  hyphen, BOM, tag characters) is removed, because the letters on either side show joined;
- letters of other scripts that look like a Latin letter become it (:data:`CONFUSABLES`: Greek
  and Cyrillic capitals and lowercase lookalikes, a few Armenian and Latin-extension ones):
  ``"Ρerson"`` with a Greek Rho and ``"реrson"`` with Cyrillic ``р`` and ``е`` read "Person" and
  "person". A Greek or Cyrillic word made only of lookalikes is folded as well: it matches only
  when it spells a class word, which is the spoof to catch.

ASCII text folds to itself. A right-to-left override (U+202E) also shows the Latin letters after
it in reverse order, up to a pop (U+202C) or the end of the line: :func:`readings` gives that
reading as well, so a check can see ``"\\u202enosrep"`` as "person".
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""The bidirectional formatting characters: each folds to a space."""
RLO, PDF = "\u202e", "\u202c"

_LOOKALIKES = {
    # Greek capitals and lowercase letters drawn like Latin ones
    "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ": "ABEZHIKMNOPTYX",
    "αικνορτυχϳ": "aiknoptuxj",
    # Cyrillic
    "АВСЕНІЈКМОРЅТХУҮԌԚԜ": "ABCEHIJKMOPSTXYYGQW",
    "асеһіјӏорԁѕԛхуԝүɡ": "acehijlopdsqxywyg",
    # Armenian and Latin extensions a caption may smuggle in
    "օսհոց": "ouhnq",
    "ıȷ": "ij",
}
CONFUSABLES: dict[str, str] = {
    src: dst for srcs, dsts in _LOOKALIKES.items() for src, dst in zip(srcs, dsts, strict=True)
}
"""A non-Latin letter -> the Latin letter it is drawn like (one character each)."""


@dataclass(frozen=True, slots=True)
class Folded:
    """``text`` folded from ``original``; character ``i`` of ``text`` came from
    ``original[starts[i]:ends[i]]`` (both ``None`` when ``text`` is ``original``)."""

    original: str
    text: str
    starts: tuple[int, ...] | None = None
    ends: tuple[int, ...] | None = None

    def start(self, i: int) -> int:
        """The offset in ``original`` where folded offset ``i`` (``0..len(text)``) starts."""
        if self.starts is None:
            return i
        return self.starts[i] if i < len(self.text) else len(self.original)

    def end(self, i: int) -> int:
        """The offset in ``original`` where a folded span ending at ``i`` ends."""
        if self.ends is None:
            return i
        return self.ends[i - 1] if i > 0 else 0

    def span(self, start: int, end: int) -> tuple[int, int]:
        """Folded characters ``start:end`` as a span of ``original``: it holds every character
        they came from, the format characters between them and those right after them (a cut
        leaves no stray ``U+202E`` or joiner behind)."""
        if end <= start:
            return self.start(start), self.start(start)
        first, last = self.start(start), self.end(end)
        while last < len(self.original) and unicodedata.category(self.original[last]) == "Cf":
            last += 1
        return first, last


def _clusters(text: str) -> list[tuple[int, int]]:
    """``text`` cut into a character and the combining marks after it (start, end)."""
    bounds, i = [], 0
    while i < len(text):
        j = i + 1
        while j < len(text) and unicodedata.combining(text[j]):
            j += 1
        bounds.append((i, j))
        i = j
    return bounds


def _fold_cluster(cluster: str, bidi: str) -> str:
    """A character with its combining marks, folded; marks on a Latin letter are dropped."""
    if cluster[0] in BIDI:
        return bidi
    if unicodedata.category(cluster[0]) == "Cf":
        return ""
    chars = [
        CONFUSABLES.get(ch, ch)
        for ch in unicodedata.normalize("NFKD", cluster)
        if unicodedata.category(ch) != "Cf"
    ]
    if all(ch.isascii() or unicodedata.combining(ch) for ch in chars):
        return "".join(ch for ch in chars if ch.isascii())
    return unicodedata.normalize("NFKC", "".join(chars))


def fold(text: str, bidi: str = " ") -> Folded:
    """``text`` as a reader sees it (see the module docstring), with the map back to it;
    ``bidi``: what a bidirectional control becomes (a space: it splits words; ``""``: it joins
    them, as it shows between Latin letters)."""
    if text.isascii():
        return Folded(text, text)
    parts, starts, ends = [], [], []
    for start, end in _clusters(text):
        out = _fold_cluster(text[start:end], bidi)
        parts.append(out)
        starts += [start] * len(out)
        ends += [end] * len(out)
    folded = "".join(parts)
    if folded == text:
        return Folded(text, text)
    return Folded(text, folded, tuple(starts), tuple(ends))


def shown_order(text: str) -> str:
    """``text`` with what each right-to-left override (U+202E) governs reversed, up to a pop
    (U+202C), a line break or the end: the order in which Latin letters are shown."""
    out, i = [], 0
    while (j := text.find(RLO, i)) >= 0:
        stop = min((k for k in (text.find(PDF, j), text.find("\n", j)) if k >= 0), default=-1)
        stop = len(text) if stop < 0 else stop
        out += [text[i:j], " ", text[j + 1 : stop][::-1], " "]
        i = stop + (stop < len(text) and text[stop] == PDF)
    out.append(text[i:])
    return "".join(out)


def folds(text: str) -> tuple[Folded, ...]:
    """The ways to read ``text`` in its stored order: :func:`fold` with the bidirectional
    controls as word breaks and, when it holds any, with them joining the words around them
    ("per\\u200eson" shows "person", "A\\u202eperson" shows "A" and a reversed run)."""
    split = fold(text)
    if not BIDI.intersection(text):
        return (split,)
    return split, fold(text, bidi="")


def readings(text: str) -> tuple[str, ...]:
    """Every text a reader may see in ``text``, distinct: its :func:`folds` and, when it holds
    a right-to-left override, the folds of its :func:`shown_order`. A class word found in any
    of them is named."""
    found = [f.text for f in folds(text)]
    if RLO in text:
        found += [f.text for f in folds(shown_order(text))]
    return tuple(dict.fromkeys(found))


__all__ = ["BIDI", "CONFUSABLES", "Folded", "fold", "folds", "readings", "shown_order"]
