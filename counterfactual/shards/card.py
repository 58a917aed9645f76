"""The dataset card ``OUT/README.md``: what Hugging Face ``datasets.load_dataset(OUT)`` reads.

Its YAML front matter names the shards that hold samples (``configs``: one ``train`` split,
paths relative to ``OUT``, so the folder can be copied or uploaded whole) and declares the
features (``dataset_info``): ``jpg`` an image (with ``--pairs`` also ``orig.jpg`` and
``mask.png``), ``txt`` a string, ``json`` the struct of every key any sample's json has, with
the types merged over all samples (:mod:`counterfactual.json_types`), a key that every sample
holds as ``None`` with the type it holds when set
(:data:`~counterfactual.shards.samples.NULLABLE_TYPES`). Without declared features ``datasets`` infers them from the
first five samples of the first shard and then drops keys those lack, or fails on a type they
leave unknown (``null``, an empty list). Shards without samples are left out of the list (their
tar is still written, see :mod:`counterfactual.shards.shards`), unless no shard has any: then
the empty shards are listed, so the folder still opens, empty. When two shards' json types cannot
share a column (shards of an older layout beside newer ones), the card declares no features
and says which keys differ. The prose below the front matter is for people: counts, the config
and the license note.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from counterfactual import fs
from counterfactual.json_types import (
    JsonType,
    declare,
    hf_feature,
    json_type,
    merge_types,
    mixed_paths,
)
from counterfactual.reasons import no_samples_line
from counterfactual.shards.samples import NULLABLE_TYPES

CARD_FILE = "README.md"
SPLIT = "train"


@dataclass(frozen=True, slots=True)
class ShardEntry:
    """One committed shard: its file name in ``OUT``, its sample count and its samples' json
    type (``None`` when unknown: a stats file written before types were recorded)."""

    name: str
    samples: int
    json_schema: JsonType | None = None


def shard_json_type(shard: fs.PathLike) -> JsonType | None:
    """The json type of a shard's samples, read from its ``*.json`` members as stored (for
    shards whose stats file does not record it); ``None`` when it has none."""
    merged: JsonType | None = None
    with fs.open_file(shard, "rb") as fh, tarfile.open(fileobj=fh, mode="r:*") as tar:
        for info in tar:
            if info.isfile() and info.name.endswith(".json"):
                data = tar.extractfile(info)
                if data is not None:
                    merged = merge_types(merged, json_type(json.loads(data.read())))
    return merged


PAIR_MEMBERS = ("mask.png", "orig.jpg")
"""The members a ``--pairs`` run adds to each sample (the mask, the original picture)."""


def card_metadata(shards: Sequence[ShardEntry], pairs: bool = False) -> dict[str, Any]:
    """The YAML front matter as a dict (see the module doc). ``pairs``: the samples also hold
    :data:`PAIR_MEMBERS`, declared as images. A run without samples lists its (empty) shards
    and declares the columns it knows without a sample (``jpg``, ``txt``, ``__key__``,
    ``__url__``, the pair's), so ``load_dataset(OUT, streaming=True)`` opens it empty instead
    of guessing a builder from ``status.jsonl``; no ``configs`` without any shard."""
    with_samples = [s for s in shards if s.samples > 0]
    meta: dict[str, Any] = {"license": "other", "tags": ["webdataset", "counterfactual"]}
    if not with_samples:
        if shards:
            meta["configs"] = [_config([s.name for s in shards])]
            features = _features(None, pairs)
            meta["dataset_info"] = {"config_name": "default", "features": features}
        return meta
    meta["configs"] = [_config([s.name for s in with_samples])]
    schema = merged_schema(with_samples)
    if schema is not None:
        schema = declare(schema, NULLABLE_TYPES)
    if schema is not None and not list(mixed_paths(schema)):
        meta["dataset_info"] = {"config_name": "default", "features": _features(schema, pairs)}
    return meta


def _config(paths: list[str]) -> dict[str, Any]:
    return {"config_name": "default", "data_files": [{"split": SPLIT, "path": paths}]}


def _features(schema: JsonType | None, pairs: bool) -> list[dict[str, Any]]:
    """The declared columns; ``json`` only with a schema (a run with samples)."""
    json_ = [{"name": "json", **hf_feature(schema)}] if schema is not None else []
    return [
        {"name": "jpg", "dtype": "image"},
        *json_,
        *({"name": name, "dtype": "image"} for name in (PAIR_MEMBERS if pairs else ())),
        {"name": "txt", "dtype": "string"},
        {"name": "__key__", "dtype": "string"},
        {"name": "__url__", "dtype": "string"},
    ]


def merged_schema(shards: Sequence[ShardEntry]) -> JsonType | None:
    """The json type of all ``shards`` (``None``: one of them has no recorded type)."""
    merged: JsonType | None = None
    for s in shards:
        if s.samples > 0:
            if s.json_schema is None:
                return None
            merged = merge_types(merged, s.json_schema)
    return merged


def card_text(
    shards: Sequence[ShardEntry],
    *,
    counts: Mapping[str, int],
    inputs: int,
    unit: str,
    config: Mapping[str, Any],
    data: Mapping[str, Any],
    pairs: bool = False,
) -> str:
    """``README.md``: the front matter (:func:`card_metadata`) and a short description.
    ``counts`` are ``status.jsonl``'s rows by ``status:reason``; ``config`` is
    :meth:`~counterfactual.synth.plan.SynthConfig.to_dict`, ``data`` the run's data spec;
    ``pairs``: the samples hold their original and mask too (``--pairs``).

    One function per section, in the card's order: the front matter, what a sample holds, the
    run in figures, loading, why there are no samples (a run without any), why no features are
    declared (types that differ or are unknown), the license."""
    meta = card_metadata(shards, pairs)
    held = [s for s in shards if s.samples > 0]
    lines = [
        *_front_matter(meta),
        *_about(pairs),
        *_figures(shards, held, counts, inputs, unit, config, data),
        *_loading(),
    ]
    if not held:
        lines += _no_samples(counts, inputs, unit)
    if held and "dataset_info" not in meta:
        lines += _no_features(held)
    lines += _license()
    return "\n".join(lines)


def _front_matter(meta: dict[str, Any]) -> list[str]:
    """The YAML front matter that ``datasets`` reads."""
    return ["---", yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).rstrip(), "---"]


def _about(pairs: bool) -> list[str]:
    """The title and what a sample holds (with ``--pairs``: its original and mask too)."""
    return [
        "",
        "# Counterfactual image-text pairs",
        "",
        "Made by `counterfactual synth` (object-decorrelation counterfactuals, Kim et al.): "
        "each sample is a picture with one or more object classes removed "
        "(`jpg`), its caption rewritten (`txt`), and everything needed to trace and reproduce "
        "it (`json`: source image and caption, the removal plan with each ratio and threshold, "
        "mask boxes, methods, seeds)."
        + (
            " Each sample also holds its original picture (`orig.jpg`) and the mask "
            "(`mask.png`, 8-bit, 255 = removed); the json's `mask` says how it was made "
            "(source, dilation, where its boxes came from)."
            if pairs
            else ""
        ),
    ]


def _figures(
    shards: Sequence[ShardEntry],
    held: Sequence[ShardEntry],
    counts: Mapping[str, int],
    inputs: int,
    unit: str,
    config: Mapping[str, Any],
    data: Mapping[str, Any],
) -> list[str]:
    """The run in figures: samples and shards, inputs and status rows by status, the options
    that made it, and where the rest is recorded."""
    samples = sum(s.samples for s in shards)
    by_status: dict[str, int] = {}
    for name, n in counts.items():
        status = name.split(":", 1)[0]
        by_status[status] = by_status.get(status, 0) + n
    sel, image, text = config.get("selection", {}), config.get("image", {}), config.get("text", {})
    verify = config.get("verify", {})
    source = str(data.get("kind", "?")) + (f", split {data['split']}" if data.get("split") else "")
    return [
        "",
        f"- {samples:,} samples in {len(held):,} shards"
        + (
            f" ({len(shards) - len(held):,} more shards hold none and are not listed)"
            if len(held) < len(shards)
            else ""
        ),
        f"- from {inputs:,} input {unit} of `{source}`; status rows: "
        + ", ".join(f"{n:,} {status}" for status, n in sorted(by_status.items())),
        f"- selection: policy `{sel.get('policy')}`, alpha1 {sel.get('alpha1')}, "
        f"alpha2 {sel.get('alpha2')}, alpha3 {sel.get('alpha3')}, seed {config.get('seed')}",
        f"- image: `{image.get('method')}`; text: `{text.get('method')}`; verification: "
        f"`{verify.get('mode', 'off')}`",
        "",
        "`manifest.json` holds the whole config, package versions and counts; `status.jsonl` "
        "has a row for every input and item, with the reason when no sample was written.",
    ]


def _loading() -> list[str]:
    """How ``datasets`` loads the folder, and what a missing key reads as."""
    return [
        "",
        "## Loading",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'ds = load_dataset("path/to/this/folder", split="{SPLIT}")',
        'ds[0]["jpg"], ds[0]["txt"], ds[0]["json"]["plan"]["evidence"]["co_removal"]',
        "```",
        "",
        'Per-class evidence is a list of records (`{"class": ..., "ratio": ...}`). A json '
        "key that some samples lack (such as `caption_cleaned`, written only when not 0) reads "
        "as `None` for them.",
    ]


def _no_samples(counts: Mapping[str, int], inputs: int, unit: str) -> list[str]:
    """A run without samples: why, and how to open it empty."""
    return [
        "",
        "## No samples",
        "",
        no_samples_line(counts, f"{inputs:,}", unit),
        "",
        '`load_dataset("path/to/this/folder", streaming=True)` opens it (empty). Without '
        'streaming, `datasets` (5.2 tested) refuses any empty split (`Instruction "train" '
        "corresponds to no data!`).",
    ]


def _no_features(held: Sequence[ShardEntry]) -> list[str]:
    """Why no features are declared: the shards' json types differ, or some are unknown."""
    mixed = list(mixed_paths(merged_schema(held) or "null"))
    why = (
        f"their json differs in type at {', '.join(mixed[:5])}"
        if mixed
        else "some shards' stats files do not record their json types"
    )
    return [
        "",
        f"No features are declared because {why} (shards written by an older version "
        "hold per-class evidence as objects keyed by class name). `datasets` then infers "
        "them from the first samples; write the run into a new folder to load it whole.",
    ]


def _license() -> list[str]:
    """The pictures' and captions' terms: the source dataset's."""
    return [
        "",
        "## License",
        "",
        "The pictures are edited from the source dataset's pictures and the captions derived "
        "from its captions: their licenses and terms of use are those of the source dataset.",
        "",
    ]


def write_card(out_dir: fs.PathLike, text: str, run: str | None = None) -> None:
    """``OUT/README.md``, written whole (a local temporary name renamed, or one upload);
    ``run``: the run token its temporary name carries."""
    fs.write_text(fs.join(out_dir, CARD_FILE), text, run=run)


__all__: Sequence[str] = (
    "CARD_FILE",
    "PAIR_MEMBERS",
    "SPLIT",
    "ShardEntry",
    "card_metadata",
    "card_text",
    "merged_schema",
    "shard_json_type",
    "write_card",
)
