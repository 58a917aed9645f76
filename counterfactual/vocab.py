"""Class word lists and matching of class mentions in text.

A vocabulary file has one class per line: ``class name, word, word, ...`` (the first entry is
the class name; entries may be several words, e.g. ``hot dog`` or ``glass of wine``; lines
starting with ``#`` are comments). The COCO lists ship with the package
(``data/coco_synonyms.txt``, Rohrbach et al. 2018, BSD-2-Clause, see ``data/NOTICE.md``), and so
do the words the examples of seed 002 need on top of them (``data/paper_synonyms.txt``:
"equestrian" is a person, "glasses of wine" a wine glass, "bat" a baseball bat), and the
compounds and hyponyms a careful annotator counts (``data/annotator_synonyms.txt``: "teaspoon"
is a spoon, "armchair" a chair, "necktie" a tie), which :func:`coco_vocabulary` adds by default.

Matching works on tokens: a span of tokens matches an entry when the tokens' lower-cased text,
or their lemmas, or the text with the last token lemmatised, equal the entry's words (so
"glasses of wine" matches ``glass of wine``). The longest entry wins, so "hot dogs" is a hot dog
and not a dog. Text is matched as a reader sees it (:func:`counterfactual.fold.readings`:
fullwidth and compatibility forms, format characters and Greek or Cyrillic lookalikes folded), so
``"Ａ ｐｅｒｓｏｎ"``, ``"A\u202eperson"`` and ``"Ρerson"`` (a Greek Rho) name a person.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from counterfactual.fold import readings

_IRREGULAR_PLURALS = {
    "child": "children",
    "person": "people",
    "man": "men",
    "woman": "women",
    "mouse": "mice",
    "goose": "geese",
    "foot": "feet",
    "tooth": "teeth",
    "ox": "oxen",
    "die": "dice",
    "cactus": "cacti",
    "fungus": "fungi",
}
_WORD = re.compile(r"[a-z0-9]+")


def surface_forms(word: str) -> set[str]:
    """A superset of the inflected forms of an English noun ``word`` (lower case)."""
    forms = {word, word + "s", word + "es"}
    if word.endswith("y"):
        forms.add(word[:-1] + "ies")
    if word.endswith("f"):
        forms.add(word[:-1] + "ves")
    if word.endswith("fe"):
        forms.add(word[:-2] + "ves")
    if word.endswith("man"):
        forms.add(word[:-3] + "men")
    if word in _IRREGULAR_PLURALS:
        forms.add(_IRREGULAR_PLURALS[word])
    return forms


@dataclass(frozen=True, slots=True)
class Mention:
    """Tokens ``start:end`` of a token sequence mention ``cls``."""

    start: int
    end: int
    cls: str


class ClassVocabulary:
    """Word lists per class and the matcher built from them."""

    def __init__(self, words: dict[str, Sequence[str]]) -> None:
        entries: dict[tuple[str, ...], str] = {}
        surface: dict[str, set[str]] = {}
        base: dict[str, str] = {}
        for cls, items in words.items():
            forms: set[str] = set()
            for item in (cls, *items):
                key = tuple(item.lower().split())
                if not key:
                    continue
                if key in entries and entries[key] != cls:
                    raise ValueError(
                        f"word {' '.join(key)!r} is listed for both {entries[key]!r} and {cls!r}"
                    )
                entries[key] = cls
                # a mention of the entry holds all its words: one of them (the longest, the
                # last of equals) suffices for the cheap test, and spares "of" in "glass of wine"
                forms |= surface_forms(max(reversed(key), key=len))
                for token in key:
                    for form in surface_forms(token):
                        base.setdefault(form, token)
            surface[cls] = forms
        self.classes: tuple[str, ...] = tuple(words)
        self._entries = entries
        self._surface = surface
        self._base = base
        self._max_len = max((len(k) for k in entries), default=1)

    @classmethod
    def from_file(cls, path: str | Path, extra: Sequence[str | Path] = ()) -> ClassVocabulary:
        """The vocabulary in ``path``, with the words of each ``extra`` file (same format) added
        to the classes they name. ``ValueError`` names the file and line of a class listed
        twice in one file, or of an ``extra`` class that ``path`` lacks."""
        words = {name: items for name, (_, items) in _read_words(path).items()}
        for more in extra:
            for name, (lineno, items) in _read_words(more).items():
                if name not in words:
                    raise ValueError(
                        f"{more}:{lineno}: class {name!r} is not in {path}; extra word lists "
                        "may only add words to its classes"
                    )
                words[name] = list(dict.fromkeys([*words[name], *items]))
        return cls(words)

    def lacking(self, classes: Iterable[str]) -> tuple[str, ...]:
        """The classes of ``classes`` this vocabulary has no words for, sorted, each once: a
        caption cannot be matched for them (np-removal would keep it whole, and no check
        would see the class named)."""
        return tuple(sorted(set(classes) - set(self.classes)))

    def words(self, cls: str) -> tuple[str, ...]:
        return tuple(" ".join(k) for k, c in self._entries.items() if c == cls)

    def may_mention(self, text: str, classes: Iterable[str]) -> bool:
        """False only when ``text`` certainly mentions none of ``classes`` (no word of theirs in
        any inflection occurs in any of its :func:`~counterfactual.fold.readings`); a cheap test
        that spares a parse."""
        forms: set[str] = set()
        for c in classes:
            forms |= self._surface.get(c, set())
        return any(w in forms for shown in readings(text) for w in _WORD.findall(shown.lower()))

    def mentioned(self, text: str) -> set[str]:
        """The classes ``text`` mentions, matched on the lower-cased words of each of its
        :func:`~counterfactual.fold.readings` with :meth:`base_form` as lemmatiser (no parse:
        "hot dogs" is a hot dog, not a dog)."""
        if not self.may_mention(text, self.classes):
            return set()
        return {m.cls for shown in readings(text) for m in self.match(_WORD.findall(shown.lower()))}

    def base_form(self, word: str) -> str:
        """The vocabulary word that ``word`` (lower case) inflects, or ``word`` itself: a
        lemmatiser for the words of the vocabulary only."""
        return self._base.get(word, word)

    def match(self, texts: Sequence[str], lemmas: Sequence[str] | None = None) -> list[Mention]:
        """Mentions in a token sequence, given each token's text and, optionally, its lemma
        (any case); without lemmas, :meth:`base_form` stands in."""
        texts = [t.lower() for t in texts]
        if lemmas is None:
            lemmas = [self.base_form(t) for t in texts]
        else:
            lemmas = [t.lower() for t in lemmas]
        found = []
        i = 0
        while i < len(texts):
            for length in range(min(self._max_len, len(texts) - i), 0, -1):
                span_t = tuple(texts[i : i + length])
                span_l = tuple(lemmas[i : i + length])
                cls = (
                    self._entries.get(span_t)
                    or self._entries.get(span_l)
                    or self._entries.get(span_t[:-1] + span_l[-1:])
                )
                if cls is not None:
                    found.append(Mention(i, i + length, cls))
                    i += length
                    break
            else:
                i += 1
        return found


def _read_words(path: str | Path) -> dict[str, tuple[int, list[str]]]:
    """Class name -> (line number, its other entries, deduplicated) of a vocabulary file."""
    words: dict[str, tuple[int, list[str]]] = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            items = [w.strip() for w in line.split(",") if w.strip()]
            if not items or line.lstrip().startswith("#"):
                continue
            name = items[0]
            if name in words:
                raise ValueError(f"{path}:{lineno}: class {name!r} is listed twice")
            words[name] = (lineno, list(dict.fromkeys(items[1:])))
    if not words:
        raise ValueError(f"{path}: no classes in vocabulary file")
    return words


@cache
def coco_vocabulary(paper_words: bool = True, more_words: bool = True) -> ClassVocabulary:
    """The 80 COCO classes with the word lists of Rohrbach et al. (2018) and, unless
    ``paper_words`` is false, the words seed 002's examples add (``data/paper_synonyms.txt``),
    and unless ``more_words`` is false the compounds and hyponyms of
    ``data/annotator_synonyms.txt`` ("teaspoon", "armchair", "necktie")."""
    data = resources.files("counterfactual") / "data"
    with (
        resources.as_file(data / "coco_synonyms.txt") as coco,
        resources.as_file(data / "paper_synonyms.txt") as paper,
        resources.as_file(data / "annotator_synonyms.txt") as more,
    ):
        extra = [paper] if paper_words else []
        return ClassVocabulary.from_file(coco, [*extra, more] if more_words else extra)


class VocabularyWarning(UserWarning):
    """A run's classes that its vocabulary has no words for (their samples fail as
    ``class-not-in-vocabulary``); the command line prints it as one line before it starts."""


def lacking_line(lacking: Sequence[str], path: str | None, what: str, option: str) -> str:
    """One line naming ``lacking``, ``what`` they are (``"the class to remove"``), that the
    vocabulary in ``path`` (``None``: COCO's) has no words for, and how to pass one that
    lists them (``option``: ``--vocabulary FILE`` or ``vocabulary='FILE'``)."""
    which = "COCO's 80 classes, the default" if path is None else path
    named = ", ".join(lacking[:8]) + (f" and {len(lacking) - 8} more" if len(lacking) > 8 else "")
    return (
        f"the caption vocabulary ({which}) has no words for {what}: {named}; a caption that "
        f"names it cannot be rewritten or checked: pass {option} that lists it, one class a "
        "line ('tripod, tripods, camera stand')"
    )


@cache
def load_vocabulary(path: str | None = None) -> ClassVocabulary:
    """The vocabulary in ``path``, or :func:`coco_vocabulary` (paper and annotator words
    included) when ``None``."""
    return coco_vocabulary() if path is None else ClassVocabulary.from_file(path)
