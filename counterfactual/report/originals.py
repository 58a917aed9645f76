"""Finding a sample's original picture for the report and the contact sheet: from the records
synth holds, from inside a corpus's tar or table (the path the sample's json records), or from
the sample's ``file`` under the dataset folders the run recorded (:func:`dataset_roots`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from counterfactual import fs
from counterfactual.imageio import DEFAULT_MAX_PIXELS, SampleError, resolve_inside
from counterfactual.readers.spec import DataSpec
from counterfactual.records import ImageRecord
from counterfactual.shards.frames import DEFAULT_RULE, FrameRule
from counterfactual.shards.pictures import box_scale, load_record_image
from counterfactual.shards.samples import SampleMeta


@dataclass(frozen=True, slots=True)
class Original:
    """A sample's original picture (RGB ``uint8``, ``None`` when not found), its removed boxes
    (``xywh`` in the pixels of ``image``) and, when not found, why."""

    image: np.ndarray | None
    boxes: tuple[tuple[float, float, float, float], ...]
    note: str = ""


class Originals:
    """Finds a sample's original picture: with ``records`` (image id -> record, as synth holds
    them after a run) the sample's record; a corpus sample's from inside its tar or table (the
    absolute path its json records); without ``records``, any other from the sample's ``file``
    under the first of ``roots`` that holds it, with the edited picture's size as the annotated
    size (the boxes are then drawn unscaled)."""

    def __init__(
        self,
        roots: Sequence[Path] = (),
        records: Mapping[str, ImageRecord] | None = None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        self.roots = [Path(r) for r in roots]
        self.records = records
        self.max_pixels = max_pixels

    def load(self, meta: SampleMeta) -> Original:
        boxes = tuple((float(x), float(y), float(w), float(h)) for x, y, w, h in meta.mask_boxes)
        record = self._record(meta)
        if record is None:
            if not self.roots:
                return Original(None, boxes, "original not found: no dataset folder (--root)")
            where = ", ".join(str(r) for r in self.roots)
            return Original(None, boxes, f"original not found: {meta.file} in {where}")
        try:
            # the frame the sample was made in, for a tagged picture whose size cannot tell
            rule = DEFAULT_RULE if meta.exif_frame is None else FrameRule(meta.exif_frame)
            image = load_record_image(record, self.max_pixels, rule)
        except SampleError as err:
            return Original(None, boxes, f"original not loaded: {err.reason} {err.detail}".strip())
        # Boxes are in annotation pixels; scale to the decoded picture if they differ.
        sx, sy = box_scale(record, image)
        return Original(image, tuple((x * sx, y * sy, w * sx, h * sy) for x, y, w, h in boxes))

    def _record(self, meta: SampleMeta) -> ImageRecord | None:
        image_id = meta.image_id
        if self.records is not None and image_id in self.records:
            return self.records[image_id]
        if meta.source is not None:  # inside a tar or Parquet file of a corpus
            return meta.source_record()
        if self.records is not None:
            return None
        file = meta.file
        width, height = meta.width, meta.height
        if not file or width < 1 or height < 1:
            return None
        for root in self.roots:
            try:
                if not resolve_inside(root, file).is_file():
                    continue
            except SampleError:
                return None  # a file name leaving the root is never read
            return ImageRecord(image_id, file, width, height, (), (), root=root)
        return None


def dataset_roots(
    out_dir: Path, manifest: Mapping[str, Any], root: Path | None = None
) -> list[Path]:
    """Folders a sample's ``file`` may be relative to, most likely first, existing ones only:
    ``root`` (and its ``images``/``train2017``/``val2017``/``flickr30k-images``) when given, else
    the data spec the run recorded (``images``, ``root``; a corpus's ``images`` or its tables'
    folders; the demo's, made again in the user's cache when the recorded one is gone;
    ``OUT/demo-data``, where earlier versions made them).

    A run records absolute paths (:meth:`DataSpec.absolute`), found from any working
    directory. A relative path (in an older manifest) is looked for under the working
    directory, then under each folder that holds ``out_dir``, nearest first: the run was made
    from one of them when its ``--out`` was relative too."""
    subdirs = ("images", "train2017", "val2017", "flickr30k-images")
    candidates: list[Path] = []
    if root is not None:
        candidates += [Path(root), *(Path(root) / s for s in subdirs)]
    else:
        data = manifest.get("data")
        spec = DataSpec.from_dict(data) if isinstance(data, dict) else None
        if spec is not None:
            bases = [Path.cwd(), *Path(out_dir).absolute().parents]
            for anchored in dict.fromkeys(spec.absolute(base) for base in bases):
                candidates += _spec_folders(anchored)
            if spec.kind == "demo" and not any(c.is_dir() for c in candidates):
                candidates.append(_demo_images())
        candidates.append(Path(out_dir) / "demo-data" / "images")  # earlier versions' place
    return list(dict.fromkeys(c for c in candidates if c.is_dir()))


def _demo_images() -> Path:
    """The demo's pictures, made again in the user's cache when its recorded folder is gone
    (they are the same pictures: :func:`~counterfactual.readers.demo.prepare_demo`)."""
    from counterfactual.readers.demo import demo_cache_dir, prepare_demo

    return prepare_demo(demo_cache_dir()).images


def _spec_folders(spec: DataSpec) -> list[Path]:
    """The local folders ``spec`` names that sample file names may be relative to."""
    out: list[Path] = []
    if spec.images and not fs.is_url(spec.images):
        out.append(Path(spec.images))
    if not spec.root or fs.is_url(spec.root):
        return out
    if not spec.corpus:
        base = Path(spec.root)
        return [*out, base / spec.coco_set, base / "images", base / "flickr30k-images"]
    if spec.kind != "wds" and not spec.images:  # a table's path cells: relative to its folder
        from counterfactual.readers.corpus import expand_pattern

        try:
            tables = expand_pattern(spec.root, spec.kind)
        except ValueError:  # no table left where the run found them
            return out
        out += [Path(t).parent for t in tables if not isinstance(t, str)]
    return out
