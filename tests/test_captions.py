"""Caption rewriting: np-removal with the real spaCy model and COCO word lists, prompts."""

import pytest

from counterfactual.cli import main
from counterfactual.records import Phrase
from counterfactual.text import RewriteRequest, TextConfig, make_rewriter
from counterfactual.text.np_removal import NounPhraseRemover, remove_phrases
from counterfactual.text.prompts import TEMPLATES, fill, join_classes
from counterfactual.text.tidy import tidy
from counterfactual.vocab import ClassVocabulary, coco_vocabulary

# (caption, removed classes, expected caption with --no-repair-captions, the paper's exact
# np-removal); each checked by a person.
NP_CASES = [
    ("Two dogs fighting over a frisbee", ("frisbee",), "Two dogs fighting over"),  # the paper's
    ("A man riding a horse next to a dog.", ("horse",), "A man riding next to a dog."),
    ("A puppy chewing on a shoe on the floor.", ("dog",), "Chewing on a shoe on the floor."),
    ("A cat sitting in front of a television.", ("tv",), "A cat sitting in front of."),
    (
        "Two hot dogs on a plate next to a cup of coffee.",
        ("hot dog",),
        "On a plate next to a cup of coffee.",
    ),
    # "hot dog" is not a dog: the longest word list entry wins
    (
        "Two hot dogs on a plate next to a cup of coffee.",
        ("dog",),
        "Two hot dogs on a plate next to a cup of coffee.",
    ),
    ("A teddy bear sitting on a wooden bench.", ("teddy bear",), "Sitting on a wooden bench."),
    (
        "A woman talking on her cell phone while walking.",
        ("cell phone",),
        "A woman talking on while walking.",
    ),
    (
        "Three zebras and a giraffe standing in a field.",
        ("giraffe",),
        "Three zebras and standing in a field.",
    ),
    ("A kitten sleeps on a laptop keyboard.", ("cat",), "Sleeps on a laptop keyboard."),
    ("A kitten sleeps on a laptop keyboard.", ("laptop",), "A kitten sleeps on."),
    (
        "People with umbrellas walking down a busy street.",
        ("person",),
        "With umbrellas walking down a busy street.",
    ),
    ("A little girl holding a kite on the beach.", ("person", "kite"), "Holding on the beach."),
    (
        "A man on a motorbike stops at a traffic light.",
        ("motorcycle",),
        "A man on stops at a traffic light.",
    ),
    (
        "A man on a motorbike stops at a traffic light.",
        ("traffic light",),
        "A man on a motorbike stops at.",
    ),
    (
        "A pizza with mushrooms sitting on a table.",
        ("dining table",),
        "A pizza with mushrooms sitting on.",
    ),
    (
        "Children playing soccer with a ball in the park.",
        ("sports ball",),
        "Children playing soccer with in the park.",
    ),
    ("Some sheep grazing near a red barn.", ("sheep",), "Grazing near a red barn."),
    ("A surfer riding a wave on his surfboard.", ("surfboard",), "A surfer riding a wave on."),
    (
        "A bowl of oranges and bananas on the counter.",
        ("orange", "banana"),
        "A bowl of and on the counter.",
    ),
    (
        "A couple of elephants are walking through the water.",
        ("elephant",),
        "A couple of are walking through the water.",
    ),
    (
        "A puppy sits beside a television, a remote and a couch.",
        ("dog", "tv"),
        "Sits beside a remote and a couch.",
    ),
    ("A man is texting on his phone.", ("cell phone",), "A man is texting on."),
    # class words used as verbs are not noun phrases: nothing to remove
    ("A coach trains his dog in the park.", ("train",), "A coach trains his dog in the park."),
    ("A man will ski down the hill.", ("skis",), "A man will ski down the hill."),
    ("A woman bowls at the bowling alley.", ("bowl",), "A woman bowls at the bowling alley."),
    # a caption that does not mention the class stays as it is
    ("A red bus on a city street.", ("person",), "A red bus on a city street."),
]


@pytest.fixture(scope="module")
def remover():
    return make_rewriter(TextConfig(repair=False))


@pytest.mark.parametrize("caption,removed,expected", NP_CASES)
def test_np_removal(remover, caption, removed, expected):
    (result,) = remover([RewriteRequest(caption, removed)])
    assert result.text == expected
    assert result.reason is None


def test_batch_keeps_order_and_matches_single_calls(remover):
    requests = [RewriteRequest(c, r) for c, r, _ in NP_CASES]
    assert [r.text for r in remover(requests)] == [e for _, _, e in NP_CASES]


def test_prefilter_never_changes_the_result(remover):
    """A parse for every caption gives the same captions as the word pre-check that skips most."""

    class ParseAll(ClassVocabulary):
        def may_mention(self, text, classes):
            return True

    vocab = coco_vocabulary()
    everything = ParseAll({c: vocab.words(c) for c in vocab.classes})
    full = NounPhraseRemover(TextConfig(repair=False), vocabulary=everything)
    for caption, removed, expected in NP_CASES:
        assert full([RewriteRequest(caption, removed)])[0].text == expected


def test_removing_everything_is_a_reason_not_a_crash(remover):
    (result,) = remover([RewriteRequest("A cat.", ("cat",))])
    assert result.text is None and result.reason == "empty-caption"
    assert result.removed_phrases == ("A cat",)


def test_flickr_phrases_are_removed_by_type(remover):
    text = "A man in a red shirt rides a horse past two dogs."
    spans = [
        ("A man", "people"),
        ("a red shirt", "clothing"),
        ("a horse", "animals"),
        ("two dogs", "animals"),
    ]
    phrases = tuple(
        Phrase(text.index(p), text.index(p) + len(p), p, (t,), str(i))
        for i, (p, t) in enumerate(spans)
    )
    (result,) = remover([RewriteRequest(text, ("animals",), ("people",), phrases=phrases)])
    assert result.text == "A man in a red shirt rides past."
    assert result.removed_phrases == ("a horse", "two dogs")
    assert (
        remove_phrases(text, phrases, ("people",)).text
        == "In a red shirt rides a horse past two dogs."
    )


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("A man  riding ,  next to .", "A man riding, next to."),
        (" , on the table", "On the table"),
        ("a, , b", "a, b"),
        ("dogs ( ) playing", "dogs playing"),
    ],
)
def test_tidy(raw, expected):
    assert tidy(raw, capitalize=raw.strip(" ,")[:1].isupper() or raw.startswith(" ,")) == expected


def test_prompt_join_and_fill():
    assert len(TEMPLATES) == 80 and len(set(TEMPLATES)) == 80
    assert join_classes(["person"]) == "person"
    assert join_classes(["person", "dog"]) == "person and a dog"
    assert join_classes(["person", "dog", "umbrella"]) == "person, a dog and an umbrella"
    assert fill("a photo of a {}.", ["person", "dog"]) == "a photo of a person and a dog."
    assert fill("a photo of a {}.", ["airplane"]) == "a photo of an airplane."
    with pytest.raises(ValueError):
        join_classes([])


def test_prompt_writer_is_seeded():
    writer = make_rewriter(TextConfig(method="prompt"))
    reqs = [RewriteRequest("x", ("frisbee",), ("dog", "person"), seed=s) for s in range(40)]
    first, again = writer(reqs), writer(reqs)
    assert [r.text for r in first] == [r.text for r in again]
    assert len({r.text for r in first}) > 10
    assert all("dog and a person" in r.text for r in first)
    assert writer([RewriteRequest("x", ("a",), ())])[0].reason == "nothing-kept"


def test_vocabulary_rejects_a_word_in_two_classes(tmp_path):
    path = tmp_path / "v.txt"
    path.write_text("cat, kitty\ndog, kitty\n")
    with pytest.raises(ValueError, match="kitty"):
        ClassVocabulary.from_file(path)


def test_bad_text_config():
    with pytest.raises(ValueError, match="method"):
        TextConfig(method="rewrite")


def test_caption_command(capsys):
    assert main(["caption", "--remove", "frisbee", "Two dogs fighting over a frisbee"]) == 0
    assert capsys.readouterr().out == "Two dogs fighting\n"  # repaired by default
    paper = ["caption", "--no-repair-captions", "--remove", "frisbee"]
    assert main([*paper, "Two dogs fighting over a frisbee"]) == 0
    assert capsys.readouterr().out == "Two dogs fighting over\n"
    assert main(["caption", "--remove", "dog,tv", "A puppy watches television."]) == 0
    assert capsys.readouterr().out == "Watches.\n"
    assert main(["caption", "--remove", "unicorn", "A unicorn."]) == 2
    assert "unicorn" in capsys.readouterr().err


def test_parse_cache_never_loses_an_answer():
    """A full FIFO cache once evicted a caption it was about to return (KeyError)."""
    from counterfactual.text.np_removal import NounPhraseRemover

    remover = NounPhraseRemover(cache_size=2)
    remover.chunks(["A dog.", "A cat."])
    got = remover.chunks(["A dog.", "A cow.", "A horse.", "A dog."])
    assert [text for text, _ in got] == ["A dog.", "A cow.", "A horse.", "A dog."]
    assert [c.classes for c in got[0][1]] == [frozenset({"dog"})]
    assert len(remover._cache) == 2
