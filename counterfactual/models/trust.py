"""A model folder is data, never code: what every learned-model load checks before it loads.

transformers and diffusers can import Python a model folder brings (a config's ``auto_map``, a
``model_index.json`` naming a custom pipeline or component module); this project never lets
them. Every loader passes ``trust_remote_code=False`` and first calls :func:`check_transformers`
or :func:`check_diffusers`, which read the folder's JSON files themselves (no class resolved,
nothing imported) and refuse code with one :class:`UntrustedModel` line naming the file.

Weights are read as data too: torch's ``weights_only`` unpickler refuses a pickle that would
run code, and :func:`weights_failure` turns that refusal (or an unreadable safetensors file)
into one line naming the file. Neither module imports torch or transformers at import time.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from counterfactual._lazy import require
from counterfactual.messages import one_line, short

TRANSFORMERS_FILES = (
    "config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "image_processor_config.json",
    "video_preprocessor_config.json",
    "feature_extractor_config.json",
    "tokenizer_config.json",
)
"""The JSON files of a transformers model folder that may name code (``auto_map``)."""

LIBRARIES = frozenset({"diffusers", "transformers"})
"""The libraries a diffusers ``model_index.json`` may take its components from."""

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


class UntrustedModel(ValueError):
    """A model folder that would run its own code (or whose JSON cannot be read as data): one
    line naming the file and what in it is refused."""


def read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in ``path``, or an :class:`UntrustedModel` line naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise UntrustedModel(f"{path}: cannot read it ({one_line(err)})") from err
    except json.JSONDecodeError as err:
        raise UntrustedModel(f"{path}: not valid JSON ({err})") from err
    if not isinstance(data, dict):
        raise UntrustedModel(f"{path}: not a JSON object")
    return data


def check_auto_map(path: str | os.PathLike[str], data: dict[str, Any]) -> None:
    """An :class:`UntrustedModel` when ``data`` (read from ``path``) names custom code."""
    if "auto_map" in data:
        names = sorted(_code_names(data["auto_map"]))
        files = ", ".join(sorted({f"{name.split('.')[0]}.py" for name in names})[:3]) or "?"
        raise UntrustedModel(
            f"{path}: auto_map names code the folder brings ({short(names[:3])}, in {files}); "
            "models load without running a folder's code (trust_remote_code=False): use a "
            "model of a family transformers ships"
        )


def check_transformers(source: str, revision: str | None = None) -> dict[str, Any]:
    """The parsed ``config.json`` of ``source`` (a local folder, or a hub id read from the
    Hugging Face cache or the hub), after checking that neither it nor the processor and
    tokenizer configs (:data:`TRANSFORMERS_FILES`, a local folder's subfolders too) name
    code. ``{}`` when there is no ``config.json`` (the loader then says what is missing).
    Nothing is imported and no class is resolved."""
    found = dict(_files(source, TRANSFORMERS_FILES, revision))
    for path, data in found.items():
        check_auto_map(path, data)
    if os.path.isdir(source):
        for sub in sorted(p for p in Path(source).iterdir() if p.is_dir()):
            for name in TRANSFORMERS_FILES:
                if (sub / name).is_file():
                    check_auto_map(sub / name, read_json(sub / name))
    config = [data for path, data in found.items() if Path(path).name == "config.json"]
    return config[0] if config else {}


def check_diffusers(source: str, index: dict[str, Any], index_path: str) -> str:
    """The pipeline class name ``model_index.json`` (``index``, read from ``index_path``)
    names, after checking that it is one of diffusers' classes, that every component comes from
    diffusers or transformers (or is empty), and that no component's config names code."""
    diffusers = require("diffusers", "models")
    name = index.get("_class_name")
    if not isinstance(name, str):
        raise UntrustedModel(
            f"{index_path}: _class_name {short(name)} names a custom pipeline (code the "
            "folder brings); only diffusers' own pipeline classes load"
        )
    if not hasattr(diffusers, name):
        raise UntrustedModel(
            f"{index_path}: _class_name {short(name)} is not a pipeline class of diffusers "
            f"{diffusers.__version__}"
        )
    for key, value in index.items():
        if key.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library = value[0]
        if library is not None and library not in LIBRARIES:
            raise UntrustedModel(
                f"{index_path}: component {key!r} comes from {short(library)}, not diffusers "
                "or transformers (code the folder brings is never run)"
            )
    if os.path.isdir(source):
        for sub in sorted(p for p in Path(source).iterdir() if p.is_dir()):
            for path in sorted(sub.glob("*.json")):
                check_auto_map(path, read_json(path))
    return name


def weights_failure(err: BaseException, source: str) -> str | None:
    """What a load error says when torch refused a pickle (``weights_only``) or a safetensors
    file did not parse, found on ``err`` or the errors it was raised from (diffusers wraps
    them in an ``OSError``): one line naming the file(s) of ``source`` (a folder or a file)
    and the cause; ``None`` for any other error."""
    cause = _weights_cause(err)
    if cause is None:
        return None
    if isinstance(cause, pickle.UnpicklingError):
        files = _named(p for p in weight_files(source) if p.suffix != ".safetensors") or source
        return (
            f"{files}: torch refused to unpickle it (weights_only: {_unpickler_reason(cause)}); "
            "a checkpoint that needs more than tensors is never loaded: use safetensors weights"
        )
    files = _named(_broken_safetensors(source)) or source
    return f"{files}: not a readable safetensors file ({one_line(cause, 120)})"


def weight_errors() -> tuple[type[BaseException], ...]:
    """The errors a weights file that torch refuses or cannot parse raises, beyond
    ``OSError``/``ValueError``/``RuntimeError``."""
    errors: list[type[BaseException]] = [pickle.UnpicklingError, EOFError]
    try:
        from safetensors import SafetensorError
    except ImportError:
        pass
    else:
        errors.append(SafetensorError)
    return tuple(errors)


def weight_files(source: str) -> list[Path]:
    """The weight files of a local folder (its subfolders too), or ``source`` itself when it
    is a file; ``[]`` for a hub id."""
    path = Path(source)
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.rglob("*") if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def _weights_cause(err: BaseException | None) -> BaseException | None:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, pickle.UnpicklingError) or type(err).__name__ == "SafetensorError":
            return err
        err = err.__cause__ or err.__context__
    return None


def _unpickler_reason(err: BaseException) -> str:
    """torch's reason without its boilerplate: ``Trying to load unsupported GLOBAL
    posix.system ...``, ``Unsupported operand 149``."""
    boilerplate = ("Weights only load failed", "Check the documentation", "Please file an issue")
    parts = [p.strip() for p in str(err).split("\n\n")]
    kept = [p for p in parts if p and not p.startswith(boilerplate)]
    return one_line(" ".join(kept) or "a pickle of more than tensors", 160)


def _broken_safetensors(source: str) -> list[Path]:
    """The ``.safetensors`` files of ``source`` whose header does not parse."""
    from safetensors import SafetensorError, safe_open

    broken = []
    for path in weight_files(source):
        if path.suffix == ".safetensors":
            try:
                with safe_open(str(path), framework="numpy"):
                    pass
            except (SafetensorError, OSError):
                broken.append(path)
    return broken


def _named(paths: Iterable[Path]) -> str:
    names = [str(p) for p in paths]
    return ", ".join(names[:2]) + (f" (+{len(names) - 2})" if len(names) > 2 else "")


def _files(
    source: str, names: Iterable[str], revision: str | None
) -> Iterable[tuple[str, dict[str, Any]]]:
    """``(path, parsed JSON)`` of each of ``names`` that ``source`` has."""
    for name in names:
        path = _resolve(source, name, revision)
        if path is not None:
            yield path, read_json(path)


def _resolve(source: str, name: str, revision: str | None) -> str | None:
    """The local path of ``source``'s file ``name`` (a folder's, or a hub id's from the cache
    or the hub), ``None`` when it has none."""
    if os.path.isdir(source):
        path = os.path.join(source, name)
        return path if os.path.isfile(path) else None
    utils = require("transformers", "models").utils
    try:
        return utils.cached_file(
            source,
            name,
            revision=revision,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except (OSError, ValueError):
        return None  # not a hub id it can resolve: the loader says so in its own words


def _code_names(auto_map: object) -> Iterable[str]:
    values = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    for value in values:
        for item in value if isinstance(value, list | tuple) else [value]:
            if isinstance(item, str):
                yield item.split("--")[-1]
