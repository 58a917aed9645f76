"""The rule set a rewritten caption must pass to count as fluent, as code.

A cut can leave words that make a caption broken English; :func:`fluency_problems` finds them
in a spaCy ``Doc`` (POS tags and tags; the remover's fast path is enough):

- ``dangling-word``: an article (a, an, the), a conjunction or a preposition that governs
  nothing: followed by the end of the caption or punctuation ("a saucer and.", "garage
  beside."; a verb particle such as "lying down." is fine), an article or a preposition of
  :data:`NEEDS_OBJECT` followed by a preposition, "next to" or a conjunction ("a photo of on
  its pad"), a
  conjunction followed by another or at the start ("And a dog.").
- ``doubled-word``: the same word twice in a row ("on on a grassy lawn").
- ``orphan-comma``: a comma at the start, before other punctuation or at the end, or before
  the conjunction of a list of two noun phrases ("a dog, and a bird").
- ``lone-between``: "between" or "among" with one singular noun phrase as object ("stands
  between a model").

The rules are meant to flag what a cut breaks, not to judge style: human-written COCO
captions pass them (the benchmark's caption corpus checks its originals too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

ARTICLES = frozenset({"a", "an", "the"})
NEEDS_OBJECT = frozenset(
    "of with at beside between into onto near toward towards among amongst from atop "
    "underneath upon via".split()
)
"""Prepositions that take a noun phrase, never another preposition (unlike "from behind")."""
_PREPOSITIONS = NEEDS_OBJECT | frozenset(
    "above across against along around behind below beneath by for in inside on outside over "
    "through to under".split()
)
_NP_WORDS = frozenset({"DET", "ADJ", "NOUN", "PROPN", "NUM"})
_STOPS = frozenset({".", "!", "?", ",", ";", ":", "...", ")", "]", '"'})
RULES = ("dangling-word", "doubled-word", "orphan-comma", "lone-between")


@dataclass(frozen=True, slots=True)
class FluencyProblem:
    """Rule ``rule`` (one of :data:`RULES`) fails at token ``index``, the word ``word``."""

    rule: str
    index: int
    word: str


def fluency_problems(doc: Any) -> list[FluencyProblem]:
    """Every rule of the module doc that the parsed caption ``doc`` breaks, in token order."""
    tokens = [t for t in doc if not t.is_space]
    out: list[FluencyProblem] = []
    for i, t in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        end = nxt is None or nxt.text in _STOPS
        word = t.lower_
        if t.text == ",":
            if i == 0 or end or _comma_of_two(nxt) and not _list_before(tokens, i):
                out.append(FluencyProblem("orphan-comma", i, t.text))
            continue
        if nxt is not None and t.is_alpha and word == nxt.lower_:
            out.append(FluencyProblem("doubled-word", i, t.text))
        if _dangles(t, nxt, end, i == 0):
            out.append(FluencyProblem("dangling-word", i, t.text))
        if word in ("between", "among", "amongst") and _one_singular_object(tokens, i):
            out.append(FluencyProblem("lone-between", i, t.text))
    return out


def _comma_of_two(nxt: Any) -> bool:
    """The comma comes before the conjunction of a list of two noun phrases ("a dog, and a
    cat")."""
    if nxt is None or nxt.pos_ != "CCONJ" or nxt.head.pos_ not in ("NOUN", "PROPN"):
        return False
    return len(nxt.head.conjuncts) == 1 and nxt.head.conjuncts[0].i > nxt.i


def _list_before(tokens: Sequence[Any], i: int) -> bool:
    """Another comma ends the noun phrase before the comma at ``i`` ("a, b, and c")."""
    k = i - 1
    while k >= 0 and tokens[k].pos_ in _NP_WORDS:
        k -= 1
    return k >= 0 and tokens[k].text == ","


def _governs_nothing(nxt: Any) -> bool:
    """``nxt`` cannot start the object of an article or preposition."""
    if nxt.pos_ in ("ADP", "CCONJ"):
        return True
    after = nxt.nbor(1) if nxt.i + 1 < len(nxt.doc) else None
    return nxt.lower_ == "next" and after is not None and after.lower_ == "to"


def _dangles(t: Any, nxt: Any, end: bool, first: bool) -> bool:
    word, pos = t.lower_, t.pos_
    if pos == "CCONJ":
        return first or end or nxt.pos_ == "CCONJ"
    if word in ARTICLES:
        return end or _governs_nothing(nxt)
    if word in NEEDS_OBJECT:
        return end or first and word == "of" or _governs_nothing(nxt)
    if word in _PREPOSITIONS and pos == "ADP" and t.dep_ != "prt":
        return end
    return False


def _one_singular_object(tokens: Sequence[Any], i: int) -> bool:
    k, last = i + 1, None
    while k < len(tokens) and tokens[k].pos_ in _NP_WORDS:
        last, k = tokens[k], k + 1
    if last is None or k < len(tokens) and tokens[k].pos_ == "CCONJ":
        return False
    return last.tag_ in ("NN", "NNP")


def is_fluent(text: str, nlp: Any) -> bool:
    """Whether ``text`` breaks none of the rules, parsed with the spaCy pipeline ``nlp``."""
    return not fluency_problems(nlp(text))


@dataclass(frozen=True, slots=True)
class CaptionQuality:
    """How a rewriter did on a set of captions, as shares of all of them."""

    captions: int
    fully_removed: float
    """No removed class is named any more (:meth:`ClassVocabulary.mentioned`); a caption
    with no words left counts as removed."""
    fluent: float
    """The rewrite breaks none of :data:`RULES` (an empty result counts as not fluent)."""
    unchanged: float
    """The rewrite is the caption itself."""
    empty: float
    """No caption was left."""
    originals_fluent: float
    """The originals that pass the rules: the rule set's false alarms are ``1 -`` this."""


def caption_quality(
    captions: Sequence[str],
    removed: Sequence[Sequence[str]],
    rewritten: Sequence[str | None],
    vocabulary: Any,
    nlp: Any,
) -> CaptionQuality:
    """Score ``rewritten[i]``, the rewrite of ``captions[i]`` without the classes
    ``removed[i]`` (``None``: no caption left), with ``vocabulary``'s matcher and the rules
    parsed by ``nlp``."""
    n = len(captions)
    if not n or len(removed) != n or len(rewritten) != n:
        raise ValueError(f"need as many rewrites and class lists as captions, got {n}")
    texts = [t for t in rewritten if t is not None]
    ok = {t: not fluency_problems(d) for t, d in zip(texts, nlp.pipe(texts), strict=True)}
    originals = sum(not fluency_problems(d) for d in nlp.pipe(list(captions)))
    gone = sum(
        t is None or not (vocabulary.mentioned(t) & set(r))
        for t, r in zip(rewritten, removed, strict=True)
    )
    return CaptionQuality(
        captions=n,
        fully_removed=gone / n,
        fluent=sum(t is not None and ok[t] for t in rewritten) / n,
        unchanged=sum(t == c for t, c in zip(rewritten, captions, strict=True)) / n,
        empty=sum(t is None for t in rewritten) / n,
        originals_fluent=originals / n,
    )


__all__: Sequence[str] = (
    "ARTICLES",
    "NEEDS_OBJECT",
    "RULES",
    "CaptionQuality",
    "FluencyProblem",
    "caption_quality",
    "fluency_problems",
    "is_fluent",
)
