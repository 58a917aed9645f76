"""Optional clean-up after ``np-removal``: drop the words a cut left dangling.

Cutting a noun phrase can orphan the word that governed it: "Two dogs fighting over a
frisbee" minus frisbee gives "Two dogs fighting over."; "A bowl of oranges and bananas on the
counter" minus both fruits gives "A bowl of and on the counter.". :func:`repair_caption` parses
the rewritten caption (POS and dependencies; spaCy's fast POS path is enough) and, at each cut
point, removes what dangles there:

- before a cut: a preposition (``ADP``), determiner (``DET``) or conjunction (``CCONJ``) that
  is followed by something it cannot govern (the end of the caption, punctuation, another
  preposition or conjunction; for ``ADP`` and ``DET`` anything but the start of a noun phrase,
  adverbs skipped), and a comma left before the end. A multi-word preposition goes whole
  ("next to", "in front of", "on top of", ...). Words exposed by a removal are checked again,
  except that a particle (dependency ``prt``) that did not touch a cut stays ("looking down").
- after a cut: a conjunction that lost its left conjunct ("with [a cat] and a dog" -> "with a
  dog"), an "of" that lost its noun ("above [a cup] of espresso" -> "above espresso"), and at
  the start of the caption a leading conjunction or comma ("[A cat] and a dog" -> "A dog").

Nothing else changes: a caption with nothing dangling comes back as it is, and a repair that
would leave no word returns the caption unrepaired.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from counterfactual.text.tidy import has_words, tidy

_FUNCTION = frozenset({"ADP", "DET", "CCONJ"})
_NOMINAL = frozenset({"DET", "NOUN", "PROPN", "PRON", "NUM", "ADJ", "X"})
_CONJUNCT = frozenset({"NOUN", "PROPN", "PRON", "NUM"})
_COMMAS = frozenset({",", ";", ":", "-", "--"})
_FINAL = frozenset({".", "!", "?", "...", '"', "'", ")", "]"})
# Multi-word prepositions whose first words mean nothing once the last one goes.
MULTIWORD_PREPOSITIONS: tuple[tuple[str, ...], ...] = (
    ("in", "front", "of"),
    ("on", "top", "of"),
    ("in", "the", "middle", "of"),
    ("next", "to"),
    ("close", "to"),
    ("out", "of"),
    ("ahead", "of"),
    ("instead", "of"),
    ("because", "of"),
    ("away", "from"),
    ("across", "from"),
    ("along", "with"),
    ("together", "with"),
)


class _Tokens:
    """The parsed caption with a keep flag per token."""

    def __init__(self, doc: Any) -> None:
        self.tokens = [t for t in doc]
        self.keep = [not t.is_space for t in self.tokens]

    def prev(self, j: int) -> int | None:
        """The last kept token before index ``j``."""
        for i in range(min(j, len(self.tokens)) - 1, -1, -1):
            if self.keep[i]:
                return i
        return None

    def next(self, j: int) -> int | None:
        """The first kept token at or after index ``j``."""
        for i in range(max(j, 0), len(self.tokens)):
            if self.keep[i]:
                return i
        return None

    def at_end(self, j: int | None) -> bool:
        """Only closing punctuation (or nothing) is kept from ``j`` on."""
        if j is None:
            return True
        return all(
            not k or t.text in _FINAL for t, k in zip(self.tokens[j:], self.keep[j:], strict=True)
        )

    def nominal_from(self, j: int | None) -> bool:
        """A noun phrase starts at ``j`` (adverbs before it skipped)."""
        while j is not None and self.tokens[j].pos_ == "ADV":
            j = self.next(j + 1)
        return j is not None and not self.at_end(j) and self.tokens[j].pos_ in _NOMINAL

    def drop(self, i: int) -> None:
        self.keep[i] = False
        word = self.tokens[i].lower_
        for phrase in MULTIWORD_PREPOSITIONS:
            if phrase[-1] != word:
                continue
            found, j = [], i
            for w in reversed(phrase[:-1]):
                j = self.prev(j)  # type: ignore[assignment]
                if j is None or self.tokens[j].lower_ != w:
                    break
                found.append(j)
            else:
                for j in found:
                    self.keep[j] = False
                return


def _dangles_before(tokens: _Tokens, a: int, b: int | None, adjacent: bool) -> bool:
    """Does token ``a``, now followed by ``b``, dangle?"""
    t = tokens.tokens[a]
    end = tokens.at_end(b)
    if t.text in _COMMAS:
        return end or (b is not None and tokens.tokens[b].pos_ == "PUNCT")
    if t.pos_ not in _FUNCTION:
        return False
    if t.pos_ == "CCONJ":
        return end or tokens.tokens[b].pos_ in ("ADP", "CCONJ", "SCONJ", "PART", "PUNCT")  # type: ignore[index]
    if t.pos_ == "ADP" and t.dep_ == "prt" and not adjacent:
        return False  # a particle the cut did not touch: "looking down"
    return end or not tokens.nominal_from(b)


def _dangles_after(tokens: _Tokens, a: int | None, b: int) -> bool:
    """Does token ``b``, now preceded by ``a`` (``None``: the start), dangle?"""
    t = tokens.tokens[b]
    if a is None:
        return t.pos_ == "CCONJ" or t.text in _COMMAS or t.lower_ == "of"
    left = tokens.tokens[a]
    if t.lower_ == "of":
        return left.pos_ not in _CONJUNCT  # its noun was cut and none is left to attach to
    if t.pos_ != "CCONJ" or left.pos_ in _CONJUNCT or left.text in _COMMAS:
        return False  # another conjunct or a list is still there
    return tokens.nominal_from(tokens.next(b + 1))


def repair_caption(text: str, doc_or_nlp: Any, cuts: Sequence[int] | None = None) -> str:
    """``text`` without the words left dangling at its cut points (see the module doc).

    ``doc_or_nlp`` is the spaCy ``Doc`` of ``text`` or a pipeline to parse it with (tagger and
    parser needed, lemmas not). ``cuts`` are character offsets into ``text`` where phrases were
    cut out (``len(text)`` or the offset of the final period for a cut at the end); ``None``
    means the end of the caption only, and then its last word counts as untouched by a cut (a
    final particle stays). Returns ``text`` itself when nothing dangles or when the repair would
    leave no word.
    """
    doc = doc_or_nlp(text) if hasattr(doc_or_nlp, "pipe") else doc_or_nlp
    if doc.text != text:
        raise ValueError(f"the parse is of {doc.text!r}, not of {text!r}")
    tokens = _Tokens(doc)
    n = len(tokens.tokens)
    if cuts is None:
        end = n
        while end > 0 and (doc[end - 1].is_space or doc[end - 1].text in _FINAL):
            end -= 1
        points = [end]
        adjacent: set[int] = set()
    else:
        points = sorted({next((i for i, t in enumerate(doc) if t.idx >= c), n) for c in cuts})
        adjacent = {i for j in points if (i := tokens.prev(j)) is not None}
    changed = True
    while changed:
        changed = False
        for j in points:
            a, b = tokens.prev(j), tokens.next(j)
            if b is not None and not tokens.at_end(b) and _dangles_after(tokens, a, b):
                tokens.drop(b)
                changed = True
            elif a is not None and _dangles_before(tokens, a, b, a in adjacent):
                tokens.drop(a)
                changed = True
    if all(tokens.keep[i] or tokens.tokens[i].is_space for i in range(n)):
        return text
    out = tidy(
        "".join(t.text_with_ws for t, k in zip(tokens.tokens, tokens.keep, strict=True) if k),
        capitalize=text[:1].isupper(),
    )
    return out if has_words(out) else text


def cut_offsets(pieces: Sequence[str], text: str) -> list[int]:
    """Where the cuts between ``pieces`` (the caption's parts left around the removed phrases,
    in order) fall in ``text``, the tidied join of the pieces: the offset just after the last
    letter or digit before each cut. Tidying never removes letters or digits, so counting them
    finds the place."""
    marks, count = [], 0
    for piece in pieces[:-1]:
        count += sum(ch.isalnum() for ch in piece)
        marks.append(count)
    out, seen, pos = [], 0, 0
    for mark in marks:
        while seen < mark and pos < len(text):
            seen += text[pos].isalnum()
            pos += 1
        out.append(pos)
    return out


__all__: Sequence[str] = ("MULTIWORD_PREPOSITIONS", "cut_offsets", "repair_caption")
