"""The boxes of a COCO ``instances`` file as a :class:`~counterfactual.boxtable.BoxTable`,
read at the speed ``counterfactual select`` needs on a whole dataset.

The file is decoded against a schema of the fields selection reads (msgspec: no dict per
entry; unknown keys skipped; polygons checked as lists of numbers), and every condition under
which :func:`~counterfactual.readers.coco.read_coco` would fail an image, leave out an entry or
warn is checked on the columns. :func:`read_coco_boxes` returns ``None`` when any of them holds,
or when the file does not decode against the schema at all: the caller then reads it with
``read_coco``, which names every problem. For a file it accepts, the table has the same images
in the same order, with the same objects and classes, as ``read_coco``'s records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from counterfactual import fs
from counterfactual.boxtable import BoxTable
from counterfactual.fs import safe_relative_path
from counterfactual.readers.coco import category_names, segmentation_rle


class _Image(msgspec.Struct, gc=False):
    id: int | str
    width: int
    height: int
    file_name: Any = ""


class _Annotation(msgspec.Struct, gc=False):
    image_id: int | str
    category_id: int
    bbox: tuple[float, float, float, float]
    id: int | str | None = None
    iscrowd: int | None = 0
    segmentation: list[list[float]] | dict[str, Any] | None = None


class _Category(msgspec.Struct, gc=False):
    id: int | str
    name: str


class _Instances(msgspec.Struct, gc=False):
    images: list[_Image]
    annotations: list[_Annotation] = []
    categories: list[_Category] = []


_DECODER = msgspec.json.Decoder(_Instances)
_PATH_MARKS = ("/", "\\", ":", "\x00")


@dataclass(frozen=True, slots=True)
class CocoBoxes:
    """A table and each image's id as the file has it (COCO's integer ``139``)."""

    table: BoxTable
    original_ids: list[int | str]


def read_coco_boxes(instances: fs.PathLike) -> CocoBoxes | None:
    """The boxes of ``instances`` (a local path or a URL), or ``None`` when the file holds
    anything :func:`~counterfactual.readers.coco.read_coco` would report (see the module
    docstring)."""
    with fs.open_file(instances, "rb") as fh:
        data = fh.read()
    try:
        inst = _DECODER.decode(data)
    except msgspec.DecodeError:  # not JSON, or an entry of another shape
        return None
    return _columns(inst)


def _columns(inst: _Instances) -> CocoBoxes | None:
    names, bad, skipped = category_names([{"id": c.id, "name": c.name} for c in inst.categories])
    if bad or skipped:
        return None
    images = inst.images
    ids = [image.id for image in images]
    idents = [str(i) for i in ids]
    if len(set(idents)) != len(ids) or not all(map(str.strip, idents)):
        return None  # a repeated or blank id
    width = np.array([image.width for image in images], dtype=np.float64)
    height = np.array([image.height for image in images], dtype=np.float64)
    if len(images) and (width.min() <= 0 or height.min() <= 0):
        return None
    if not _safe_files([image.file_name for image in images]):
        return None
    anns = inst.annotations
    # an annotation names its image by the id as written, or by the same id as a string
    index = dict(zip(idents, range(len(ids)), strict=True))
    index.update(zip(ids, range(len(ids)), strict=True))  # type: ignore[arg-type]
    classes = list(dict.fromkeys(names.values()))
    code = {}  # annotations name categories by integer id; names has them as read_coco does
    for key, name in names.items():
        if key.lstrip("-").isdigit() and str(int(key)) == key:
            code[int(key)] = classes.index(name)
    try:
        owner = np.fromiter((index[a.image_id] for a in anns), dtype=np.intp, count=len(anns))
        category = np.fromiter((code[a.category_id] for a in anns), dtype=np.intp, count=len(anns))
    except KeyError:  # an image 'images' does not list, a category no entry defines
        return None
    ann_ids = [str(a.id) for a in anns if a.id is not None]
    if len(set(ann_ids)) != len(ann_ids):
        return None  # a repeated annotation id
    corners = chain.from_iterable(map(attrgetter("bbox"), anns))
    bbox = np.fromiter(corners, np.float64, 4 * len(anns)).reshape(-1, 4)
    if not np.isfinite(bbox).all() or (bbox[:, 2:] < 0).any():
        return None
    with np.errstate(over="ignore"):  # a far corner past the largest float: read_coco says so
        if not np.isfinite(bbox[:, :2] + bbox[:, 2:]).all():
            return None
    if not {a.iscrowd for a in anns} <= {0, 1, None}:
        return None
    if not _segmentations_ok(anns, owner, images):
        return None
    if len(owner) and (np.diff(owner) < 0).any():  # an image's objects in their file order
        order = np.argsort(owner, kind="stable")
        owner, category, bbox = owner[order], category[order], bbox[order]
    table = BoxTable(idents, width, height, classes, bbox, owner, category)
    return CocoBoxes(table, ids)


def _safe_files(files: list[Any]) -> bool:
    if not all(type(f) is str and f for f in files):
        return False
    if not any(mark in f or ".." in f for f in files for mark in _PATH_MARKS):
        return True  # plain names: nothing to resolve
    return all(safe_relative_path(f) is not None for f in files)


def _segmentations_ok(anns: list[_Annotation], owner: np.ndarray, images: list[_Image]) -> bool:
    """Polygons of an even number of values, RLEs that ``read_coco`` accepts at their image's
    size."""
    for n, ann in enumerate(anns):
        seg = ann.segmentation
        if seg is None:
            continue
        if isinstance(seg, dict):
            rle = segmentation_rle(seg)
            image = images[owner[n]]
            if isinstance(rle, str) or (rle.height, rle.width) != (image.height, image.width):
                return False
        elif any(len(polygon) % 2 or not math.isfinite(sum(polygon)) for polygon in seg):
            return False  # an odd polygon, or a value JSON wrote too large for a float
    return True


__all__ = ["CocoBoxes", "read_coco_boxes"]
