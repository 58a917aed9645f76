"""Seed 002's own examples: the word matches its figures need, in np-removal and ODmAP relevance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from counterfactual import cli
from counterfactual.cli import main
from counterfactual.eval.mentions import MentionIndexer
from counterfactual.eval.metrics.retrieval import od_relevance, odmap_at_k
from counterfactual.text import RewriteRequest, TextConfig
from counterfactual.text.np_removal import NounPhraseRemover
from counterfactual.vocab import ClassVocabulary, coco_vocabulary, load_vocabulary

EQUESTRIAN = "An equestrian jumps a horse over a hurdle"  # seed 002, Figure 2 (right)
WINE = "Two glasses of wine on a table"

# (caption, removed classes, expected caption); each checked by a person.
CASES = [
    (EQUESTRIAN, ("person",), "Jumps a horse over a hurdle"),
    (EQUESTRIAN, ("horse",), "An equestrian jumps over a hurdle"),
    (WINE, ("wine glass",), "On a table"),  # the whole phrase, "of wine" included
    (WINE, ("dining table",), "Two glasses of wine on"),
    ("A woman holds a glass of wine.", ("wine glass",), "A woman holds."),
    ("Glasses of wine and a plate of food.", ("wine glass",), "And a plate of food."),
    ("A wineglass next to a bottle.", ("wine glass",), "Next to a bottle."),
    ("A jockey rides a horse on a track.", ("person",), "Rides a horse on a track."),
    # seed 002, Figure 3: a sentence "contains the word 'bat'" of a baseball bat
    (
        "A man with a blue jersey swings a bat.",
        ("baseball bat",),
        "A man with a blue jersey swings.",
    ),
    # what was matched before still is
    ("A man holding a baseball bat.", ("baseball bat",), "A man holding."),
    ("Two hot dogs on a plate.", ("dog",), "Two hot dogs on a plate."),
    # a glass of water is no wine glass
    ("A glass of water on a table.", ("wine glass",), "A glass of water on a table."),
]


@pytest.fixture(scope="module")
def remover() -> NounPhraseRemover:
    return NounPhraseRemover(TextConfig(repair=False), vocabulary=coco_vocabulary())


@pytest.mark.parametrize(("caption", "removed", "expected"), CASES)
def test_np_removal_on_paper_examples(
    remover: NounPhraseRemover, caption: str, removed: tuple[str, ...], expected: str
) -> None:
    (result,) = remover([RewriteRequest(caption=caption, removed=removed)])
    assert result.text == expected


def test_whole_noun_phrase_is_one_removed_phrase(remover: NounPhraseRemover) -> None:
    (result,) = remover([RewriteRequest(caption=WINE, removed=("wine glass",))])
    assert result.removed_phrases == ("Two glasses of wine",)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (EQUESTRIAN, {"person", "horse"}),
        (WINE, {"wine glass", "dining table"}),
        ("glasses of wine", {"wine glass"}),
        ("a bat and a ball", {"baseball bat", "sports ball"}),
        ("a glass of water", set()),
    ],
)
def test_vocabulary_mentions(text: str, expected: set[str]) -> None:
    assert coco_vocabulary().mentioned(text) == expected


def test_paper_words_are_optional_and_kept_apart() -> None:
    plain = coco_vocabulary(paper_words=False)
    assert plain.mentioned(EQUESTRIAN) == {"horse"}
    assert plain.mentioned(WINE) == {"dining table"}
    assert load_vocabulary() is coco_vocabulary()  # the default everywhere has them
    assert plain.classes == coco_vocabulary().classes
    for cls in plain.classes:  # only added words, nothing lost
        assert set(plain.words(cls)) <= set(coco_vocabulary().words(cls))
    paper = coco_vocabulary(more_words=False)  # the annotator words: test_caption_quality
    assert set(paper.words("person")) - set(plain.words("person")) == {
        "equestrian",
        "horseman",
        "horsewoman",
        "jockey",
    }


def test_paper_file_names_its_source_and_is_not_the_bsd_list() -> None:
    data = Path(__file__).resolve().parents[1] / "counterfactual" / "data"
    paper = (data / "paper_synonyms.txt").read_text(encoding="utf-8")
    assert "seed 002" in paper and "Kim, Koepke, Schmid, Akata" in paper
    assert "equestrian" not in (data / "coco_synonyms.txt").read_text(encoding="utf-8")
    assert "paper_synonyms.txt" in (data / "NOTICE.md").read_text(encoding="utf-8")


def test_extra_file_may_only_add_to_known_classes(tmp_path: Path) -> None:
    base = tmp_path / "base.txt"
    base.write_text("person, man\ndog, puppy\n", encoding="utf-8")
    extra = tmp_path / "extra.txt"
    extra.write_text("# more words\nperson, equestrian, man\n", encoding="utf-8")
    vocab = ClassVocabulary.from_file(base, [extra])
    assert vocab.words("person") == ("person", "man", "equestrian")
    assert vocab.classes == ("person", "dog")
    bad = tmp_path / "bad.txt"
    bad.write_text("person, rider\nhurdle, fence\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.txt:2: class 'hurdle' is not in .*base.txt"):
        ClassVocabulary.from_file(base, [bad])
    clash = tmp_path / "clash.txt"
    clash.write_text("dog, man\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'man' is listed for both 'person' and 'dog'"):
        ClassVocabulary.from_file(base, [clash])


def test_cheap_test_skips_function_words() -> None:
    vocab = coco_vocabulary()
    # "of" and "wine" alone cannot make a mention of wine glass: no parse needed
    assert not vocab.may_mention("a bottle of wine", ["wine glass"])
    assert vocab.may_mention("two glasses of wine", ["wine glass"])
    assert vocab.may_mention("an equestrian", ["person"])


def test_odmap_relevance_uses_the_same_matches() -> None:
    """Figure 2 (right): the query shows a horse and no person; a caption naming an equestrian
    is wrong, one naming only the horse is right."""
    gallery = [EQUESTRIAN, "A horse jumps over a hurdle", WINE, "Red wine poured on a table"]
    mentions = MentionIndexer()(gallery)
    assert mentions == [
        frozenset({"person", "horse"}),
        frozenset({"horse"}),
        frozenset({"wine glass", "dining table"}),
        frozenset({"dining table"}),
    ]
    topk = np.array([[0, 1], [2, 3]])
    removed = [{"person"}, {"wine glass"}]
    kept = [{"horse"}, {"dining table"}]
    relevance = od_relevance(topk, mentions, removed, kept)
    assert relevance.tolist() == [[False, True], [False, True]]
    # AP@2 = (1/2) * P(2) * rel(2) = (1/2) * (1/2) for each query
    assert odmap_at_k(relevance, 2) == pytest.approx(0.25)
    # without the paper's words both top captions would count as correct
    plain = MentionIndexer(coco_vocabulary(paper_words=False))(gallery)
    assert od_relevance(topk, plain, removed, kept).tolist() == [[True, True], [True, True]]


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", ("caption",))
    return main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--remove", "person", EQUESTRIAN], "Jumps a horse over a hurdle"),
        (["--remove", "wine glass", WINE], "On a table"),
    ],
)
def test_caption_cli(run_cli, capsys: pytest.CaptureFixture[str], argv, expected: str) -> None:
    assert run_cli(["caption", *argv]) == 0
    assert capsys.readouterr().out.strip() == expected
