"""Clean-up after ``np-removal`` (on by default, ``TextConfig.repair``): drop the words a cut
left dangling.

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
- right at a cut, whatever its tag: a preposition of :data:`PREPOSITIONS` (spaCy tags "beside"
  at the end of "parked in a garage beside" as an adverb) and a conjunction, each followed by
  no noun phrase ("a suit and [tie] standing" -> "a suit standing"); the same word on both
  sides of a cut once ("on [a tripod] on a lawn" -> "on a lawn").

Then the list the cut shortened is mended: when a conjunction went, the comma before the last
conjunct left takes its word ("a cup, a saucer and [a teaspoon]" -> "a cup and a saucer"), a
list left with two conjuncts loses its comma ("a couch, [a chair], and a tv" -> "a couch and a
tv"), and
a "between" or "among" left with one singular object near a cut becomes "beside" ("between [a
flag] and a model" -> "beside a model").

Nothing else changes: a caption with nothing dangling comes back as it is, and a repair that
would leave no word but function words ("With.", "On.") returns ``""``: no caption is left.
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


PREPOSITIONS = frozenset(
    "about above across after against along alongside amid among amongst around at atop before "
    "behind below beneath beside besides between beyond by down for from in inside into near "
    "of off on onto opposite out outside over past round through throughout to toward towards "
    "under underneath up upon via with within without".split()
)
"""Words that govern a noun phrase: right before a cut with no noun phrase after them they
dangle, whatever spaCy tags them."""
_PAIRED = frozenset({"between", "among", "amongst"})
_LIST_WORDS = frozenset({"DET", "ADJ", "NOUN", "PROPN", "NUM"})


class _Tokens:
    """The parsed caption with a keep flag per token and words to put in place of others."""

    def __init__(self, doc: Any) -> None:
        self.tokens = [t for t in doc]
        self.keep = [not t.is_space for t in self.tokens]
        self.replace: dict[int, str] = {}

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
        """A noun phrase starts at ``j`` (adverbs before it skipped; "next to" is none)."""
        while j is not None and self.tokens[j].pos_ == "ADV":
            j = self.next(j + 1)
        if j is None or self.at_end(j) or self.tokens[j].pos_ not in _NOMINAL:
            return False
        return not self.multiword_from(j)

    def multiword_from(self, j: int) -> bool:
        """A multi-word preposition starts at ``j`` ("next to", "in front of")."""
        for phrase in MULTIWORD_PREPOSITIONS:
            k: int | None = j
            for w in phrase:
                if k is None or self.tokens[k].lower_ != w:
                    break
                k = self.next(k + 1)
            else:
                return True
        return False

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
    """Does token ``a``, now followed by ``b``, dangle? ``adjacent``: ``a`` was right before
    a cut."""
    t = tokens.tokens[a]
    end = tokens.at_end(b)
    if t.text in _COMMAS:
        if end or (b is not None and tokens.tokens[b].pos_ == "PUNCT"):
            return True
        # "Bananas, [apples] and [oranges] in a bowl": the list the comma began is gone
        return adjacent and tokens.tokens[b].pos_ in ("ADP", "CCONJ")  # type: ignore[index]
    if adjacent and t.pos_ not in _FUNCTION and t.lower_ in PREPOSITIONS:
        return end or not tokens.nominal_from(b)  # "parked in a garage beside [a bench]."
    if t.pos_ not in _FUNCTION:
        return False
    if t.pos_ == "CCONJ":
        if end or tokens.tokens[b].pos_ in ("ADP", "CCONJ", "SCONJ", "PART", "PUNCT"):  # type: ignore[index]
            return True
        return adjacent and not tokens.nominal_from(b)  # "a suit and [tie] standing"
    if t.pos_ == "ADP" and t.dep_ == "prt" and not adjacent:
        return False  # a particle the cut did not touch: "looking down"
    return end or not tokens.nominal_from(b)


def _dangles_after(tokens: _Tokens, a: int | None, b: int) -> bool:
    """Does token ``b``, now preceded by ``a`` (``None``: the start), dangle?"""
    t = tokens.tokens[b]
    if a is None:
        return t.pos_ == "CCONJ" or t.text in _COMMAS or t.lower_ == "of"
    if t.text in _COMMAS:  # "Bananas, [apples] and [oranges] in a bowl": the list is gone
        after = tokens.next(b + 1)
        return after is not None and tokens.tokens[after].pos_ in ("ADP", "CCONJ")
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
    final particle stays). Returns ``text`` itself when nothing dangles, ``""`` when the repair
    would leave no word but dangling ones.
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
    conjunctions: list[int] = []  # conjunctions dropped before a cut: their list is mended
    changed = True
    while changed:
        changed = False
        for j in points:
            a, b = tokens.prev(j), tokens.next(j)
            if b is not None and not tokens.at_end(b) and _dangles_after(tokens, a, b):
                tokens.drop(b)
                changed = True
            elif a is not None and _dangles_before(tokens, a, b, a in adjacent):
                if tokens.tokens[a].pos_ == "CCONJ":
                    conjunctions.append(a)
                tokens.drop(a)
                changed = True
            elif a is not None and b is not None and _doubled(tokens, a, b):
                tokens.drop(a)
                changed = True
    for i in conjunctions:
        _mend_list(tokens, i)
    for j in points:
        _two_left(tokens, j)
    for j in points:
        _one_of_a_pair(tokens, j)
    if not tokens.replace and all(tokens.keep[i] or tokens.tokens[i].is_space for i in range(n)):
        return text
    out = tidy("".join(_kept_text(tokens)), capitalize=text[:1].isupper())
    return out if has_words(out) and _content(out) else ""


def _kept_text(tokens: _Tokens) -> list[str]:
    """The kept tokens with their replacements and whitespace; a token whose next one went is
    followed by a space ("stove[, ]and" stays two words; tidy drops a space before a stop)."""
    out = []
    for i, (t, k) in enumerate(zip(tokens.tokens, tokens.keep, strict=True)):
        if not k:
            continue
        word = tokens.replace.get(i, t.text)
        gap = t.whitespace_ or (" " if i + 1 < len(tokens.keep) and not tokens.keep[i + 1] else "")
        out.append(word + gap)
    return out


def _content(text: str) -> bool:
    """``text`` has a word that is not a preposition, article or conjunction."""
    words = [w for w in text.lower().replace(".", " ").split() if any(c.isalnum() for c in w)]
    return any(w not in PREPOSITIONS and w not in _EMPTY_WORDS for w in words)


_EMPTY_WORDS = frozenset({"a", "an", "the", "and", "or", "but", "next", "front", "top"})


def _doubled(tokens: _Tokens, a: int, b: int) -> bool:
    """The same word on both sides of a cut ("on [a tripod] on a lawn")."""
    ta, tb = tokens.tokens[a], tokens.tokens[b]
    return ta.is_alpha and ta.lower_ == tb.lower_


def _mend_list(tokens: _Tokens, cc: int) -> None:
    """The conjunction ``cc`` went with the last conjunct of "A, B and [C]": the comma before B
    takes its word ("A and B"), when the parse makes B a conjunct (or an apposition)."""
    k, conjunct = tokens.prev(cc), False
    while k is not None and tokens.tokens[k].pos_ in _LIST_WORDS:
        conjunct = conjunct or tokens.tokens[k].dep_ in ("conj", "appos")
        k = tokens.prev(k)
    if k is None or tokens.tokens[k].text != "," or not conjunct:
        return
    before = tokens.prev(k)
    if before is not None and tokens.tokens[before].pos_ in _CONJUNCT:
        tokens.replace[k] = " " + tokens.tokens[cc].lower_


def _two_left(tokens: _Tokens, j: int) -> None:
    """A comma before the conjunction of a list the cut at token ``j`` left with two
    conjuncts goes ("a couch, [a chair] and a tv" -> "a couch and a tv")."""
    for i in range(max(0, j - 8), min(j + 8, len(tokens.tokens))):
        t = tokens.tokens[i]
        if not tokens.keep[i] or t.pos_ != "CCONJ" or t.head.pos_ not in _CONJUNCT:
            continue
        comma = tokens.prev(i)
        if comma is None or tokens.tokens[comma].text != ",":
            continue
        kept = [c for c in (t.head, *t.head.conjuncts) if tokens.keep[c.i]]
        if len(kept) == 2:
            tokens.keep[comma] = False


def _one_of_a_pair(tokens: _Tokens, j: int) -> None:
    """A "between" near the cut at token ``j`` whose object is now one singular noun phrase
    becomes "beside"."""
    for i in range(max(0, j - 8), min(j + 1, len(tokens.tokens))):
        t = tokens.tokens[i]
        if not tokens.keep[i] or t.lower_ not in _PAIRED:
            continue
        k, last = tokens.next(i + 1), None
        while k is not None and tokens.tokens[k].pos_ in _LIST_WORDS:
            last, k = k, tokens.next(k + 1)
        if last is None or k is not None and tokens.tokens[k].pos_ == "CCONJ":
            continue
        if k is not None and k < j:
            continue  # the cut is not in this object
        if tokens.tokens[last].tag_ in ("NN", "NNP"):
            tokens.replace[i] = "beside" if t.text.islower() else "Beside"


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


__all__: Sequence[str] = ("MULTIWORD_PREPOSITIONS", "PREPOSITIONS", "cut_offsets", "repair_caption")
