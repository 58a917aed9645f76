"""Caption synthesis: rewrite a caption so it no longer mentions the removed classes.

Every backend is a small callable behind :class:`TextRewriter`. A method declares itself with a
:class:`Rewriter` (its names, one phrase for the help, what its captions promise, a builder that
imports its module only when chosen) and one entry in :data:`BUILT_IN`, or a package's entry
point in the group ``counterfactual.rewriters`` (:mod:`counterfactual.plugins`); :data:`TEXT_METHODS`,
:data:`REMOVING_METHODS`, ``--text-method``'s help and :func:`make_rewriter` follow from it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from counterfactual import plugins
from counterfactual.options import declare
from counterfactual.text.base import RewriteRequest, RewriteResult, TextOptions

CAPTION_STILL_NAMES = "caption-still-names"
"""The status reason of a rewrite that still names a removed class
(:class:`counterfactual.text.np_removal.MentionCheck`)."""
CLASS_NOT_IN_VOCABULARY = "class-not-in-vocabulary"
"""The status reason of a sample whose removed class the vocabulary has no words for: its
caption can be neither cut nor checked (:meth:`counterfactual.vocab.ClassVocabulary.lacking`)."""


Build = Callable[..., "TextRewriter"]
"""``build(config, vocabulary, device=, dtype=, batch_size=)``: the rewriter of a
:class:`TextConfig` (see :func:`make_rewriter` for the arguments)."""


@dataclass(frozen=True, slots=True)
class Rewriter:
    """A text method as it declares itself, read without loading anything.

    ``names`` are the ``--text-method`` values it serves (the perturbations serve ``shuffle``
    and ``nouns-adj``); ``summary`` is the command line's one phrase about them; ``build``
    (:data:`Build`) makes the rewriter, importing its module only then. ``removes``: its
    caption must name no removed class (checked after the rewrite, status reason
    :data:`CAPTION_STILL_NAMES`, and by the verifier's text check); ``names_kept``: its caption
    must also name a kept class (the verifier checks it). The perturbations do neither: they
    keep the caption's words on purpose. ``reads_image``: it reads the edited picture, so the
    rewrite runs after the edit; ``model``: the :class:`TextConfig` field naming the model it
    loads (``""``: none; see :func:`text_model`). ``cuts``: its caption is the original one
    with words cut, so it needs a caption (a record without one fails, ``no-caption``) and
    ``skip_unchanged`` applies to it."""

    names: tuple[str, ...]
    summary: str
    build: Build
    removes: bool = False
    names_kept: bool = False
    reads_image: bool = False
    model: str = ""
    cuts: bool = False

    def __post_init__(self) -> None:
        if not self.names:
            raise ValueError(f"rewriter {self.summary!r} serves no --text-method name")
        if self.names_kept and not self.removes:
            raise ValueError(f"rewriter {self.names}: names_kept needs removes")


def _np_removal(
    config: TextConfig, vocabulary: str | None, *, device: str, dtype: str, batch_size: int
) -> TextRewriter:
    from counterfactual.text.np_removal import NounPhraseRemover
    from counterfactual.vocab import load_vocabulary

    return NounPhraseRemover(config, load_vocabulary(vocabulary), batch_size=batch_size)


def _prompt(
    config: TextConfig, vocabulary: str | None, *, device: str, dtype: str, batch_size: int
) -> TextRewriter:
    from counterfactual.text.prompts import PromptWriter

    return PromptWriter(config)


def _captioner(
    config: TextConfig, vocabulary: str | None, *, device: str, dtype: str, batch_size: int
) -> TextRewriter:
    from counterfactual.text.captioner import Captioner

    return Captioner(config, device=device, dtype=dtype, batch_size=batch_size)


def _perturb(
    config: TextConfig, vocabulary: str | None, *, device: str, dtype: str, batch_size: int
) -> TextRewriter:
    from counterfactual.text.perturb import PerturbRewriter

    return PerturbRewriter(config, batch_size=batch_size)


BUILT_IN = (
    Rewriter(
        ("np-removal",),
        "cut the noun phrases naming removed classes",
        _np_removal,
        removes=True,
        names_kept=True,
        cuts=True,
    ),
    Rewriter(
        ("prompt",), "a CLIP template of the kept classes", _prompt, removes=True, names_kept=True
    ),
    Rewriter(
        ("captioner",),
        "a new caption of the edited picture",
        _captioner,
        removes=True,
        reads_image=True,
        model="model",
    ),
    Rewriter(("shuffle", "nouns-adj"), "perturbed captions", _perturb),
)
"""The text methods this package ships, in declaration order."""


def _plugin_problem(
    taken: Mapping[str, Rewriter], plugin: plugins.Plugin, found: Any
) -> str | None:
    """Why a plugin's object cannot join the rewriters ``taken`` (``None``: it can)."""
    if not isinstance(found, Rewriter):
        return f"{type(found).__name__} is not a counterfactual.text.Rewriter"
    if plugin.name not in found.names:
        return f"the rewriter serves {list(found.names)}, not its entry point's {plugin.name!r}"
    clash = [name for name in found.names if name in taken]
    if clash:
        return f"text method(s) {clash} are served already"
    return None


def _registered() -> tuple[Rewriter, ...]:
    """The built-ins, then every plugin (:mod:`counterfactual.plugins`)."""
    by_name: dict[str, Rewriter] = {name: r for r in BUILT_IN for name in r.names}
    if len(by_name) != sum(len(r.names) for r in BUILT_IN):
        raise ValueError(
            f"two rewriters serve one --text-method name: {[r.names for r in BUILT_IN]}"
        )
    declared = list(BUILT_IN)
    check = functools.partial(_plugin_problem, by_name)
    for _, rewriter in plugins.load(plugins.REWRITERS, by_name, check):
        declared.append(rewriter)
        by_name.update((name, rewriter) for name in rewriter.names)
    return tuple(declared)


_DECLARED = _registered()
REWRITERS: dict[str, Rewriter] = {name: r for r in _DECLARED for name in r.names}
"""Every text method, by ``--text-method`` value, in declaration order (:data:`BUILT_IN`, then
the plugins of the ``counterfactual.rewriters`` entry points): the order of the command line's
choices and of its help."""
TEXT_METHODS = tuple(REWRITERS)
REMOVING_METHODS = tuple(name for name, r in REWRITERS.items() if r.removes)
"""The methods whose caption must not name a removed class (the perturbations keep the words of
the caption on purpose)."""
KEEPING_METHODS = tuple(name for name, r in REWRITERS.items() if r.names_kept)
"""The methods whose caption must also name a kept class."""
CUTTING_METHODS = tuple(name for name, r in REWRITERS.items() if r.cuts)
"""The methods that cut the original caption (:attr:`Rewriter.cuts`)."""
_METHOD_HELP = "; ".join(f"{', '.join(r.names)}: {r.summary}" for r in _DECLARED)


@dataclass(frozen=True, slots=True)
class TextConfig(TextOptions):
    """How to rewrite: the options every rewriter reads (:class:`~counterfactual.text.base.TextOptions`,
    in the order ``--help`` shows them), ``method`` one of the registered :data:`TEXT_METHODS`.
    The class vocabulary np-removal matches is passed to
    :func:`make_rewriter` (in a synthesis run: :attr:`counterfactual.synth.plan.SynthConfig.vocabulary`,
    shared by every step that names classes), and so are the device, dtype and batch size
    (:class:`counterfactual.synth.plan.Runtime`)."""

    method: str = declare(
        "np-removal",
        help=_METHOD_HELP + " (default: %(default)s)",
        choices=TEXT_METHODS,
        flags=("--text-method",),
    )

    def __post_init__(self) -> None:
        if self.method not in TEXT_METHODS:
            raise ValueError(f"text method {self.method!r} is not one of {TEXT_METHODS}")
        if not isinstance(self.repair, bool):
            raise ValueError(f"repair must be True or False, got {self.repair!r}")
        if not isinstance(self.skip_unchanged, bool):
            raise ValueError(f"skip_unchanged must be True or False, got {self.skip_unchanged!r}")
        if self.skip_unchanged and self.method not in CUTTING_METHODS:
            raise ValueError(
                f"skip_unchanged applies to {', '.join(CUTTING_METHODS)} only, "
                f"not to {self.method!r}"
            )


class TextRewriter(Protocol):
    def describe(self) -> dict[str, Any]:
        """What to record in each sample's metadata (method, model id, parameters)."""
        ...

    def __call__(self, batch: Sequence[RewriteRequest]) -> list[RewriteResult]: ...


def text_model(config: TextConfig) -> str | None:
    """The model the chosen method loads (``None``: it loads none, or only spaCy)."""
    model = REWRITERS[config.method].model
    return getattr(config, model) if model else None


def make_rewriter(
    config: TextConfig,
    vocabulary: str | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    batch_size: int = 256,
) -> TextRewriter:
    """The rewriter for ``config``; heavy backends are imported only when chosen.
    ``vocabulary``: the class word-list file np-removal matches (``None``: COCO's).
    ``batch_size``: captions per captioner call and per spaCy batch; ``device`` and ``dtype``:
    where and in what the captioner runs."""
    return REWRITERS[config.method].build(
        config, vocabulary, device=device, dtype=dtype, batch_size=batch_size
    )
