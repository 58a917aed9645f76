"""What a synthesis run does to a record before any pixel is touched.

:class:`SynthConfig` holds the options that decide a run's output and :class:`Runtime` beside
it those that do not (device, dtype, batch sizes): only the first are in the run's fingerprint
(:func:`fingerprint_of`), which a rerun must match to resume. :func:`plan` turns records into
work items (one per chosen plan and caption, with a stable key and seed) or the status saying
why a record yields none (:func:`counterfactual.shards.pictures.load_record_image` decodes a
record's picture and checks it against the annotation). The per-item steps live in :mod:`counterfactual.synth.steps`, the runs in
:mod:`counterfactual.synth.runner` (in-process) and ``pipelines/`` (Ray).
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from functools import cache
from importlib import resources
from pathlib import Path, PurePath
from typing import Any

from counterfactual import fs
from counterfactual.draws import draw_index, item_seed
from counterfactual.image import ImageConfig
from counterfactual.imageio import DEFAULT_MAX_PIXELS
from counterfactual.method.cooccurrence import CooccurrenceStats
from counterfactual.method.detect import DetectConfig
from counterfactual.method.masks import MaskConfig
from counterfactual.method.selection import RemovalPlan, Selection, SelectionConfig, select_many
from counterfactual.method.verify import VerifyConfig
from counterfactual.models.runtime import (  # noqa: F401  (DTYPES: named here too)
    DTYPES,
    check_device,
    check_dtype,
)
from counterfactual.options import declare
from counterfactual.records import Caption, ImageRecord, Status
from counterfactual.shards.frames import EXIF_FRAMES
from counterfactual.shards.shards import sample_key
from counterfactual.text import CUTTING_METHODS, TextConfig

CAPTION_CHOICES = ("one", "all")
DEFAULT_MAX_BOXES = 1000
"""The most boxes one image may have (``--max-boxes``). COCO's most is under 100 and LVIS's a
few hundred; selection's time grows with the square of an image's boxes (its memory only
linearly), so an image with thousands (a generated or hostile file) would cost one worker
minutes: it fails as ``too-many-boxes`` instead."""
RUNTIME_FIELDS: dict[str, dict[str, str]] = {
    "image": {"device": "device", "dtype": "dtype", "batch_size": "inpaint_batch_size"},
    "text": {"batch_size": "text_batch_size", "device": "device", "dtype": "dtype"},
    "verify": {"device": "device", "batch_size": "verify_batch_size"},
    "detect": {"device": "device", "dtype": "dtype", "batch_size": "detect_batch_size"},
}
"""Per part of a :class:`SynthConfig`: the keyword arguments its backend takes its runtime in
(:meth:`Runtime.part`) and the :class:`Runtime` field of each. The manifest records them under
these names inside the part, where the parts held them before the split (:data:`RECORDED_AFTER`);
the fingerprint leaves them out."""
RECORDED_AFTER: dict[str, dict[str, str]] = {
    "image": {"device": "model"},
    "text": {"batch_size": "vocabulary", "device": "model"},
}
"""Where :meth:`SynthConfig.record` puts a runtime key inside its part: after this option;
a key not named here follows the runtime key before it, the first at the end."""


def _whole(name: str, value: Any, low: int, high: int | None = None) -> None:
    """``ValueError`` unless ``value`` is an int in ``[low, high]``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < low
        or (high is not None and value > high)
    ):
        where = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a whole number {where}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Runtime:
    """Where and in what sizes a run computes: none of it decides what a sample is, so none of
    it is in the fingerprint and a rerun may change it. Like the device, the dtype changes the
    floats a model computes, not what is removed or written (each sample's json records the
    dtype its models ran in). Each model step's share (:meth:`part`) is the ``device``,
    ``dtype`` and ``batch_size`` its backend's
    :class:`~counterfactual.models.runtime.ModelRuntime` takes; device and dtype are checked by
    the same functions."""

    device: str = declare(
        "cpu",
        help="torch device of every model step: detector, inpainter, captioner, verifier "
        "(e.g. cuda, cuda:1; default: %(default)s)",
    )
    """torch device of every model step: detector, inpainter, captioner, verifier."""
    dtype: str = declare(
        "float32",
        help="weights dtype of the detector, inpainter and captioner (the verifier stays "
        "float32; default: %(default)s)",
        choices=DTYPES,
    )
    """Weights dtype of the detector, inpainter and captioner (the verifier stays float32)."""
    batch_size: int = declare(
        16,
        help="items per batch of the CPU steps (decode, select, fills, encode) (default: "
        "%(default)s)",
        kind="positive_int",
    )
    """Items per batch of the CPU steps (decode, select, fills, encode)."""
    inpaint_batch_size: int = declare(
        1,
        help="diffusers, lama: crops per inpainter call (default: %(default)s)",
        kind="positive_int",
    )
    text_batch_size: int = 256
    """Captions per captioner call (and per spaCy batch of np-removal)."""
    detect_batch_size: int = declare(
        8, help="images per detector call (default: %(default)s)", kind="positive_int"
    )
    verify_batch_size: int = declare(
        32,
        help="samples per verify call, and crops per model forward pass (default: %(default)s)",
        kind="positive_int",
    )
    verify_shards: bool = declare(
        False,
        help="on resume, check every committed shard's SHA-256 against its stats file (its "
        "size is always checked; a damaged shard is made again): reads the whole output, "
        "about 0.8 s per GB besides the read",
        kind="flag",
    )
    """On resume, hash every committed shard against its stats file (its size is always
    compared): a whole read of the output, about 0.8 s per GB of CPU besides the read."""
    hash_inputs: bool = declare(
        False,
        help="fingerprint the input files by their contents (SHA-256, read once by the driver) "
        "instead of their modification time or ETag; their sizes are always compared",
        kind="flag",
    )
    """Fingerprint input files by their SHA-256 instead of their modification time or ETag
    (sizes always): the driver reads all of the input once; a copied dataset resumes."""

    def __post_init__(self) -> None:
        check_device(self.device)
        check_dtype(self.dtype)
        for name in (
            "batch_size",
            "inpaint_batch_size",
            "text_batch_size",
            "detect_batch_size",
            "verify_batch_size",
        ):
            _whole(name, getattr(self, name), 1)
        for name in ("verify_shards", "hash_inputs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def part(self, name: str) -> dict[str, Any]:
        """The keyword arguments (``device``, ``dtype``, ``batch_size``) that the backend of
        the :class:`SynthConfig`'s part ``name`` runs with (:data:`RUNTIME_FIELDS`)."""
        return {arg: getattr(self, mine) for arg, mine in RUNTIME_FIELDS[name].items()}


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """The options that decide a run's output (its runtime is :class:`Runtime`)."""

    selection: SelectionConfig = field(default_factory=SelectionConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    text: TextConfig = field(default_factory=TextConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    """Per-sample check of each counterfactual (:mod:`counterfactual.method.verify`); off by default."""
    detect: DetectConfig | None = None
    """Boxes from an open-vocabulary detector instead of the dataset (corpora without boxes):
    each item is then one image and caption, planned by the workers after detection."""
    vocabulary: str | None = declare(None, help="class word-list file (default: COCO)")
    """Class word-list file (one class per line, first entry the class name; ``None``: COCO),
    read by every step that names classes: np-removal, detection, caption-aware selection,
    verification, best-of-n. Runs record it under ``text`` (:meth:`to_dict`)."""
    captions: str = declare(
        "one",
        help="one: one caption per image, drawn with --seed; all: an item per caption "
        "(default: %(default)s)",
        choices=CAPTION_CHOICES,
        flags=("--captions-per-image",),
    )
    """``one``: one caption per image, drawn with the seed (as the paper); ``all``: each."""
    seed: int = declare(
        0, help="seed of every random choice, >= 0 (default: %(default)s)", kind="nonnegative_int"
    )
    images_per_shard: int = declare(
        1000,
        help="input images per shard (a corpus: rows; a WebDataset tar is one shard): a shard "
        "holds the samples its images yield, fewer when some yield none (default: "
        "%(default)s)",
        kind="positive_int",
        flags=("--images-per-shard", "--samples-per-shard"),
    )
    max_pixels: int = declare(
        DEFAULT_MAX_PIXELS,
        help="a picture with more pixels fails as image-too-large, not decoded (default: "
        "%(default)s)",
        kind="positive_int",
    )
    max_boxes: int = declare(
        DEFAULT_MAX_BOXES,
        help="an image with more boxes fails as too-many-boxes, not planned (default: %(default)s)",
        kind="positive_int",
    )
    """The most objects one image may have to be planned (:data:`DEFAULT_MAX_BOXES`); more
    fail as ``too-many-boxes`` before selection. Recorded only when not the default."""
    jpeg_quality: int = 95
    pairs: bool = declare(
        False,
        help="each sample also holds its original picture (orig.jpg) and the mask (mask.png, "
        "255 = removed), and its json how the mask was made: original and counterfactual "
        "side by side, for D ∪ D' without the source dataset (counterfactual mix "
        "--unpair), hard negatives or editing datasets",
        kind="flag",
    )
    """Each sample also holds its original picture (``orig.jpg``, the decoded picture the edit
    was made on, same size and JPEG quality as ``jpg``) and the mask (``mask.png``, 8-bit, 255 =
    removed), and its json records how the mask was made (``mask``: source, dilation, the
    boxes' origin and frame). Off, shards are as they always were (and the fingerprint does not
    name it)."""
    exif_frame: str = declare(
        "auto",
        help="the frame of the boxes on an EXIF-rotated picture whose annotated size cannot "
        "tell it (orientations 2-4, square pictures): stored (the pixels as the file holds "
        "them) or oriented (turned upright); auto: the frame of the dataset's pictures whose "
        "size tells it, else stored. Given, a picture whose size says the other frame fails "
        "exif-frame-mismatch (default: %(default)s)",
        choices=EXIF_FRAMES,
    )
    """The frame of a dataset's boxes on EXIF-tagged pictures whose annotated size cannot tell
    it (:mod:`counterfactual.shards.frames`); ``auto``: inferred by the driver over the
    dataset's headers (:func:`~counterfactual.shards.frames.scan_rule`). ``auto`` is left out of
    :meth:`to_dict`, so runs before the option keep their fingerprint."""

    def __post_init__(self) -> None:
        if not isinstance(self.pairs, bool):
            raise ValueError(f"pairs must be True or False, got {self.pairs!r}")
        if self.exif_frame not in EXIF_FRAMES:
            raise ValueError(f"exif_frame {self.exif_frame!r} is not one of {EXIF_FRAMES}")
        if self.captions not in CAPTION_CHOICES:
            raise ValueError(f"captions {self.captions!r} is not one of {CAPTION_CHOICES}")
        _whole("seed", self.seed, 0)
        _whole("images_per_shard", self.images_per_shard, 1)
        _whole("max_pixels", self.max_pixels, 1)
        _whole("max_boxes", self.max_boxes, 1)
        _whole("jpeg_quality", self.jpeg_quality, 1, 100)
        if self.vocabulary is not None and not isinstance(self.vocabulary, str):
            raise ValueError(f"vocabulary must be a file path, got {self.vocabulary!r}")
        if self.detect is not None and self.selection.policy != "uniform":
            raise ValueError(
                f"policy {self.selection.policy!r} needs the boxes of every image before any is "
                "edited (spurious) or makes several samples of one detected image (all); with "
                "detected boxes the policy is uniform"
            )
        if self.detect is not None and self.mask.source == "segmentation":
            raise ValueError("detected objects have no segmentation; use mask source 'box'")

    def to_dict(self) -> dict[str, Any]:
        """The options in the layout the fingerprint is computed from (stable, so an existing
        OUT resumes): the image options flat
        (:meth:`ImageConfig.flat`), the vocabulary under ``text`` (after ``spacy_model``), the
        seed under ``selection`` too (it draws the targets); ``pairs`` only when on, ``exif_frame``
        only when given."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "vocabulary" or (f.name == "pairs" and not value):
                continue
            if (f.name == "max_boxes" and value == DEFAULT_MAX_BOXES) or (
                f.name == "exif_frame" and value == "auto"
            ):
                continue
            if isinstance(value, ImageConfig):
                value = value.flat()
            elif isinstance(value, TextConfig):
                value = value.to_dict()
            elif is_dataclass(value):
                value = asdict(value)
            if f.name == "text":
                value = _insert(value, {"vocabulary": self.vocabulary}, "spacy_model")
            if f.name == "selection":
                value["seed"] = self.seed
            out[f.name] = value
        return out

    def record(self, runtime: Runtime | None = None) -> dict[str, Any]:
        """The run's config as ``manifest.json`` and the dataset card hold it: :meth:`to_dict`
        with ``runtime``'s values in each part (:data:`RUNTIME_FIELDS`, placed as
        :data:`RECORDED_AFTER` says) and its CPU batch size as ``batch_size``."""
        runtime = runtime or Runtime()
        out = self.to_dict()
        for name in RUNTIME_FIELDS:
            if out[name] is None:
                continue
            after = RECORDED_AFTER.get(name, {})
            anchor = None
            for key, value in runtime.part(name).items():
                anchor = after.get(key, anchor)
                out[name] = _insert(out[name], {key: value}, anchor)
                anchor = key
        out["batch_size"] = runtime.batch_size
        return out

    def fingerprint(self) -> dict[str, Any]:
        """The options that decide a run's output and differ from their defaults
        (:func:`fingerprint_of`): an option added with a default leaves it as it was."""
        return fingerprint_of(self.to_dict())


def _insert(mapping: dict[str, Any], new: dict[str, Any], after: str | None) -> dict[str, Any]:
    """``mapping`` with ``new``'s items right after key ``after`` (``None``: at the end)."""
    if after is None:
        return {**mapping, **new}
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        out[key] = value
        if key == after:
            out.update(new)
    return out


RETIRED_DEFAULTS: dict[tuple[str, str], tuple[str, ...]] = {
    ("image", "model"): ("stabilityai/stable-diffusion-2-inpainting",),
}
"""Former defaults that still read as the default in a recorded config: the same model under
a new id (Stability deleted its SD 2 inpainting repo in November 2025; the default is now its
community mirror), so runs recorded before keep their fingerprint."""


BUNDLED = "bundled:"
"""How a fingerprint names a file shipped inside the package (``counterfactual/data``):
``bundled:NAME@sha256:HEX``, its name and content, not where this install put it."""


def bundled_form(value: Any) -> Any:
    """``value`` as a fingerprint holds it: a path to a file shipped in ``counterfactual/data``
    (this install's, or any other's as an older ``run.json`` recorded it: a path ending in
    ``counterfactual/data/NAME`` of a file this package ships) becomes
    ``bundled:NAME@sha256:HEX``, so the same command from another venv or checkout has the
    same fingerprint. The hash is of the file at the recorded path when it still exists, else
    of this install's copy. Anything else is returned as it is."""
    if not isinstance(value, str) or value.startswith(BUNDLED) or "data" not in value:
        return value
    path = PurePath(value)
    if len(path.parts) < 3 or path.parts[-3:-1] != ("counterfactual", "data"):
        return value
    shipped = _data_dir() / path.name
    if not shipped.is_file():
        return value
    here = Path(value)
    source = here if here.is_absolute() and here.is_file() else shipped
    return f"{BUNDLED}{path.name}@sha256:{fs.file_sha256(source)}"


@cache
def _data_dir() -> Path:
    return Path(str(resources.files("counterfactual") / "data"))


def fingerprint_of(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint of a config as a run recorded it (:meth:`SynthConfig.to_dict`,
    :meth:`~SynthConfig.record`, or the ``run.json`` of any run since format 2, whose
    fingerprint kept more): the runtime fields and every option at its default left out, the
    verification options while verification is off and the detector's while there is none;
    a file shipped with the package named by :func:`bundled_form`, not by its path.
    Two configs make the same output when their fingerprints are equal."""
    recorded = json.loads(json.dumps(recorded))
    defaults = _defaults()
    out: dict[str, Any] = {}
    for key, value in recorded.items():
        if key == "batch_size":  # the runtime's CPU batch size, recorded at the top
            continue
        if key == "verify" and isinstance(value, dict) and value.get("mode", "off") == "off":
            continue
        if key == "detect" and value is None:
            continue
        if isinstance(value, dict):
            base, skip = defaults.get(key) or {}, RUNTIME_FIELDS.get(key, {})
            out[key] = {
                k: bundled_form(v)
                for k, v in value.items()
                if k not in skip
                and (k not in base or v != base[k])
                and v not in RETIRED_DEFAULTS.get((key, k), ())
            }
            if key == "text" and value.get("method", "np-removal") == "np-removal":
                # Repair's default changed (off, then on), so np-removal's fingerprint always
                # names it; a record without it was made while it was off: the paper's captions.
                out[key]["repair"] = bool(value.get("repair", False))
        elif key not in defaults or value != defaults[key]:
            out[key] = bundled_form(value)
    return out


def fingerprint_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """The options two fingerprints (:func:`fingerprint_of`) disagree on, one line each:
    ``part.option: OLD -> NEW`` (an option a fingerprint leaves out is at its default, shown
    as ``default VALUE``; a part left out entirely, as ``off``/``none``)."""
    defaults = _defaults()
    lines = []
    for key in sorted(set(old) | set(new), key=_option_order):
        a, b = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if a == b:
            continue
        if isinstance(a, dict) or isinstance(b, dict):
            a = a if isinstance(a, dict) else {}
            b = b if isinstance(b, dict) else {}
            base = defaults.get(key) if isinstance(defaults.get(key), dict) else {}
            if not a or not b:
                off = "off" if key == "verify" else "none"
                if not a and key not in old:
                    lines.append(f"{key}: {off} -> {json.dumps(b, ensure_ascii=False)}")
                    continue
                if not b and key not in new:
                    lines.append(f"{key}: {json.dumps(a, ensure_ascii=False)} -> {off}")
                    continue
            for sub in sorted(set(a) | set(b)):
                x, y = a.get(sub, _ABSENT), b.get(sub, _ABSENT)
                if x != y:
                    lines.append(
                        f"{key}.{sub}: {_shown(x, base.get(sub, _ABSENT))} -> "
                        f"{_shown(y, base.get(sub, _ABSENT))}"
                    )
        else:
            lines.append(
                f"{key}: {_shown(a, defaults.get(key, _ABSENT))} -> "
                f"{_shown(b, defaults.get(key, _ABSENT))}"
            )
    if any(line.startswith("seed:") for line in lines):  # the seed is recorded twice
        lines = [line for line in lines if not line.startswith("selection.seed:")]
    return lines


_ABSENT = object()


def _option_order(key: str) -> tuple[int, str]:
    order = [f.name for f in fields(SynthConfig)]
    return (order.index(key) if key in order else len(order), key)


def _shown(value: Any, default: Any) -> str:
    if value is _ABSENT:
        return "unset" if default is _ABSENT else f"default {json.dumps(default)}"
    return json.dumps(value, ensure_ascii=False)


@cache
def _defaults() -> dict[str, Any]:
    """:meth:`SynthConfig.to_dict` of the defaults, a default detector's options included, and
    the options it leaves out at their default (``pairs``, ``max_boxes``)."""
    out = json.loads(json.dumps(SynthConfig().to_dict()))
    out["detect"] = json.loads(json.dumps(asdict(DetectConfig())))
    out["pairs"] = False
    out["max_boxes"] = DEFAULT_MAX_BOXES
    return out


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One counterfactual to make: a plan of a record with one of its captions.

    With detected boxes the plan is ``None`` until the workers have detected the objects and
    applied the alpha rules (the ``Detect`` and ``Select`` steps fill ``record`` and ``plan``).
    """

    record: ImageRecord
    plan: RemovalPlan | None
    caption: Caption
    key: str
    seed: int


NO_CAPTION = Caption("none", "")


def plan(
    records: Sequence[ImageRecord],
    config: SynthConfig,
    not_drawn: list[Status] | None = None,
    stats: CooccurrenceStats | None = None,
) -> list[list[WorkItem] | Status]:
    """Per record: its work items, or the status saying why there are none. Valid plans the
    policy did not choose are appended to ``not_drawn`` as ``skipped: not-drawn`` rows.

    With ``config.detect`` nothing is selected here: each record yields one plan-less item per
    caption, keyed by image and caption, which the workers plan once its objects are detected.
    """
    if config.detect is not None:
        return [_unplanned_items(record, config) for record in records]
    refused = [_too_many_boxes(r, config.max_boxes) for r in records]
    chosen = [r for r, no in zip(records, refused, strict=True) if no is None]
    selections = iter(_select(chosen, config, stats))
    out: list[list[WorkItem] | Status] = []
    for record, no in zip(records, refused, strict=True):
        selection = no if no is not None else next(selections)
        if isinstance(selection, Status):
            out.append(selection)
            continue
        if not_drawn is not None:
            not_drawn.extend(
                Status(record.image_id, "skipped", "not-drawn", "", None, target)
                for target in selection.not_drawn
            )
        if not selection.plans:
            out.append(Status(record.image_id, "skipped", selection.reason, ""))
            continue
        captions = _captions(record, config)
        if isinstance(captions, Status):
            out.append(captions)
            continue
        items = []
        for p in selection.plans:
            for cap in captions:
                key = sample_key(record.image_id, p.target, cap.caption_id)
                items.append(WorkItem(record, p, cap, key, item_seed(config.seed, key)))
        out.append(items)
    return out


def _too_many_boxes(record: ImageRecord, max_boxes: int) -> Status | None:
    if len(record.objects) <= max_boxes:
        return None
    detail = f"{len(record.objects):,} boxes, more than --max-boxes {max_boxes:,}"
    return Status(record.image_id, "failed", "too-many-boxes", detail)


def _select(
    records: Sequence[ImageRecord], config: SynthConfig, stats: CooccurrenceStats | None
) -> list[Selection | Status]:
    """Each record's selection; when the records together run out of memory, each alone, and
    one that still does is its own ``out-of-memory`` row."""
    try:
        return list(select_many(records, config.selection, stats, seed=config.seed))
    except MemoryError:
        pass
    out: list[Selection | Status] = []
    for record in records:
        try:
            out.extend(select_many([record], config.selection, stats, seed=config.seed))
        except MemoryError:
            detail = f"selection over {len(record.objects):,} boxes ran out of memory"
            out.append(Status(record.image_id, "failed", "out-of-memory", detail))
    return out


def _captions(record: ImageRecord, config: SynthConfig) -> Sequence[Caption] | Status:
    """The captions a record's plans are paired with, or why it has none to pair."""
    captions: Sequence[Caption] = record.captions
    if not captions:
        needs_caption = config.text.method in CUTTING_METHODS or (
            config.detect is not None and config.detect.queries != "vocabulary"
        )
        if needs_caption:
            return Status(record.image_id, "failed", "no-caption", "")
        return (NO_CAPTION,)
    if config.captions == "one":
        pick = draw_index(config.seed, f"caption:{record.image_id}", len(captions))
        return (captions[pick],)
    return captions


def _unplanned_items(record: ImageRecord, config: SynthConfig) -> list[WorkItem] | Status:
    captions = _captions(record, config)
    if isinstance(captions, Status):
        return captions
    items = []
    for cap in captions:
        key = sample_key(record.image_id, cap.caption_id)
        items.append(WorkItem(record, None, cap, key, item_seed(config.seed, key)))
    return items
