"""``prompt``: a caption from one of CLIP's 80 ImageNet prompt templates, filled with the kept
classes (Kim et al., Sec. 3.3). The template's own determiner goes with the first class, the
others get an article and are joined in English: ``a photo of a {}.`` with person, dog, cat
gives ``a photo of a person, a dog and a cat.``"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from counterfactual.draws import draw_index
from counterfactual.text.base import RewriteRequest, RewriteResult, TextOptions

# The 80 templates of CLIP's ImageNet prompt ensemble (Radford et al. 2021), verbatim.
TEMPLATES: tuple[str, ...] = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)
assert len(TEMPLATES) == 80

_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def with_article(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def join_classes(classes: Sequence[str]) -> str:
    """``person`` / ``person and a dog`` / ``person, a dog and a cat``: the first class bare
    (the template supplies its determiner), the rest with an article."""
    if not classes:
        raise ValueError("join_classes needs at least one class")
    first, rest = classes[0], [with_article(c) for c in classes[1:]]
    if not rest:
        return first
    return ", ".join([first, *rest[:-1]]) + " and " + rest[-1]


def fill(template: str, classes: Sequence[str]) -> str:
    """The template filled with ``classes``; "a" before a vowel becomes "an"."""
    return _A_BEFORE_VOWEL.sub(r"\1n ", template.format(join_classes(classes)))


class PromptWriter:
    """Callable rewriter: one template per request, drawn reproducibly from the request's seed
    and caption."""

    def __init__(self, config: TextOptions | None = None) -> None:
        self.config = config or TextOptions(method="prompt")

    def describe(self) -> dict[str, Any]:
        return {"method": "prompt", "templates": "clip-imagenet-80"}

    def __call__(self, batch: Sequence[RewriteRequest]) -> list[RewriteResult]:
        out = []
        for req in batch:
            if not req.kept:
                out.append(RewriteResult(text=None, reason="nothing-kept"))
                continue
            template = TEMPLATES[draw_index(req.seed, req.caption, len(TEMPLATES))]
            out.append(RewriteResult(text=fill(template, req.kept)))
        return out
