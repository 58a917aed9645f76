"""``np-removal``: drop the noun phrases that mention a removed class (Kim et al., Sec. 3.3).

COCO-style captions: spaCy ``noun_chunks``; a chunk is dropped when any of its tokens matches a
word of a removed class (see :mod:`counterfactual.vocab`; an entry that runs over several
chunks, "Two glasses of wine", drops them and the words between them as one phrase), and so is
a class word outside every chunk ("tie" in "a suit and tie"). Flickr30k captions carry
annotated phrases with types: a phrase is dropped when one of its types is removed, without parsing.
With ``TextConfig.repair`` (the default) the rewritten captions are parsed once more and the
words left dangling at the cuts are dropped (:mod:`counterfactual.text.repair`).

Captions are parsed as a reader sees them (:func:`counterfactual.fold.fold`: fullwidth and
compatibility forms, format characters, Greek and Cyrillic lookalikes folded), and the spans
found there are cut from the caption as given, so ``"Ａ ｐｅｒｓｏｎ beside a horse."`` loses
the person and keeps its other characters. :class:`MentionCheck` reads every reading
(:func:`counterfactual.fold.readings`: a right-to-left override's shown order too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from counterfactual.fold import Folded, folds, readings
from counterfactual.models.runtime import check_batch_size
from counterfactual.records import Phrase
from counterfactual.text.base import RewriteRequest, RewriteResult, TextOptions
from counterfactual.text.nlp import default_model_name, load_spacy
from counterfactual.text.repair import cut_offsets, repair_caption
from counterfactual.text.tidy import has_words, tidy
from counterfactual.vocab import ClassVocabulary, Mention, load_vocabulary

EMPTY_CAPTION = "empty-caption"
_JOINERS = frozenset({"-", "--"})
_NOUNS = frozenset({"NOUN", "PROPN", "PRON", "NUM"})
_BEFORE_VERB = frozenset({"MD", "TO", "PRP", "NN", "NNS", "NNP", "NNPS", "RB"})
_MODIFIER_TAGS = frozenset({"DT", "PDT", "CD", "JJ", "JJR", "JJS", "PRP$", "POS"})


class _Chunk:
    """Characters ``start:end`` mention ``classes``; ``lead`` (<= ``start``) also takes the
    conjunction that joins the phrase to the one conjunct before it ("a cat [and a dog]");
    ``tail`` (>= ``end``) also takes the prepositional phrases right after it that belong to
    it (:func:`_tail`: "a rocket [on its launch pad]", "a cup [of coffee]"): cut with it when
    repairing, as they would name what is gone or attach to the noun before."""

    __slots__ = ("start", "end", "classes", "lead", "tail")

    def __init__(
        self, start: int, end: int, classes: frozenset[str], lead: int, tail: int | None = None
    ) -> None:
        self.start, self.end, self.classes, self.lead = start, end, classes, lead
        self.tail = end if tail is None else tail

    def mapped(self, folded: Folded) -> _Chunk:
        """This chunk, found in ``folded.text``, as a span of ``folded.original``."""
        start, end = folded.span(self.start, self.end)
        tail = folded.span(self.start, self.tail)[1]
        return _Chunk(start, end, self.classes, folded.start(self.lead), tail)


def chunk_mentions(doc: Any, vocabulary: ClassVocabulary) -> tuple[_Chunk, ...]:
    """The noun chunks of a parsed ``doc`` that mention a class: character spans and classes.

    Words are matched over the whole ``doc``, so an entry that spaCy splits over several chunks
    is one mention ("Two glasses of wine" is the chunks "Two glasses" and "wine" and matches
    ``glass of wine``): the span then runs from the first chunk it touches to the last, words
    between them included; hyphens are skipped ("a hot-dog stand" names a hot dog). A mention
    that touches no noun chunk still counts unless it reads as a verb ("trains his dog"):
    spaCy's small model tags "tie" in "a suit and tie" as a verb; its span is its own words with
    the determiners, numbers, adjectives and possessives just before them."""
    chunks = [(chunk.start, chunk.end) for chunk in doc.noun_chunks]
    groups: list[tuple[int, int, frozenset[str]]] = []  # token start, end, classes
    words = [t.i for t in doc if t.text not in _JOINERS]  # "hot-dog" is "hot dog"
    for found in vocabulary.match([doc[i].text for i in words]):
        mention = Mention(words[found.start], words[found.end - 1] + 1, found.cls)
        touched = [(s, e) for s, e in chunks if s < mention.end and mention.start < e]
        if touched:
            start, end = min(touched[0][0], mention.start), max(touched[-1][1], mention.end)
        elif _verb(doc, mention.start, mention.end):
            continue  # "A coach trains his dog", "will ski": a verb, not the object
        else:
            start, end = mention.start, mention.end
            floor = max((e for _, e in chunks if e <= start), default=0)
            while start > floor and doc[start - 1].tag_ in _MODIFIER_TAGS:
                start -= 1
        if groups and start < groups[-1][1]:  # the chunk of the mention before
            last_start, last_end, classes = groups[-1]
            groups[-1] = (last_start, max(last_end, end), classes | {mention.cls})
        else:
            groups.append((start, end, frozenset({mention.cls})))
    return tuple(
        _Chunk(
            doc[s:e].start_char,
            doc[s:e].end_char,
            classes,
            doc[_lead(doc, s, e)].idx,
            doc[s : _tail(doc, s, e, classes, vocabulary)].end_char,
        )
        for s, e, classes in groups
    )


_POSSESSIVES = frozenset({"its", "their"})

CONTAINERS = frozenset({"cup", "bowl", "wine glass", "bottle"})
"""The classes whose contents lie inside their outline: erasing one erases what it held, so
"a cup [of coffee]" goes whole (a vase's flowers, a plate's food stand out of it and stay)."""


def _tail(
    doc: Any, start: int, end: int, classes: frozenset[str], vocabulary: ClassVocabulary
) -> int:
    """The token after the prepositional phrases that follow tokens ``start:end`` (naming
    ``classes``) directly, hang on its head noun and belong to it: one that holds "its" or
    "their" ("a rocket [on its launch pad]", "frisbees [in their mouths]"), and, after a
    :data:`CONTAINERS` class, an "of" phrase that names no class ("a cup [of coffee]"; "a bowl
    of bananas" keeps its bananas, annotated as a class of their own); ``end`` when none does."""
    root, tail = doc[start:end].root, end
    container = bool(classes & CONTAINERS)
    for child in root.rights:
        if child.dep_ != "prep" or child.i != tail:
            continue
        words = list(child.subtree)
        held = (
            container
            and child.lower_ == "of"
            and not vocabulary.mentioned(" ".join(t.text for t in words))
        )
        if not held and not any(t.dep_ == "poss" and t.lower_ in _POSSESSIVES for t in words):
            break
        tail = child.right_edge.i + 1
    return tail


def _distinct(chunks: list[_Chunk]) -> tuple[_Chunk, ...]:
    """``chunks`` found in the :func:`~counterfactual.fold.folds` of one caption, in caption
    order, each span once (a caption without bidirectional controls has one fold: as found)."""
    seen: dict[tuple[int, int], _Chunk] = {}
    for c in sorted(chunks, key=lambda c: (c.start, c.end)):
        seen.setdefault((c.start, c.end), c)
    return tuple(seen.values())


def _lead(doc: Any, start: int, end: int) -> int:
    """``start - 1`` when tokens ``start:end`` are the whole second of two conjuncts and a
    conjunction after a noun joins them ("A cat and a dog, sleeping"), else ``start``: a repaired cut takes
    the conjunction along, which the parse of the cut caption may not see ("A cat and
    sleeping" reads "sleeping" as a noun)."""
    if start < 2 or doc[start - 1].pos_ != "CCONJ" or doc[start - 2].pos_ not in _NOUNS:
        return start
    root = doc[start:end].root
    if root.dep_ != "conj" or len(root.head.conjuncts) != 1 or root.right_edge.i >= end:
        return start  # a list, or the conjunct goes on after the cut ("a cup [of tea]")
    return start - 1


def _verb(doc: Any, start: int, end: int) -> bool:
    """Tokens ``start:end``, in no noun chunk, read as a verb: a finite or participle tag, or
    the base form after a modal, "to" or a subject ("will ski"); "a suit and tie" is no verb."""
    tag = doc[end - 1].tag_
    if tag in ("VBZ", "VBD", "VBG", "VBN", "VBP"):
        return True
    return tag == "VB" and start > 0 and doc[start - 1].tag_ in _BEFORE_VERB


class MentionCheck:
    """Which removed classes a new caption still names, by the matcher of ODmAP's mention index
    (:class:`counterfactual.eval.mentions.MentionIndexer`): :func:`chunk_mentions` over the
    same spaCy parse. Captions with no word of a removed class need no parse, and spaCy is
    loaded at the first one that does."""

    def __init__(self, vocabulary: ClassVocabulary, spacy_model: str | None = None) -> None:
        self.vocabulary = vocabulary
        self.spacy_model = spacy_model
        self._nlp: Any = None

    def __call__(
        self, texts: Sequence[str | None], removed: Sequence[Sequence[str]]
    ) -> list[list[str]]:
        """For each text (``None``: no caption) the classes of its ``removed`` it names, in
        ``removed`` order."""
        todo = [
            i
            for i, (t, r) in enumerate(zip(texts, removed, strict=True))
            if t is not None and self.vocabulary.may_mention(t, r)
        ]
        out: list[list[str]] = [[] for _ in texts]
        if not todo:
            return out
        if self._nlp is None:
            self._nlp = load_spacy(self.spacy_model or default_model_name(), fast_pos=True)
        shown = [(i, reading) for i in todo for reading in readings(texts[i] or "")]
        named: dict[int, set[str]] = {i: set() for i in todo}
        for (i, _), doc in zip(shown, self._nlp.pipe([r for _, r in shown]), strict=True):
            named[i].update(*(c.classes for c in chunk_mentions(doc, self.vocabulary)))
        for i in todo:
            out[i] = [c for c in removed[i] if c in named[i]]
        return out


class NounPhraseRemover:
    """Callable rewriter matching the classes of ``vocabulary`` (default: COCO's); spaCy parses
    ``batch_size`` captions at a time, and parses are cached per caption text (a caption serves
    many plans)."""

    def __init__(
        self,
        config: TextOptions | None = None,
        vocabulary: ClassVocabulary | None = None,
        cache_size: int = 100_000,
        batch_size: int = 256,
    ) -> None:
        self.batch_size = check_batch_size(batch_size)
        self.config = config or TextOptions()
        self.vocabulary = vocabulary or load_vocabulary()
        self.model_name = self.config.spacy_model or default_model_name()
        self.nlp = load_spacy(self.model_name, fast_pos=True)
        self._cache: OrderedDict[str, tuple[str, tuple[_Chunk, ...]]] = OrderedDict()
        self._cache_size = cache_size

    def describe(self) -> dict[str, Any]:
        return {
            "method": "np-removal",
            "spacy_model": self.model_name,
            "repair": self.config.repair,
        }

    def chunks(self, texts: Sequence[str]) -> list[tuple[str, tuple[_Chunk, ...]]]:
        """For each text: the text with its noun chunks (character spans of the text and the
        classes they mention; found in its :func:`~counterfactual.fold.fold`)."""
        known = {t: self._cache[t] for t in dict.fromkeys(texts) if t in self._cache}
        todo = [t for t in dict.fromkeys(texts) if t not in known]
        ways = [way for t in todo for way in folds(t)]
        docs = self.nlp.pipe([f.text for f in ways], batch_size=self.batch_size)
        found: dict[str, list[_Chunk]] = {t: [] for t in todo}
        for folded, doc in zip(ways, docs, strict=True):
            chunks = chunk_mentions(doc, self.vocabulary)
            if folded.starts is not None:
                chunks = tuple(c.mapped(folded) for c in chunks)
            found[folded.original] += chunks
        for text, chunks in found.items():
            known[text] = (text, _distinct(chunks))
        # remember the newest parses; the answer comes from `known`, so eviction loses nothing
        for text in todo:
            self._cache[text] = known[text]
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return [known[t] for t in texts]

    def __call__(self, batch: Sequence[RewriteRequest]) -> list[RewriteResult]:
        need = [
            r.caption
            for r in batch
            if r.phrases is None and self.vocabulary.may_mention(r.caption, r.removed)
        ]
        parsed = dict(zip(need, self.chunks(need), strict=True))
        out, cuts = [], []
        for req in batch:
            shown = None  # the phrases to report as removed, when not the spans cut
            if req.phrases is not None:
                spans = [(p.start, p.end) for p in req.phrases if set(p.types) & set(req.removed)]
            elif req.caption in parsed:
                removed = set(req.removed)
                found = [c for c in parsed[req.caption][1] if c.classes & removed]
                repair = self.config.repair
                spans = [(c.lead, c.tail) if repair else (c.start, c.end) for c in found]
                shown = [(c.start, c.end) for c in found]
            else:
                spans = []
            result, pieces = _cut_pieces(req.caption, spans, shown)
            out.append(result)
            if self.config.repair and result.text is not None and len(pieces) > 1:
                cuts.append((len(out) - 1, cut_offsets(pieces, result.text)))
        if cuts:
            out = self._repair(out, cuts)
        return out

    def _repair(
        self, results: list[RewriteResult], cuts: list[tuple[int, list[int]]]
    ) -> list[RewriteResult]:
        """Drop the words left dangling at the cut points (``TextConfig.repair``)."""
        texts = [results[i].text or "" for i, _ in cuts]
        docs = self.nlp.pipe(texts, batch_size=self.batch_size)
        for (i, offsets), text, doc in zip(cuts, texts, docs, strict=True):
            repaired = repair_caption(text, doc, offsets)
            if repaired:
                results[i] = replace(results[i], text=repaired)
            else:  # nothing but dangling words: "With."
                results[i] = replace(results[i], text=None, reason=EMPTY_CAPTION)
        return results


def _cut(caption: str, spans: list[tuple[int, int]]) -> RewriteResult:
    """Cut ``spans`` (character offsets) and a comma that directly follows each of them."""
    return _cut_pieces(caption, spans)[0]


def _cut_pieces(
    caption: str, spans: list[tuple[int, int]], shown: list[tuple[int, int]] | None = None
) -> tuple[RewriteResult, list[str]]:
    """:func:`_cut`, and the parts of ``caption`` left between the cuts; ``shown``: the
    phrases to report as removed, when not ``spans`` themselves."""
    if not spans:
        return RewriteResult(text=caption), [caption]
    pieces, last = [], 0
    for start, phrase_end in sorted(spans):
        end = phrase_end
        rest = caption[end:]
        if rest.lstrip().startswith(","):
            end += len(rest) - len(rest.lstrip()) + 1
        if start >= last:
            pieces.append(caption[last:start])
            last = end
        else:
            last = max(last, end)
    pieces.append(caption[last:])
    text = tidy(" ".join(pieces), capitalize=caption[:1].isupper())
    removed = tuple(caption[s:e] for s, e in sorted(spans if shown is None else shown))
    if not has_words(text):
        return RewriteResult(text=None, removed_phrases=removed, reason=EMPTY_CAPTION), pieces
    return RewriteResult(text=text, removed_phrases=removed), pieces


def remove_phrases(
    caption: str, phrases: Sequence[Phrase], removed: Sequence[str]
) -> RewriteResult:
    """Cut the annotated ``phrases`` whose types intersect ``removed`` (Flickr30k)."""
    return _cut(caption, [(p.start, p.end) for p in phrases if set(p.types) & set(removed)])
