"""The models a synthesis run loads, read off its config: what ``counterfactual models`` lists
and pulls, what ``synth`` checks before it starts, what ``manifest.json`` records (``models``:
each with its resolved revision, the hub commit or the file's sha256)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from counterfactual.image import ERASERS, candidate_count, chosen_eraser, image_model
from counterfactual.models.embed import parse_model_spec
from counterfactual.models.hub import Located, ModelRef, locate, weight_variant
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.text import text_model


def needed_models(config: SynthConfig, runtime: Runtime | None = None) -> tuple[ModelRef, ...]:
    """Every model ``config`` loads, in run order: the detector (detected boxes), the
    inpainter (the chosen eraser's model: a hub id or folder, or a file for one that declares
    ``model_file``, as LaMa), the captioner (``captioner``
    text), the verifier's CLIP (``--verify``/``--filter``, or best-of-n's scorer). Hub weights
    prefer the ``fp16`` variant when the run computes in half precision (:func:`weight_variant`,
    the rule the inpainter loads by)."""
    runtime = runtime or Runtime()
    variant = weight_variant(runtime.dtype)
    refs: list[ModelRef] = []
    if config.detect is not None:
        refs.append(ModelRef("detector", "--detector-model", "hub", config.detect.model))
    image = config.image
    eraser, inpainter = chosen_eraser(image), image_model(image)
    option = eraser.model_option()
    if inpainter is not None and option is not None:
        if eraser.model_file:
            refs.append(ModelRef("inpainter", option.cli or option.flat, "file", inpainter))
        else:
            refs.append(ModelRef("inpainter", option.cli or option.flat, "hub", inpainter, variant))
    captioner = text_model(config.text)
    if captioner is not None:
        refs.append(ModelRef("captioner", "--captioner-model", "hub", captioner))
    if config.verify.enabled or candidate_count(image) > 1:
        refs.append(_embedder_ref("verifier", "--verify-model", config.verify.model))
    return tuple(refs)


def _embedder_ref(role: str, option: str, spec_text: str) -> ModelRef:
    """A zero-shot model spec (``hf-clip:ID``, ``blip:ID``, ``open_clip:...``, a folder) as the
    model to fetch: the hub id or folder, or open_clip's own download."""
    if Path(spec_text).expanduser().is_dir():
        return ModelRef(role, option, "hub", spec_text)
    spec = parse_model_spec(spec_text)
    if spec.kind != "open_clip":
        return ModelRef(role, option, "hub", spec.name)
    if spec.name.startswith("hf-hub:"):
        return ModelRef(role, option, "hub", spec.name.removeprefix("hf-hub:"))
    return ModelRef(role, option, "open_clip", str(spec))


def model_records(config: SynthConfig, runtime: Runtime | None = None) -> list[dict[str, Any]]:
    """What ``manifest.json`` records of each model, as the driver finds it (no network)."""
    return [locate(ref).to_dict() for ref in needed_models(config, runtime)]


def located_models(config: SynthConfig, runtime: Runtime | None = None) -> list[Located]:
    return [locate(ref) for ref in needed_models(config, runtime)]


_LOCAL_PREFIXES = ("hf-clip:", "blip:")


def names_a_path(name: str) -> bool:
    """Whether a model name is a local path for certain: it starts like one (``/``, ``.``,
    ``~``) or is on this disk. A bare word (``gpt2``, a test's scripted backend) or ``ORG/NAME``
    that is not on disk may be a hub id, so it is left as it is and not checked as a path."""
    return name.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(name))


def _absolute(name: str, file: bool = False) -> str:
    """A local model path made absolute (``~`` expanded); a hub id or an open_clip spec as it
    is; ``hf-clip:``/``blip:`` before a local folder kept. ``file``: a model file (LaMa's),
    local whatever it looks like (``models/big-lama.pt`` is no hub id)."""
    prefix = next((p for p in _LOCAL_PREFIXES if name.startswith(p)), "")
    path = name.removeprefix(prefix)
    if not path or path.startswith("open_clip:") or not (file or names_a_path(path)):
        return name
    return prefix + os.path.abspath(os.path.expanduser(path))


def absolute_models(config: SynthConfig) -> SynthConfig:
    """``config`` with every local model path absolute, as the driver resolves it: the
    actors on any node (and in any working directory) load what the driver checked. The
    fingerprint stays the config's as given (the path as typed decides nothing)."""
    image = config.image
    parts = {}
    for eraser in ERASERS.values():
        if eraser.model:
            part = getattr(image, eraser.name)
            path = _absolute(getattr(part, eraser.model), file=eraser.model_file)
            parts[eraser.name] = replace(part, **{eraser.model: path})
    out = replace(
        config,
        image=replace(image, **parts),
        verify=replace(config.verify, model=_absolute(config.verify.model)),
    )
    if config.detect is not None:
        out = replace(out, detect=replace(config.detect, model=_absolute(config.detect.model)))
    return out


def local_model_paths(config: SynthConfig, runtime: Runtime | None = None) -> dict[str, str]:
    """The local files and folders ``config`` loads models from, absolute, by the option that
    names them (what every node that loads them must see): hub ids and open_clip tags are
    left out."""
    out: dict[str, str] = {}
    for ref in needed_models(absolute_models(config), runtime):
        if ref.kind == "file" or (ref.kind == "hub" and names_a_path(ref.name)):
            out[ref.option] = ref.name
    return out
