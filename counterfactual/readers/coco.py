"""COCO: ``instances_*.json`` (boxes ``[x, y, w, h]`` in pixels) and ``captions_*.json``,
optionally restricted to one split of Karpathy's ``dataset_coco.json``.

Every file and the images folder may be a local path or a URL (``s3://bucket/coco/...``, see
:mod:`counterfactual.fs`); records keep the images folder as their ``root``."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from typing import Any

from counterfactual import fs
from counterfactual.readers import safe_relative_path
from counterfactual.records import Caption, Dataset, ImageRecord, ObjectAnnotation, Status

KARPATHY_SPLITS = ("train", "val", "test")


def _load_json(path: fs.PathLike) -> Any:
    try:
        with fs.open_file(path, "rb") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from err


def karpathy_ids(split_file: fs.PathLike, split: str) -> set[str]:
    """COCO image ids of one Karpathy split; ``restval`` counts as ``train`` (113,287 images)."""
    if split not in KARPATHY_SPLITS:
        raise ValueError(f"split {split!r} is not one of {KARPATHY_SPLITS}")
    data = _load_json(split_file)
    ids = set()
    for image in data.get("images", []):
        s = "train" if image.get("split") == "restval" else image.get("split")
        if s == split:
            ids.add(str(image.get("cocoid", image.get("imgid"))))
    return ids


def _parse_object(ann: dict[str, Any], categories: dict[Any, str]) -> ObjectAnnotation | str:
    """The object, or a string saying what is wrong with it."""
    cat = categories.get(ann.get("category_id"))
    if cat is None:
        return f"unknown category_id {ann.get('category_id')!r}"
    bbox = ann.get("bbox")
    if not isinstance(bbox, list | tuple) or len(bbox) != 4:
        return f"bbox {bbox!r} is not [x, y, w, h]"
    try:
        box = tuple(float(v) for v in bbox)
    except (TypeError, ValueError):
        return f"bbox {bbox!r} is not numeric"
    if not all(math.isfinite(v) for v in box) or box[2] < 0 or box[3] < 0:
        return f"bbox {bbox!r} has a negative or non-finite value"
    seg = ann.get("segmentation")
    polygons = None
    if isinstance(seg, list) and seg and all(isinstance(p, list) for p in seg):
        polygons = tuple(tuple(float(v) for v in p) for p in seg if len(p) >= 6)
    return ObjectAnnotation(
        bbox=box,  # type: ignore[arg-type]
        category=cat,
        iscrowd=bool(ann.get("iscrowd", 0)),
        segmentation=polygons or None,
    )


def read_coco(
    instances: fs.PathLike,
    captions: fs.PathLike | None,
    images: fs.PathLike,
    split_file: fs.PathLike | None = None,
    split: str | None = None,
    dataset: str = "coco",
) -> Dataset:
    """Read COCO-format annotations. ``images`` is the folder the ``file_name`` entries are
    relative to. With ``split_file`` and ``split``, only that Karpathy split is kept. Each may be
    a local path or a URL."""
    inst = _load_json(instances)
    caps = _load_json(captions) if captions is not None else {"annotations": []}
    wanted = karpathy_ids(split_file, split) if split_file and split else None
    root = fs.as_path(images)
    categories = {c["id"]: str(c["name"]) for c in inst.get("categories", [])}
    objects: dict[str, list[ObjectAnnotation]] = defaultdict(list)
    problems: dict[str, list[str]] = defaultdict(list)
    for ann in inst.get("annotations", []):
        image_id = str(ann.get("image_id"))
        parsed = _parse_object(ann, categories)
        if isinstance(parsed, str):
            problems[image_id].append(parsed)
        else:
            objects[image_id].append(parsed)
    texts: dict[str, list[Caption]] = defaultdict(list)
    for ann in caps.get("annotations", []):
        text = ann.get("caption")
        if isinstance(text, str) and text.strip():
            texts[str(ann.get("image_id"))].append(Caption(str(ann.get("id")), text.strip()))
    records = []
    failures = []
    for image in inst.get("images", []):
        image_id = str(image.get("id"))
        if wanted is not None and image_id not in wanted:
            continue
        file = safe_relative_path(image.get("file_name", ""))
        width, height = image.get("width"), image.get("height")
        if file is None:
            failures.append(Status(image_id, "failed", "unsafe-path", repr(image.get("file_name"))))
        elif not (isinstance(width, int) and isinstance(height, int) and width > 0 and height > 0):
            failures.append(Status(image_id, "failed", "bad-annotation", f"size {width}x{height}"))
        elif problems.get(image_id):
            failures.append(
                Status(image_id, "failed", "bad-annotation", "; ".join(problems[image_id]))
            )
        else:
            records.append(
                ImageRecord(
                    image_id=image_id,
                    file=file,
                    width=width,
                    height=height,
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
        class_names=tuple(categories[k] for k in sorted(categories, key=str)),
        failures=tuple(failures),
    )
