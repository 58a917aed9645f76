"""``shuffle`` and ``nouns-adj``: perturbed-text captions (Akula et al., ACL 2020).

The original caption is rewritten as a whole; no phrase is removed, so ``removed``, ``kept``,
``phrases`` and ``image`` of a request are ignored:

* ``shuffle``: the caption's whitespace-separated words in a random order drawn from
  ``RewriteRequest.seed`` (:func:`counterfactual.perturb.shuffle`), so a sample's text is
  reproducible from its ``sample_seed``.
* ``nouns-adj``: only the nouns, proper nouns and adjectives of the caption (spaCy coarse POS,
  :func:`counterfactual.perturb.nouns_adj_many`), parsed in batches with ``nlp.pipe``.

A caption with nothing left (no words, or no noun or adjective) gives ``text=None`` with
reason ``empty-caption``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from counterfactual.perturb import nouns_adj_many, shuffle
from counterfactual.text import RewriteRequest, RewriteResult, TextConfig

PERTURB_METHODS = ("shuffle", "nouns-adj")
EMPTY_CAPTION = "empty-caption"


def _result(text: str) -> RewriteResult:
    if not text.strip():
        return RewriteResult(text=None, reason=EMPTY_CAPTION)
    return RewriteResult(text=text)


class PerturbRewriter:
    """Rewriter for ``config.method`` in :data:`PERTURB_METHODS`; ``nouns-adj`` loads the spaCy
    pipeline ``config.spacy_model`` (default: ``en_core_web_sm`` if installed) once and parses
    ``batch_size`` captions at a time."""

    def __init__(self, config: TextConfig, batch_size: int = 256) -> None:
        if config.method not in PERTURB_METHODS:
            raise ValueError(f"text method {config.method!r} is not one of {PERTURB_METHODS}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.config = config
        self.batch_size = batch_size
        self.method = config.method
        self.model_name: str | None = None
        self.nlp: Any = None
        if self.method == "nouns-adj":
            from counterfactual.text.nlp import default_model_name, load_spacy

            self.model_name = config.spacy_model or default_model_name()
            self.nlp = load_spacy(self.model_name)

    def describe(self) -> dict[str, Any]:
        if self.method == "shuffle":
            return {"method": "shuffle", "seeded_by": "sample_seed"}
        return {"method": "nouns-adj", "spacy_model": self.model_name}

    def __call__(self, batch: Sequence[RewriteRequest]) -> list[RewriteResult]:
        if self.method == "shuffle":
            return [_result(shuffle(req.caption, req.seed)) for req in batch]
        captions = [req.caption for req in batch]
        distinct = list(dict.fromkeys(captions))  # a caption often serves several plans
        kept = dict(
            zip(
                distinct,
                nouns_adj_many(distinct, self.nlp, batch_size=self.batch_size),
                strict=True,
            )
        )
        return [_result(kept[caption]) for caption in captions]
