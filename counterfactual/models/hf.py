"""One way to load a Hugging Face transformers model and its processor, for every user of one:
the embedders (``eval``, and the verifier through them), the trainer, the detector and the
captioner.

A model is named by a hub id (read from the Hugging Face cache, or downloaded when the hub is
reachable) or a local ``save_pretrained`` folder, at an optional revision; a hub id that
``models pull`` put in the cache loads at the commit the cache pins (:func:`pinned_revision`),
as the diffusers inpainter does. Each step that can
fail raises one ``ValueError`` line that starts with the caller's words (:class:`Words`: which
model, what it should be) and ends with the library's reason: a name that is neither a folder
nor a cached or reachable hub id (offline?), a model of another family, weights the caller
needs that the checkpoint lacks, weights torch refuses to unpickle or a safetensors file that
does not parse (naming the file). transformers is imported when a model is loaded, never at
import time.

Nothing a model folder brings runs: every load passes ``trust_remote_code=False`` and first
reads the folder's ``config.json`` (and processor and tokenizer configs) as JSON
(:func:`counterfactual.models.trust.check_transformers`): an ``auto_map`` is refused with one
line naming the file, before any class is resolved; :func:`read_config` gives the raw config, so
a caller checks ``model_type`` before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from counterfactual._lazy import require
from counterfactual.models.trust import check_transformers, weight_errors, weights_failure

if TYPE_CHECKING:
    import torch

LOAD_ERRORS = (OSError, ValueError, KeyError, RuntimeError)
"""What transformers raises for a name it cannot resolve offline, a folder without the files,
or weights that do not fit the class."""


@dataclass(frozen=True, slots=True)
class Words:
    """How a caller's errors name its model: each field is a message's start, before ``: ``
    and the reason. ``no_config``: no config found; ``no_model``: the model or processor did
    not load; ``not_checkpoint``: weights it needs are missing (``{count}`` and the first
    three names follow)."""

    no_config: str
    no_model: str
    not_checkpoint: str = ""


def looks_local(name: str) -> bool:
    """A name meant as a path: it starts like one or has more slashes than ``org/name``."""
    return name.startswith(("/", "./", "../", "~", "\\")) or name.count("/") > 1 or "\\" in name


def read_config(source: str, words: Words, revision: str | None = None) -> dict[str, Any]:
    """``source``'s ``config.json`` as parsed JSON, once no file of it names code
    (:func:`~counterfactual.models.trust.check_transformers`: an ``UntrustedModel`` line);
    no config at all is a ``ValueError`` (``words.no_config``). No class is resolved: this is
    where ``model_type`` is checked."""
    require("transformers", "models")
    revision = _revision(source, revision)
    config = check_transformers(source, revision)
    if not config:
        raise ValueError(f"{words.no_config}: no config.json")
    return config


def model_type(source: str, words: Words, revision: str | None = None) -> str:
    """``model_type`` of ``source``'s ``config.json`` (:func:`read_config`); ``""`` when
    the config has none."""
    value = read_config(source, words, revision).get("model_type", "")
    return value if isinstance(value, str) else ""


def load_config(source: str, words: Words, revision: str | None = None) -> Any:
    """The ``PretrainedConfig`` of ``source`` (hub id or folder), or ``ValueError``
    (``words.no_config``)."""
    transformers = require("transformers", "models")
    revision = _revision(source, revision)
    check_transformers(source, revision)
    try:
        return transformers.AutoConfig.from_pretrained(source, **_at(revision))
    except LOAD_ERRORS as err:
        raise ValueError(f"{words.no_config}: {err}") from err


def load_pretrained(
    source: str,
    model_class: str,
    words: Words,
    *,
    dtype: torch.dtype | None = None,
    revision: str | None = None,
    needed: Callable[[str], bool] | None = None,
) -> tuple[Any, Any]:
    """``(model, processor)`` of ``source`` (hub id or folder) as transformers' ``model_class``
    (a class name such as ``"CLIPModel"`` or ``"AutoModelForZeroShotObjectDetection"``) in
    ``dtype`` (``None``: as saved), and its ``AutoProcessor``.

    ``needed``: which weight names the caller uses; a checkpoint missing any of them (they would
    be drawn at random) is a ``ValueError`` (``words.not_checkpoint``). Any load failure is a
    ``ValueError`` (``words.no_model``)."""
    transformers = require("transformers", "models")
    revision = _revision(source, revision)
    check_transformers(source, revision)
    options: dict[str, Any] = _at(revision)
    if dtype is not None:
        options["dtype"] = dtype
    try:
        model, info = getattr(transformers, model_class).from_pretrained(
            source, output_loading_info=True, **options
        )
        processor = transformers.AutoProcessor.from_pretrained(source, **_at(revision))
    except LOAD_ERRORS + weight_errors() as err:
        # weights that do not load name their file: the line needs no more than that
        raise ValueError(weights_failure(err, source) or f"{words.no_model}: {err}") from err
    if needed is not None:
        missing = sorted(k for k in info["missing_keys"] if needed(k))
        if missing:
            raise ValueError(
                f"{words.not_checkpoint}: {len(missing)} weights it needs are missing, e.g. "
                f"{missing[:3]}"
            )
    return model, processor


def load_tokenizer(source: str, message: str, revision: str | None = None) -> Any:
    """``AutoTokenizer`` of ``source``, or ``ValueError`` starting with ``message``."""
    transformers = require("transformers", "models")
    revision = _revision(source, revision)
    check_transformers(source, revision)
    try:
        return transformers.AutoTokenizer.from_pretrained(source, **_at(revision))
    except LOAD_ERRORS as err:
        raise ValueError(f"{message}: {err}") from err


def pinned_revision(source: str) -> str | None:
    """The commit the Hugging Face cache pins for the hub id ``source`` (its ``refs/main``,
    which ``models pull`` wrote), or ``None``: a folder, or a hub id not in the cache (then
    transformers resolves ``main`` itself). The diffusers inpainter loads at the same commit."""
    from counterfactual.models.hub import ModelRef, is_local, locate

    if not source or is_local(source):
        return None
    found = locate(ModelRef("model", "model", "hub", source))
    return found.revision if found.source == "cache" else None


def _revision(source: str, revision: str | None) -> str | None:
    """``revision`` when the caller names one, else the cache's pinned commit."""
    return revision if revision is not None else pinned_revision(source)


def _at(revision: str | None) -> dict[str, Any]:
    """The keyword arguments of every ``from_pretrained``: the revision, and never the
    folder's code (``trust_remote_code=False``: transformers refuses it, and never asks)."""
    options: dict[str, Any] = {"trust_remote_code": False}
    if revision is not None:
        options["revision"] = revision
    return options
