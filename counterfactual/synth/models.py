"""The models a synthesis run loads, read off its config: what ``counterfactual models`` lists
and pulls, what ``synth`` checks before it starts (:func:`missing_models`, one pass: what a dry
run prints and a run stops on), what ``manifest.json`` records (``models``: each with its
resolved revision, the hub commit or the file's sha256)."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from counterfactual.image import ERASERS, candidate_count, chosen_eraser, image_model
from counterfactual.models.embed import parse_model_spec
from counterfactual.models.hub import (
    KNOWN_FILES,
    Located,
    ModelRef,
    ModelUnavailable,
    is_local,
    locate,
    located,
    unavailable_line,
    weight_variant,
)
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.synth.staging import SetupError, plan_steps
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


def _absolute(name: str, file: bool = False) -> str:
    """A local model path made absolute (``~`` expanded); a hub id or an open_clip spec as it
    is; ``hf-clip:``/``blip:`` before a local folder kept. ``file``: a model file (LaMa's),
    local whatever it looks like (``models/big-lama.pt`` is no hub id)."""
    prefix = next((p for p in _LOCAL_PREFIXES if name.startswith(p)), "")
    path = name.removeprefix(prefix)
    if not path or path.startswith("open_clip:") or not (file or is_local(path)):
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
        if ref.kind == "file" or (ref.kind == "hub" and is_local(ref.name)):
            out[ref.option] = ref.name
    return out


@dataclass(frozen=True, slots=True)
class MissingPath:
    """A local model path of the user's (a file or folder no pull fetches) that does not exist
    here; ``stage`` loads it, ``option`` names it."""

    stage: str
    option: str
    path: str

    def line(self) -> str:
        return (
            f"{self.stage}: the model {self.path} does not exist; pass {self.option} a hub id "
            "or an existing folder or file"
        )


@dataclass(frozen=True, slots=True)
class MissingModels:
    """What a run would load and cannot (:func:`missing_models`): ``paths``, local paths that
    do not exist here; ``unavailable``, hub models and published files (:data:`KNOWN_FILES`,
    LaMa's) that are neither here nor to be had, each with its ``problem``. Empty: false."""

    paths: tuple[MissingPath, ...] = ()
    unavailable: tuple[Located, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.paths or self.unavailable)

    def line(self, fix: str) -> str:
        """One line naming each: the local paths, then the models to fetch and ``fix``, the
        command that fetches them (``counterfactual models pull ...``)."""
        parts = [p.line() for p in self.paths]
        if self.unavailable:
            parts.append(unavailable_line(self.unavailable, fix))
        return "; ".join(parts)

    def error(self, fix: str) -> ValueError:
        """The error a run stops on: :class:`ModelUnavailable` when a model is to be fetched,
        else :class:`SetupError`."""
        line = self.line(fix)
        return ModelUnavailable(line) if self.unavailable else SetupError(line)


def missing_models(
    config: SynthConfig, runtime: Runtime | None = None, *, hub: bool = True
) -> MissingModels:
    """Every model ``config`` loads that is not here, in one pass, without loading any: a
    local path (``/``, ``.``, ``~``, or a model file, relative ones from the working directory)
    that does not exist, and (``hub``) a hub model or published file that is neither here nor
    to be had (:func:`~counterfactual.models.hub.located`: the Hugging Face cache, else one
    metadata call to the hub, none offline). ``hub=False``: local paths only (a library run,
    which may be handed its own backends, leaves the rest to the steps that load them)."""
    fetchable = [
        ref
        for ref in needed_models(config, runtime)
        if (ref.kind == "hub" and not is_local(ref.name))
        or (ref.kind == "file" and Path(ref.name).name in KNOWN_FILES)
    ]
    fetched = {ref.option for ref in fetchable} if hub else set()
    local = local_model_paths(config, runtime)  # option -> absolute path
    paths = []
    for spec in plan_steps(config, runtime):
        res = spec.resources
        if res is None or res.option in fetched:
            continue
        model = res.model
        path = model.split(":", 1)[1] if model.startswith(("hf-clip:", "blip:")) else model
        path = local.get(res.option, path)
        if (res.option in local or path.startswith(("/", "./", "../", "~"))) and not os.path.exists(
            os.path.expanduser(path)
        ):
            paths.append(MissingPath(res.stage, res.option, path))
    unavailable = [loc for loc in located(fetchable) if not loc.present] if hub else []
    return MissingModels(tuple(paths), tuple(unavailable))
