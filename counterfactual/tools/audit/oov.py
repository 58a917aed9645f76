"""Out-of-vocabulary rate of an evaluation set against a training vocabulary (GD-VCR, Yin et
al., 2021, Table 1: 6.75% for GD-VCR against the VCR training set).

Texts are lower-cased and split into words (runs of letters and digits, with inner
apostrophes kept: ``"don't"``); train and evaluation text go through the same tokenizer.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Tokenizer = Callable[[str], list[str]]

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def tokenize(text: str) -> list[str]:
    """Lower-cased words of ``text``."""
    return _WORD.findall(text.lower())


def build_vocabulary(
    texts: Iterable[str], tokenizer: Tokenizer = tokenize, min_count: int = 1
) -> frozenset[str]:
    """Words occurring at least ``min_count`` times in ``texts``."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    counts = Counter(word for text in texts for word in tokenizer(text))
    return frozenset(word for word, n in counts.items() if n >= min_count)


def read_vocabulary(path: str | Path, tokenizer: Tokenizer = tokenize) -> frozenset[str]:
    """A vocabulary file: one entry a line, normalised by ``tokenizer`` (lower-cased)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None
    return frozenset(word for line in text.splitlines() for word in tokenizer(line))


@dataclass(frozen=True, slots=True)
class WordCount:
    word: str
    count: int


@dataclass(frozen=True, slots=True)
class OOVReport:
    """``rate = oov_tokens / tokens`` counts running words; ``type_rate = oov_types / types``
    counts distinct words. Both are 0..1 (0 for no words). ``most_common`` are the most
    frequent unseen words, ties by word."""

    tokens: int
    oov_tokens: int
    rate: float
    types: int
    oov_types: int
    type_rate: float
    most_common: tuple[WordCount, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "oov_tokens": self.oov_tokens,
            "rate": self.rate,
            "types": self.types,
            "oov_types": self.oov_types,
            "type_rate": self.type_rate,
            "most_common": [{"word": w.word, "count": w.count} for w in self.most_common],
        }


def oov_rate(
    texts: Iterable[str],
    vocabulary: Iterable[str],
    tokenizer: Tokenizer = tokenize,
    top: int = 10,
) -> OOVReport:
    """How much of ``texts`` is outside ``vocabulary`` (words as ``tokenizer`` gives them)."""
    vocab = vocabulary if isinstance(vocabulary, frozenset | set) else frozenset(vocabulary)
    counts = Counter(word for text in texts for word in tokenizer(text))
    unseen = {word: n for word, n in counts.items() if word not in vocab}
    tokens = sum(counts.values())
    oov_tokens = sum(unseen.values())
    ranked = sorted(unseen.items(), key=lambda item: (-item[1], item[0]))[: max(top, 0)]
    return OOVReport(
        tokens=tokens,
        oov_tokens=oov_tokens,
        rate=oov_tokens / tokens if tokens else 0.0,
        types=len(counts),
        oov_types=len(unseen),
        type_rate=len(unseen) / len(counts) if counts else 0.0,
        most_common=tuple(WordCount(w, n) for w, n in ranked),
    )


def oov_by_group(
    texts: Sequence[str],
    groups: Sequence[str],
    vocabulary: Iterable[str],
    tokenizer: Tokenizer = tokenize,
    top: int = 10,
) -> Mapping[str, OOVReport]:
    """:func:`oov_rate` of the texts of each group (``groups[i]`` is the group of
    ``texts[i]``), groups sorted by name."""
    if len(texts) != len(groups):
        raise ValueError(f"{len(texts)} texts but {len(groups)} groups")
    vocab = frozenset(vocabulary)
    by_group: dict[str, list[str]] = {}
    for text, group in zip(texts, groups, strict=True):
        by_group.setdefault(group, []).append(text)
    return {g: oov_rate(by_group[g], vocab, tokenizer, top) for g in sorted(by_group)}
