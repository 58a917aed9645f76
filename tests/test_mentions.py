"""Class mentions per caption (ODmAP@k relevance): hand-checked cases, agreement with
np-removal, and the on-disk cache."""

import json
from pathlib import Path

import numpy as np
import pytest

from counterfactual.eval.mentions import (
    MentionIndexer,
    load_mentions,
    mentions_fingerprint,
    save_mentions,
)
from counterfactual.readers.generate import generate_coco
from counterfactual.text import RewriteRequest, TextConfig, make_rewriter
from counterfactual.vocab import ClassVocabulary, coco_vocabulary


@pytest.fixture(scope="module")
def indexer() -> MentionIndexer:
    return MentionIndexer()


@pytest.mark.parametrize(
    ("caption", "expected"),
    [
        ("Two dogs fighting over a frisbee", {"dog", "frisbee"}),
        ("A man eating a hot dog", {"person", "hot dog"}),  # "man" is a person word
        ("A man eating hot dogs.", {"person", "hot dog"}),  # longest match: not a dog
        ("Two people ride bikes past a hot-dog stand", {"person", "bicycle", "hot dog"}),
        ("A man in a suit and tie.", {"person", "tie"}),  # "tie" is no noun chunk here
        ("A coach trains his dog.", {"dog"}),  # a verb, not a train
        ("Ein Hund 🐕 — naïve café with a DOG", {"dog"}),
        ("A cat\u00a0on a mat\u200b", {"cat"}),
        ("", set()),
    ],
)
def test_hand_checked(indexer: MentionIndexer, caption: str, expected: set[str]) -> None:
    assert indexer([caption]) == [frozenset(expected)]


def test_no_class_word_needs_no_parse() -> None:
    indexer = MentionIndexer(batch_size=2)
    texts = ["A view of the sky.", "", "🙂 ünïcödé …", "Clouds over the hills"]
    assert indexer(texts) == [frozenset()] * 4
    assert indexer.parsed == 0
    out = indexer(["A dog.", "A view of the sky.", "A dog."])
    assert out == [frozenset({"dog"}), frozenset(), frozenset({"dog"})]
    assert indexer.parsed == 1  # duplicates parsed once


def test_bad_batch_size() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        MentionIndexer(batch_size=0)


def _random_captions(tmp_path: Path, n: int, seed: int) -> list[str]:
    """Generated COCO-style captions plus word salads of class words, plurals and
    look-alikes (seeded)."""
    files = generate_coco(tmp_path, n, seed=seed, write_images=False)
    texts = [a["caption"] for a in json.loads(files.captions.read_text())["annotations"]]
    vocab = coco_vocabulary()
    words = [w for c in vocab.classes for w in vocab.words(c)]
    extra = ["hot", "dogs", "bear", "teddy", "phones", "tree", "sky", "the", "of", "and", "a"]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        picked = [str(rng.choice(words if rng.random() < 0.5 else extra)) for _ in range(6)]
        picked = [w + "s" if rng.random() < 0.2 else w for w in picked]
        texts.append("A " + " ".join(picked) + " near a table.")
    return texts


def test_agrees_with_np_removal(indexer: MentionIndexer, tmp_path: Path) -> None:
    texts = _random_captions(tmp_path, 40, seed=3)
    remover = make_rewriter(TextConfig(method="np-removal"))
    classes = coco_vocabulary().classes
    mentions = indexer(texts)
    assert sum(bool(m) for m in mentions) > len(texts) // 2
    for text, found in zip(texts, mentions, strict=True):
        results = remover([RewriteRequest(caption=text, removed=(c,)) for c in classes])
        changed = {c for c, r in zip(classes, results, strict=True) if r.text != text}
        assert changed == found, text


def test_cache_round_trip(indexer: MentionIndexer, tmp_path: Path) -> None:
    texts = ["Two dogs fighting over a frisbee", "A view of the sky.", "A man eating a hot dog"]
    mentions = indexer(texts)
    classes = indexer.vocabulary.classes
    path = tmp_path / "mentions.npz"
    save_mentions(path, mentions, classes, indexer.fingerprint(texts))
    assert load_mentions(path, indexer.fingerprint(texts)) == mentions
    assert load_mentions(path) == mentions
    with np.load(path) as data:
        assert data["offsets"].tolist() == [0, 2, 2, 4]
        assert data["indices"].dtype == np.int16


def test_stale_cache_refused(indexer: MentionIndexer, tmp_path: Path) -> None:
    texts = ["A dog.", "A cat."]
    path = tmp_path / "mentions.npz"
    save_mentions(path, indexer(texts), indexer.vocabulary.classes, indexer.fingerprint(texts))
    with pytest.raises(ValueError, match="stale.*n_captions"):
        load_mentions(path, indexer.fingerprint([*texts, "A bird."]))
    with pytest.raises(ValueError, match="stale.*captions_sha256"):
        load_mentions(path, indexer.fingerprint(["A dog.", "A cow."]))
    with pytest.raises(ValueError, match="stale.*spacy_model_version"):
        load_mentions(
            path, mentions_fingerprint(texts, indexer.vocabulary, indexer.model_name, "0")
        )
    other = ClassVocabulary({"dog": ["puppy"], "cat": []})
    with pytest.raises(ValueError, match="stale.*classes"):
        load_mentions(path, mentions_fingerprint(texts, other, indexer.model_name, "0"))
    with pytest.raises(ValueError, match="stale.*spacy_model is"):
        load_mentions(path, mentions_fingerprint(texts, indexer.vocabulary, "other_model", "0"))


def test_save_checks_its_input(indexer: MentionIndexer, tmp_path: Path) -> None:
    fingerprint = indexer.fingerprint(["A dog."])
    with pytest.raises(ValueError, match="1 captions, got 2"):
        save_mentions(tmp_path / "m.npz", [{"dog"}, set()], ["dog"], fingerprint)
    with pytest.raises(ValueError, match="'unicorn', not in classes"):
        save_mentions(tmp_path / "m.npz", [{"unicorn"}], ["dog"], fingerprint)
    assert not list(tmp_path.iterdir())
