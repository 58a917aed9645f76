"""COCO: ``instances_*.json`` (boxes ``[x, y, w, h]`` in pixels) and ``captions_*.json``,
optionally restricted to one split of Karpathy's ``dataset_coco.json``.

Every file and the images folder may be a local path or a URL (``s3://bucket/coco/...``, see
:mod:`counterfactual.fs`); records keep the images folder as their ``root``.

Hostile files: a bad entry costs its image, never the run.

- A file whose overall shape is wrong (not JSON, top level not an object, ``images``,
  ``annotations`` or ``categories`` not a list; an instances file without ``images``, a
  captions file without ``annotations``) raises ``ValueError`` naming the file.
- An image whose entry, annotation or caption entry is malformed becomes a ``failed``
  :class:`~counterfactual.records.Status` in ``Dataset.failures``: ``bad-annotation``, whose
  detail names the file, the entry (``annotation 17``, ``annotations[16]`` when it has no id,
  ``caption 5``, ``category 3``), the field and its value (at most three problems, then a
  count); ``unsafe-path`` for a ``file_name`` that would leave the images folder. An image entry
  that is not an object or has no usable ``id`` (an integer or a non-empty string) gets a row
  under the name ``images[N]``.
- A repeated image id: the first entry is read, each later one is a ``duplicate-id`` row.
  Annotations and captions name images by id, so all those of a repeated id go to the first.
  A repeated annotation id (``pycocotools`` keeps only the last under it): the first is read,
  and the image of each later one is a ``duplicate-id`` row naming the id and both entries.
- A category entry with a usable id but a bad or contradictory name fails the images whose
  annotations use it (detail ``category 3: ...``); annotations naming a category id that no
  entry defines fail theirs (``category_id 'person' is not among the categories``).
- Entries that belong to no image (not an object, no usable ``image_id``, an ``image_id`` that
  ``images`` does not list) and category entries without a usable id cannot fail an image; they
  are left out with one :class:`AnnotationWarning` per file and kind, giving their number and
  the first one.

Segmentations are kept as ``pycocotools.mask`` reads them: polygons (those of fewer than three
points dropped) or an RLE (uncompressed ``counts`` ints, as crowd annotations have, or a
compressed string). An RLE whose runs do not cover exactly its ``size``, or whose size is not the
image's, is ``bad-annotation`` (``pycocotools`` would decode it into uninitialised memory).

Captions are cleaned (:func:`counterfactual.readers.clean.clean_text`); one that is empty after
cleaning is left out, so an image without any caption fails ``no-caption`` where one is needed.
A caption id repeated within an image is ``bad-annotation`` (its samples would share a key).
"""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from typing import Any

from counterfactual import fs
from counterfactual.fs import safe_relative_path
from counterfactual.readers.clean import clean_text
from counterfactual.records import RLE, Caption, Dataset, ImageRecord, ObjectAnnotation, Status

KARPATHY_SPLITS = ("train", "val", "test")
SHOWN_PROBLEMS = 3
"""Problems named in one image's ``bad-annotation`` detail; the rest are counted."""


class AnnotationWarning(UserWarning):
    """Entries of an annotation file that belong to no image and were left out."""


def _load_json(path: fs.PathLike) -> Any:
    try:
        with fs.open_file(path, "rb") as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err
    except RecursionError as err:
        raise ValueError(f"{path}: not valid JSON (nested too deeply)") from err


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), "a value")


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _load_file(path: fs.PathLike, required: str, optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """The file's top-level object with ``required`` and each present ``optional`` key a list
    (absent optional keys read as ``[]``), else ``ValueError`` naming the file."""
    data = _load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level is {_kind(data)}, not an object")
    if required not in data:
        raise ValueError(f"{path}: has no {required!r} list")
    out = dict(data)
    for key in (required, *optional):
        value = data.get(key, [])
        if not isinstance(value, list):
            raise ValueError(f"{path}: {key!r} is {_kind(value)}, not a list")
        out[key] = value
    return out


def _ident(value: Any) -> str | None:
    """An id as the records name it: an integer or a non-empty string, else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    return None


def _entry(kind: str, entry: dict[str, Any], index: int) -> str:
    """``annotation 17``, or ``annotations[16]`` when the entry has no usable id."""
    ident = _ident(entry.get("id"))
    return f"{kind} {ident}" if ident is not None else f"{kind}s[{index}]"


_NUMBER_TYPES = frozenset((int, float))


def _numbers(value: Any) -> tuple[float, ...] | None:
    """A list of finite JSON numbers (no strings, no booleans) as floats, else ``None``.
    Checked a list at a time (a polygon has dozens of values, a file millions)."""
    if not isinstance(value, list | tuple) or not _NUMBER_TYPES.issuperset(map(type, value)):
        return None
    try:
        out = tuple(map(float, value))
    except OverflowError:  # an int beyond float's range
        return None
    return out if all(map(math.isfinite, out)) else None


def _warn(file: str, kind: str, skipped: list[tuple[int, str]], fate: str) -> None:
    if skipped:
        index, why = skipped[0]
        warnings.warn(
            f"{file}: {len(skipped)} of the {kind!r} entries {fate}; the first, {kind}[{index}], {why}",
            AnnotationWarning,
            stacklevel=3,
        )


def karpathy_ids(split_file: fs.PathLike, split: str) -> set[str]:
    """COCO image ids of one Karpathy split; ``restval`` counts as ``train`` (113,287 images).
    Entries without an id are left out with an :class:`AnnotationWarning`."""
    if split not in KARPATHY_SPLITS:
        raise ValueError(f"split {split!r} is not one of {KARPATHY_SPLITS}")
    data = _load_file(split_file, "images")
    ids = set()
    skipped = []
    for i, image in enumerate(data["images"]):
        if not isinstance(image, dict):
            skipped.append((i, f"is {_kind(image)}, not an object"))
            continue
        ident = _ident(image.get("cocoid", image.get("imgid")))
        if ident is None:
            skipped.append((i, f"has cocoid {_show(image.get('cocoid'))}"))
            continue
        s = "train" if image.get("split") == "restval" else image.get("split")
        if s == split:
            ids.add(ident)
    _warn(fs.name(split_file), "images", skipped, "have no usable id and belong to no split")
    return ids


def category_names(
    entries: list[Any],
) -> tuple[dict[str, str], dict[str, str], list[tuple[int, str]]]:
    """``(names, bad, skipped)``: class name by category id, what is wrong with each bad id,
    and the entries without a usable id."""
    names: dict[str, str] = {}
    bad: dict[str, str] = {}
    skipped = []
    for i, cat in enumerate(entries):
        if not isinstance(cat, dict):
            skipped.append((i, f"is {_kind(cat)}, not an object"))
            continue
        ident = _ident(cat.get("id"))
        if ident is None:
            skipped.append((i, f"has id {_show(cat.get('id'))}"))
            continue
        name = cat.get("name")
        if not isinstance(name, str) or not name.strip():
            bad[ident] = f"name {_show(name)} is not a class name"
        elif names.get(ident, name) != name:
            bad[ident] = f"named both {names[ident]!r} and {name!r}"
        elif ident not in bad:
            names[ident] = name
    for ident in bad:
        names.pop(ident, None)
    return names, bad, skipped


def _segmentation(seg: Any) -> tuple[tuple[float, ...], ...] | RLE | None | str:
    """COCO polygons (those of fewer than three points dropped), an :class:`RLE` (uncompressed
    ``counts`` ints or a compressed string, with ``size`` ``[height, width]``), ``None`` for
    none, or a string saying what is wrong."""
    if seg is None:
        return None
    if isinstance(seg, dict):
        return segmentation_rle(seg)
    if not isinstance(seg, list):
        return f"segmentation {_show(seg)} is neither polygons nor RLE"
    polygons = []
    for k, polygon in enumerate(seg):
        values = _numbers(polygon)
        if values is None:
            return f"segmentation[{k}] {_show(polygon)} is not a list of finite numbers"
        if len(values) % 2:
            return f"segmentation[{k}] has an odd number of values ({len(values)})"
        if len(values) >= 6:
            polygons.append(values)
    return tuple(polygons) or None


def segmentation_rle(seg: dict[str, Any]) -> RLE | str:
    size, counts = seg.get("size"), seg.get("counts")
    if not (
        isinstance(size, list) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)
    ):
        return f"segmentation size {_show(size)} is not [height, width] of positive integers"
    height, width = size
    if isinstance(counts, str):
        runs = _compressed_runs(counts)
        if runs is None:
            return f"segmentation counts {_show(counts)} is not a compressed RLE string"
        kept: tuple[int, ...] | str = counts
    elif isinstance(counts, list) and all(type(v) is int and v >= 0 for v in counts):
        runs = kept = tuple(counts)
    else:
        return f"segmentation counts {_show(counts)} are neither ints >= 0 nor an RLE string"
    if sum(runs) != height * width:
        return (
            f"segmentation counts cover {sum(runs)} pixels, not {height} x {width} = "
            f"{height * width}"
        )
    return RLE(height, width, kept)


def _compressed_runs(counts: str) -> list[int] | None:
    """The runs of COCO's compressed RLE string, decoded as ``pycocotools`` does (5 bits per
    character from ``'0'``, sign-extended, deltas from the fourth run on), or ``None`` when it
    is not one (a character out of range, a truncated value, a negative run)."""
    runs: list[int] = []
    value = shift = 0
    for char in counts:
        c = ord(char) - 48
        if not 0 <= c < 64:
            return None
        value |= (c & 0x1F) << shift
        shift += 5
        if c & 0x20:
            continue
        if c & 0x10:
            value |= -1 << shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            return None
        runs.append(value)
        value = shift = 0
    return runs if shift == 0 else None


def _reach(box: list[float]) -> bool:
    """Whether the box's far corner (``x + w``, ``y + h``) is a finite number."""
    return math.isfinite(box[0] + box[2]) and math.isfinite(box[1] + box[3])


def _parse_object(
    ann: dict[str, Any], names: dict[str, str], bad: dict[str, str]
) -> ObjectAnnotation | str:
    """The object, or a string saying what is wrong with it (field and value)."""
    raw, bbox, crowd = ann.get("category_id"), ann.get("bbox"), ann.get("iscrowd", 0)
    if type(raw) is int and type(crowd) is int and (crowd == 0 or crowd == 1):
        # the usual entry in a few steps; anything unusual takes the checks below
        name = names.get(str(raw))  # a bad category is not in names
        box = _numbers(bbox) if type(bbox) is list and len(bbox) == 4 else None
        if name is not None and box is not None and box[2] >= 0 and box[3] >= 0 and _reach(box):
            seg = ann.get("segmentation")
            segmentation = None if seg is None else _segmentation(seg)
            if not isinstance(segmentation, str):
                return ObjectAnnotation(box, name, crowd == 1, segmentation)  # type: ignore[arg-type]
    category = _ident(raw)
    if category is not None and category in bad:
        return f"category {category}: {bad[category]}"
    if category is None or category not in names:
        return f"category_id {_show(raw)} is not among the categories"
    bbox = ann.get("bbox")
    box = _numbers(bbox)
    if box is None or len(box) != 4:
        return f"bbox {_show(bbox)} is not [x, y, w, h] of finite numbers"
    if box[2] < 0 or box[3] < 0:
        return f"bbox {_show(bbox)} has a negative size"
    if not _reach(box):
        return f"bbox {_show(bbox)} reaches past the largest float (x + w or y + h)"
    crowd = ann.get("iscrowd", 0)
    if crowd is not None and not (isinstance(crowd, int | float) and crowd in (0, 1)):
        return f"iscrowd {_show(crowd)} is not 0 or 1"
    segmentation = _segmentation(ann.get("segmentation"))
    if isinstance(segmentation, str):
        return segmentation
    return ObjectAnnotation(
        bbox=box,  # type: ignore[arg-type]
        category=names[category],
        iscrowd=bool(crowd),
        segmentation=segmentation,
    )


def _size_problem(image: dict[str, Any]) -> str | None:
    for name in ("width", "height"):
        value = image.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"{name} {_show(value)} is not a positive integer"
    return None


def _rle_size_problems(
    entries: list[tuple[str, ObjectAnnotation]], image: dict[str, Any]
) -> list[str]:
    """An RLE mask must be of its image's size, as ``pycocotools`` decodes it at its own."""
    out = []
    for entry, obj in entries:
        rle = obj.segmentation
        assert isinstance(rle, RLE)
        if (rle.height, rle.width) != (image["height"], image["width"]):
            out.append(
                f"{entry}: segmentation size [{rle.height}, {rle.width}] is not the image's "
                f"[{image['height']}, {image['width']}]"
            )
    return out


def _joined(problems: list[str]) -> str:
    shown = "; ".join(problems[:SHOWN_PROBLEMS])
    more = len(problems) - SHOWN_PROBLEMS
    return f"{shown} (and {more} more)" if more > 0 else shown


def read_coco(
    instances: fs.PathLike,
    captions: fs.PathLike | None,
    images: fs.PathLike,
    split_file: fs.PathLike | None = None,
    split: str | None = None,
    dataset: str = "coco",
    original_ids: dict[str, int | str] | None = None,
) -> Dataset:
    """Read COCO-format annotations. ``images`` is the folder the ``file_name`` entries are
    relative to. With ``split_file`` and ``split``, only that Karpathy split is kept. Each may be
    a local path or a URL. Malformed entries fail their image (see the module docstring).

    Records name images by string (``"139"``); ``original_ids``, when given, is filled with
    each image's id as the file has it (COCO's ``139``), for output that joins with
    ``pycocotools.COCO``."""
    inst = _load_file(instances, "images", ("annotations", "categories"))
    caps = _load_file(captions, "annotations") if captions is not None else {"annotations": []}
    wanted = karpathy_ids(split_file, split) if split_file and split else None
    root = fs.as_path(images)
    inst_name = fs.name(instances)
    names, bad_categories, skipped = category_names(inst["categories"])
    _warn(inst_name, "categories", skipped, "have no usable id, so no annotation can use them")
    listed = {_ident(im.get("id")) for im in inst["images"] if isinstance(im, dict)}
    objects: dict[str, list[ObjectAnnotation]] = defaultdict(list)
    problems: dict[str, list[str]] = defaultdict(list)
    rles: dict[str, list[tuple[str, ObjectAnnotation]]] = defaultdict(list)
    skipped = []
    first_ann: dict[str, int] = {}
    repeated: dict[str, str] = {}  # image id -> its first annotation whose id came before
    for i, ann in enumerate(inst["annotations"]):
        image_id = _owner(ann, i, listed, skipped)
        if image_id is None:
            continue
        ann_id = _ident(ann.get("id"))
        if ann_id is not None and ann_id in first_ann:
            detail = f"{inst_name} annotations[{i}]: id {ann_id} is already annotations"
            repeated.setdefault(image_id, f"{detail}[{first_ann[ann_id]}]")
            continue
        if ann_id is not None:
            first_ann[ann_id] = i
        parsed = _parse_object(ann, names, bad_categories)
        if isinstance(parsed, str):
            problems[image_id].append(f"{inst_name} {_entry('annotation', ann, i)}: {parsed}")
        else:
            objects[image_id].append(parsed)
            if isinstance(parsed.segmentation, RLE):  # its size is checked with the image's
                rles[image_id].append((f"{inst_name} {_entry('annotation', ann, i)}", parsed))
    _warn(inst_name, "annotations", skipped, "belong to no image and were left out")
    texts, skipped = _read_captions(caps["annotations"], captions, listed, problems)
    if captions is not None:
        _warn(fs.name(captions), "annotations", skipped, "belong to no image and were left out")
    records = []
    failures = []
    first: dict[str, int] = {}
    for i, image in enumerate(inst["images"]):
        if not isinstance(image, dict):
            detail = f"{inst_name} images[{i}] is {_kind(image)}, not an object"
            failures.append(Status(f"images[{i}]", "failed", "bad-annotation", detail))
            continue
        image_id = _ident(image.get("id"))
        if image_id is None:
            detail = f"{inst_name} images[{i}]: id {_show(image.get('id'))} is no integer or string"
            failures.append(Status(f"images[{i}]", "failed", "bad-annotation", detail))
            continue
        if wanted is not None and image_id not in wanted:
            continue
        if image_id in first:
            detail = f"{inst_name} images[{i}]: id {image_id} is already images[{first[image_id]}]"
            failures.append(Status(image_id, "failed", "duplicate-id", detail))
            continue
        first[image_id] = i
        if original_ids is not None:
            original_ids[image_id] = image["id"]
        file = safe_relative_path(image.get("file_name", ""))
        size = _size_problem(image)
        if size is None and image_id in rles:
            problems[image_id] += _rle_size_problems(rles[image_id], image)
        if file is None:
            failures.append(Status(image_id, "failed", "unsafe-path", repr(image.get("file_name"))))
        elif size is not None:
            detail = f"{inst_name} image {image_id}: {size}"
            failures.append(Status(image_id, "failed", "bad-annotation", detail))
        elif image_id in repeated:
            failures.append(Status(image_id, "failed", "duplicate-id", repeated[image_id]))
        elif problems.get(image_id):
            failures.append(
                Status(image_id, "failed", "bad-annotation", _joined(problems[image_id]))
            )
        else:
            records.append(
                ImageRecord(
                    image_id=image_id,
                    file=file,
                    width=image["width"],
                    height=image["height"],
                    objects=tuple(objects.get(image_id, ())),
                    captions=tuple(texts.get(image_id, ())),
                    root=root,
                    split=split,
                    dataset=dataset,
                )
            )
    return Dataset(
        name=dataset,
        records=tuple(records),
        class_names=tuple(names[k] for k in sorted(names, key=str)),
        failures=tuple(failures),
    )


def _owner(
    entry: Any, index: int, listed: set[str | None], skipped: list[tuple[int, str]]
) -> str | None:
    """The id of the image ``entry`` belongs to, or ``None`` (and a note in ``skipped``)."""
    if not isinstance(entry, dict):
        skipped.append((index, f"is {_kind(entry)}, not an object"))
        return None
    image_id = _ident(entry.get("image_id"))
    if image_id is None:
        skipped.append((index, f"has image_id {_show(entry.get('image_id'))}"))
        return None
    if image_id not in listed:
        skipped.append((index, f"names image {image_id}, which 'images' does not list"))
        return None
    return image_id


def _read_captions(
    entries: list[Any],
    path: fs.PathLike | None,
    listed: set[str | None],
    problems: dict[str, list[str]],
) -> tuple[dict[str, list[Caption]], list[tuple[int, str]]]:
    """Cleaned captions by image id, and the entries that belong to no image; malformed
    entries go to ``problems``."""
    if path is None:
        return {}, []
    file = fs.name(path)
    texts: dict[str, list[Caption]] = defaultdict(list)
    seen: dict[str, set[str]] = defaultdict(set)
    skipped: list[tuple[int, str]] = []
    for i, ann in enumerate(entries):
        image_id = _owner(ann, i, listed, skipped)
        if image_id is None:
            continue
        caption_id, text = _ident(ann.get("id")), ann.get("caption")
        if caption_id is None:
            problems[image_id].append(
                f"{file} annotations[{i}]: caption id {_show(ann.get('id'))} is missing or bad"
            )
        elif not isinstance(text, str):
            problems[image_id].append(
                f"{file} caption {caption_id}: caption {_show(text)} is not a string"
            )
        elif caption_id in seen[image_id]:
            problems[image_id].append(f"{file} caption {caption_id}: id repeated in the image")
        else:
            seen[image_id].add(caption_id)
            clean = clean_text(text)
            if clean.text:
                texts[image_id].append(Caption(caption_id, clean.text, None, clean.removed))
    return texts, skipped


__all__ = ["KARPATHY_SPLITS", "AnnotationWarning", "karpathy_ids", "read_coco"]
