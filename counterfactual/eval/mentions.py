"""Which classes each caption mentions, for ODmAP@k's relevance (SPEC 1.5).

A caption mentions a class when one of its spaCy noun chunks, or a word outside them, matches
one of the class's words, exactly as ``np-removal`` matches them (:mod:`counterfactual.text.np_removal`): the same
pipeline (``load_spacy(..., fast_pos=True)``), the same chunks, the same
:meth:`ClassVocabulary.match`. So a class is in a caption's set exactly when ``np-removal``
removing that class changes the caption. Like ``np-removal``, it parses each caption as a reader
sees it (:func:`counterfactual.fold.folds`: "Ａ ｐｅｒｓｏｎ" names a person).

The sets for a whole gallery (616K COCO captions) are cached on disk by :func:`save_mentions`
as a ``.npz``: class indices of all captions in one array (CSR style) with per-caption offsets,
and a fingerprint of what produced them; :func:`load_mentions` refuses a cache whose
fingerprint differs from the expected one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from counterfactual.fold import folds
from counterfactual.messages import short
from counterfactual.models.runtime import check_batch_size
from counterfactual.text.nlp import default_model_name, load_spacy
from counterfactual.text.np_removal import chunk_mentions
from counterfactual.vocab import ClassVocabulary, load_vocabulary

CACHE_FORMAT = 4
"""Bumped when matching changes (2: entries matched across noun chunks, 'glasses of wine';
3: class words outside noun chunks count, 'a suit and tie'; 4: captions folded as a reader sees
them, 'Ａ ｐｅｒｓｏｎ'), so a cache made by older code is recomputed."""


class MentionIndexer:
    """Callable: captions -> the set of classes mentioned in each caption's noun chunks."""

    def __init__(
        self,
        vocabulary: ClassVocabulary | None = None,
        spacy_model: str | None = None,
        batch_size: int = 256,
    ) -> None:
        check_batch_size(batch_size)
        self.vocabulary = vocabulary or load_vocabulary()
        self.model_name = spacy_model or default_model_name()
        self.nlp = load_spacy(self.model_name, fast_pos=True)  # as NounPhraseRemover loads it
        self.batch_size = batch_size
        self.parsed = 0
        """Captions parsed so far (the rest had no class word and needed no parse)."""

    def __call__(self, texts: Sequence[str]) -> list[frozenset[str]]:
        classes = self.vocabulary.classes
        need = list(dict.fromkeys(t for t in texts if self.vocabulary.may_mention(t, classes)))
        found: dict[str, frozenset[str]] = {}
        ways = [way for t in need for way in folds(t)]  # as np-removal reads them
        docs = self.nlp.pipe([way.text for way in ways], batch_size=self.batch_size)
        for way, doc in zip(ways, docs, strict=True):
            found[way.original] = found.get(way.original, frozenset()).union(
                *(c.classes for c in chunk_mentions(doc, self.vocabulary))
            )
        self.parsed += len(need)
        empty: frozenset[str] = frozenset()
        return [found.get(t, empty) for t in texts]

    def fingerprint(self, texts: Sequence[str]) -> dict[str, Any]:
        """What a cache of ``self(texts)`` depends on (see :func:`mentions_fingerprint`)."""
        return mentions_fingerprint(
            texts, self.vocabulary, self.model_name, str(self.nlp.meta.get("version", ""))
        )


def mentions_fingerprint(
    texts: Sequence[str], vocabulary: ClassVocabulary, spacy_model: str, spacy_version: str
) -> dict[str, Any]:
    """A JSON-able record of the inputs of a mention index: the class names and a hash of their
    word lists, the spaCy model name and version, the number of captions and a hash of them."""
    words = hashlib.sha256()
    for cls in vocabulary.classes:
        words.update(json.dumps([cls, sorted(vocabulary.words(cls))]).encode())
    return {
        "format": CACHE_FORMAT,
        "classes": list(vocabulary.classes),
        "vocabulary_sha256": words.hexdigest(),
        "spacy_model": spacy_model,
        "spacy_model_version": spacy_version,
        "n_captions": len(texts),
        "captions_sha256": texts_sha256(texts),
    }


def texts_sha256(texts: Iterable[str]) -> str:
    """A hash of a sequence of strings (length-prefixed, so boundaries count)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


def save_mentions(
    path: str | Path,
    mentions: Sequence[Iterable[str]],
    classes: Sequence[str],
    fingerprint: Mapping[str, Any],
) -> None:
    """Write ``mentions`` (one set of class names per caption, each name in ``classes``) to
    ``path`` (``.npz``): ``indices`` (int16 class indices, sorted per caption), ``offsets``
    (int64, ``len(mentions) + 1``; caption ``i`` is ``indices[offsets[i]:offsets[i + 1]]``),
    ``classes`` and ``fingerprint`` (JSON). Written to a temporary file, then renamed."""
    if fingerprint.get("n_captions") != len(mentions):
        raise ValueError(
            f"fingerprint is for {fingerprint.get('n_captions')} captions, got {len(mentions)}"
        )
    position = {c: i for i, c in enumerate(classes)}
    offsets = np.zeros(len(mentions) + 1, np.int64)
    flat: list[int] = []
    for i, found in enumerate(mentions):
        try:
            flat.extend(sorted(position[c] for c in found))
        except KeyError as err:
            raise ValueError(f"caption {i} mentions {err.args[0]!r}, not in classes") from err
        offsets[i + 1] = len(flat)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(
        tmp,
        indices=np.asarray(flat, np.int16),
        offsets=offsets,
        classes=np.asarray(list(classes), dtype=np.str_),
        fingerprint=np.asarray(json.dumps(dict(fingerprint), sort_keys=True)),
    )
    tmp.replace(path)


def load_mentions(
    path: str | Path, fingerprint: Mapping[str, Any] | None = None
) -> list[frozenset[str]]:
    """The sets written by :func:`save_mentions`. With ``fingerprint``, raise ``ValueError``
    naming the first differing field when the cache was made from other inputs (stale)."""
    with np.load(path, allow_pickle=False) as data:
        indices, offsets = data["indices"], data["offsets"]
        classes = [str(c) for c in data["classes"]]
        stored = json.loads(str(data["fingerprint"]))
    if fingerprint is not None:
        expected = json.loads(json.dumps(dict(fingerprint)))
        for key in dict.fromkeys([*expected, *stored]):  # in the order fingerprints list them
            if expected.get(key) != stored.get(key):
                raise ValueError(
                    f"stale mention cache {path}: {key} is {short(stored.get(key))}, "
                    f"expected {short(expected.get(key))}; delete it to rebuild"
                )
    if len(offsets) != stored.get("n_captions", -1) + 1:
        raise ValueError(f"corrupt mention cache {path}: offsets do not match n_captions")
    names = np.asarray(classes, dtype=object)
    return [frozenset(names[indices[offsets[i] : offsets[i + 1]]]) for i in range(len(offsets) - 1)]


def mentions_cache_path(cache_dir: str | Path, fingerprint: Mapping[str, Any]) -> Path:
    """Where the mention sets with this fingerprint are cached under ``cache_dir``."""
    key = hashlib.sha256(json.dumps(dict(fingerprint), sort_keys=True).encode()).hexdigest()
    return Path(cache_dir) / f"mentions-{key[:24]}.npz"


def cached_mentions(
    texts: Sequence[str],
    indexer: MentionIndexer,
    cache_dir: str | Path | None = None,
    compute: Callable[[Sequence[str]], list[frozenset[str]]] | None = None,
) -> tuple[list[frozenset[str]], bool]:
    """The mention sets of ``texts`` and whether they came from the cache.

    Read from ``cache_dir`` when a cache with ``indexer``'s fingerprint of ``texts`` is there;
    else computed by ``compute`` (default: ``indexer`` itself, in this process; the Ray
    pipeline passes its parallel version) and cached.
    """
    fingerprint = indexer.fingerprint(texts)
    path = mentions_cache_path(cache_dir, fingerprint) if cache_dir is not None else None
    if path is not None and path.exists():
        return load_mentions(path, fingerprint), True
    found = (compute or indexer)(texts)
    if len(found) != len(texts):
        raise ValueError(f"{len(found)} mention sets for {len(texts)} captions")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_mentions(path, found, indexer.vocabulary.classes, fingerprint)
    return found, False
