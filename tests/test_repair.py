"""Caption repair after np-removal (`TextConfig.repair`): real remover outputs, then repaired."""

import json
import tarfile

import pytest

from counterfactual.records import Phrase
from counterfactual.text import RewriteRequest, TextConfig, make_rewriter
from counterfactual.text.nlp import load_spacy
from counterfactual.text.repair import cut_offsets, repair_caption

# (caption, removed classes, np-removal today, with repair)
REPAIRED = [
    (
        "Two dogs fighting over a frisbee.",
        ("frisbee",),
        "Two dogs fighting over.",
        "Two dogs fighting.",
    ),
    ("A cat behind and a dog.", ("dog",), "A cat behind and.", "A cat behind."),
    (
        "A pizza with mushrooms sitting on a table.",
        ("dining table",),
        "A pizza with mushrooms sitting on.",
        "A pizza with mushrooms sitting.",
    ),
    (
        "Children playing soccer with a ball in the park.",
        ("sports ball",),
        "Children playing soccer with in the park.",
        "Children playing soccer in the park.",
    ),
    (
        "A surfer riding a wave on his surfboard.",
        ("surfboard",),
        "A surfer riding a wave on.",
        "A surfer riding a wave.",
    ),
    (
        "A bowl of oranges and bananas on the counter.",
        ("orange", "banana"),
        "A bowl of and on the counter.",
        "A bowl on the counter.",
    ),
    (
        "A couple of elephants are walking through the water.",
        ("elephant",),
        "A couple of are walking through the water.",
        "A couple are walking through the water.",
    ),
    (
        "A man is texting on his phone.",
        ("cell phone",),
        "A man is texting on.",
        "A man is texting.",
    ),
    (
        "A cat and a dog sleeping on a couch.",
        ("cat",),
        "And a dog sleeping on a couch.",
        "A dog sleeping on a couch.",
    ),
    (
        "A man playing with a cat and a dog.",
        ("cat",),
        "A man playing with and a dog.",
        "A man playing with a dog.",
    ),
    (
        "A man holding an umbrella and a bag.",
        ("umbrella",),
        "A man holding and a bag.",
        "A man holding a bag.",
    ),
    (
        "A woman sitting next to a bench with a dog.",
        ("bench",),
        "A woman sitting next to with a dog.",
        "A woman sitting with a dog.",
    ),
    (
        "A man riding a horse next to a car.",
        ("car",),
        "A man riding a horse next to.",
        "A man riding a horse.",
    ),
    (
        "A laptop computer sitting on top of a desk.",
        ("dining table",),
        "A laptop computer sitting on top of.",
        "A laptop computer sitting.",
    ),
    (
        "A plate of food with a fork and a knife.",
        ("fork", "knife"),
        "A plate of food with and.",
        "A plate of food.",
    ),
    (
        "A kitchen with a stove, a sink, and a refrigerator.",
        ("refrigerator", "sink"),
        "A kitchen with a stove, and.",
        "A kitchen with a stove.",
    ),
    (
        "A man is standing in front of a bus.",
        ("bus",),
        "A man is standing in front of.",
        "A man is standing.",
    ),
    (
        "A person on skis going down a snowy hill.",
        ("skis",),
        "A person on going down a snowy hill.",
        "A person going down a snowy hill.",
    ),
    (
        "Two people sitting at a table with laptops.",
        ("laptop",),
        "Two people sitting at a table with.",
        "Two people sitting at a table.",
    ),
    (
        "A man looking down at his cell phone.",
        ("cell phone",),
        "A man looking down at.",
        "A man looking down.",
    ),
    (
        "A cup of coffee and a donut on a plate.",
        ("cup", "donut"),
        "Of coffee and on a plate.",
        "On a plate.",  # the coffee was in the erased cup
    ),
    (
        "A cat sleeping beside a cup of coffee on a table.",
        ("cup", "dining table"),
        "A cat sleeping beside of coffee on.",
        "A cat sleeping.",
    ),
    (
        "Two men holding a plate of cookies and a cup of tea.",
        ("cup",),
        "Two men holding a plate of cookies and of tea.",
        "Two men holding a plate of cookies.",
    ),
    (
        "A teddy bear sitting on a chair by a window.",
        ("chair",),
        "A teddy bear sitting on by a window.",
        "A teddy bear sitting by a window.",
    ),
    (
        "Three zebras and an elephant at a watering hole.",
        ("elephant",),
        "Three zebras and at a watering hole.",
        "Three zebras at a watering hole.",
    ),
    (
        "A vase of flowers on the table.",
        ("vase",),
        "Of flowers on the table.",
        "Flowers on the table.",
    ),
    (
        "A horse pulling a cart down the street, followed by a dog.",
        ("dog",),
        "A horse pulling a cart down the street, followed by.",
        "A horse pulling a cart down the street, followed.",
    ),
]

# (caption, removed classes, np-removal today = with repair: nothing dangles)
UNCHANGED = [
    (
        "A puppy sits beside a television, a remote and a couch.",
        ("dog", "tv"),
        "Sits beside a remote and a couch.",
    ),
    ("A boy looking at the camera.", ("person",), "Looking at the camera."),
    (
        "A giraffe standing near a tree in a field.",
        ("giraffe",),
        "Standing near a tree in a field.",
    ),
    ("A clock on the side of a building.", ("clock",), "On the side of a building."),
    (
        "A dog catching a frisbee in front of a tree.",
        ("frisbee",),
        "A dog catching in front of a tree.",
    ),
    ("A red bus on a city street.", ("person",), "A red bus on a city street."),
    ("A dog sleeping on a couch.", ("cat",), "A dog sleeping on a couch."),
]


@pytest.fixture(scope="module")
def off():
    return make_rewriter(TextConfig(repair=False))


@pytest.fixture(scope="module")
def on():
    return make_rewriter(TextConfig())


@pytest.fixture(scope="module")
def full_parser():
    """spaCy with its own POS mapping (attribute ruler), not the remover's fast path."""
    return load_spacy()


def _rewrite(rewriter, caption, removed):
    (result,) = rewriter([RewriteRequest(caption, removed)])
    return result


@pytest.mark.parametrize("caption,removed,today,repaired", REPAIRED)
def test_repair_drops_what_dangles(off, on, full_parser, caption, removed, today, repaired):
    assert _rewrite(off, caption, removed).text == today
    result = _rewrite(on, caption, removed)
    assert result.text == repaired
    assert result.removed_phrases == _rewrite(off, caption, removed).removed_phrases
    doc = full_parser(repaired)
    assert doc[-1].text == "."
    assert doc[-2].pos_ not in ("ADP", "CCONJ", "DET", "SCONJ", "PUNCT"), [
        (t.text, t.pos_) for t in doc
    ]
    assert doc[0].pos_ != "CCONJ"


@pytest.mark.parametrize("caption,removed,today", UNCHANGED)
def test_nothing_dangling_stays_as_it_is(off, on, caption, removed, today):
    assert _rewrite(off, caption, removed).text == today
    assert _rewrite(on, caption, removed).text == today


def test_a_particle_the_cut_did_not_touch_stays(on):
    """'next to' goes whole; 'down' was not next to the cut, so it is a particle and stays."""
    result = _rewrite(on, "A dog lying down next to a cat.", ("cat",))
    assert result.text == "A dog lying down."


def test_a_caption_of_dangling_words_only_is_no_caption(off, on):
    for caption, removed, today in [
        ("With a cat.", ("cat",), "With."),
        ("A cat and a dog.", ("cat", "dog"), "And."),
        ("Next to a cat.", ("cat",), "Next to."),
        ("A computer mouse on a mouse pad.", ("mouse",), "On."),
    ]:
        assert _rewrite(off, caption, removed).text == today
        result = _rewrite(on, caption, removed)
        assert (result.text, result.reason) == (None, "empty-caption")
    assert repair_caption("And.", on.nlp, [0]) == ""


def test_repair_off_is_todays_output_and_description(off, on):
    """Every case of the table: with repair off the remover answers exactly as before."""
    requests = [RewriteRequest(c, r) for c, r, *_ in REPAIRED + UNCHANGED]
    expected = [row[2] for row in REPAIRED + UNCHANGED]
    assert [r.text for r in off(requests)] == expected
    assert off.describe() == {
        "method": "np-removal",
        "spacy_model": off.model_name,
        "repair": False,
    }
    assert on.describe() == {**off.describe(), "repair": True}


def test_batch_equals_single_calls(on):
    requests = [RewriteRequest(c, r) for c, r, *_ in REPAIRED + UNCHANGED]
    batch = [r.text for r in on(requests)]
    assert batch == [_rewrite(on, r.caption, r.removed).text for r in requests]


def test_annotated_phrases_are_repaired_too(off, on):
    text = "A man with a dog on a bench."
    phrases = (Phrase(0, 5, "A man", ("people",)), Phrase(11, 16, "a dog", ("animals",)))
    request = RewriteRequest(text, ("animals",), phrases=phrases)
    assert off([request])[0].text == "A man with on a bench."
    assert on([request])[0].text == "A man on a bench."


def test_repair_caption_without_cut_points_checks_the_end_only(on):
    nlp = on.nlp
    assert repair_caption("A cat behind and.", nlp) == "A cat behind."
    assert repair_caption("A kitchen with a stove, and.", nlp) == "A kitchen with a stove."
    assert repair_caption("A man standing in front of", nlp) == "A man standing"
    # no cut information: a final particle is taken as part of its verb
    assert repair_caption("A dog lying down.", nlp) == "A dog lying down."
    assert repair_caption("Playing with in the park.", nlp) == "Playing with in the park."
    doc = nlp("A cat behind and.")
    assert repair_caption("A cat behind and.", doc) == "A cat behind."
    with pytest.raises(ValueError, match="the parse is of"):
        repair_caption("Another text.", doc)


def test_cut_offsets_follow_the_tidied_text():
    assert cut_offsets(["Two dogs fighting over ", "."], "Two dogs fighting over.") == [22]
    assert cut_offsets(["", " and a dog."], "And a dog.") == [0]
    pieces = ["A bowl of ", " and ", " on the counter."]
    assert cut_offsets(pieces, "A bowl of and on the counter.") == [9, 13]
    assert cut_offsets(["A cat", ""], "A cat") == [5]


def test_config_is_validated_and_repair_is_the_default():
    with pytest.raises(ValueError, match="repair must be True or False"):
        TextConfig(repair="yes")
    assert TextConfig().repair is True
    assert TextConfig(method="prompt").repair is True  # ignored by the other methods


def test_a_synth_run_records_repair(tmp_path):
    """`repair` (the default) is in every sample's text method and, for np-removal, always in
    the run's fingerprint (its default changed, so a record without it means off)."""
    from counterfactual.image import ImageConfig
    from counterfactual.method.selection import SelectionConfig
    from counterfactual.readers.demo import demo_vocabulary_path, read_demo
    from counterfactual.synth.plan import SynthConfig
    from counterfactual.synth.runner import run_local

    vocab = str(demo_vocabulary_path())
    config = SynthConfig(
        selection=SelectionConfig(policy="all"),
        image=ImageConfig(method="blur"),
        text=TextConfig(),
        vocabulary=vocab,
        captions="all",
    )
    assert config.fingerprint()["text"]["repair"] is True  # the default, named
    paper = SynthConfig(text=TextConfig(repair=False), vocabulary=vocab)
    assert paper.fingerprint()["text"]["repair"] is False
    records = read_demo(tmp_path / "demo").records
    run_local(records, tmp_path / "run", config)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["config"]["text"]["repair"] is True
    metas = []
    for shard in sorted((tmp_path / "run").glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            metas += [
                json.loads(tar.extractfile(m).read()) for m in tar if m.name.endswith(".json")
            ]
    assert metas and all(m["text_method"]["repair"] is True for m in metas)
    plain = make_rewriter(TextConfig(repair=False), vocab)
    repaired = make_rewriter(TextConfig(repair=True), vocab)
    requests = [RewriteRequest(m["original_caption"], tuple(m["plan"]["removed"])) for m in metas]
    assert [m["caption"] for m in metas] == [r.text for r in repaired(requests)]
    changed = [
        (r.text, m["caption"])
        for r, m in zip(plain(requests), metas, strict=True)
        if r.text != m["caption"]
    ]
    assert changed, "the demo has captions that repair changes"
