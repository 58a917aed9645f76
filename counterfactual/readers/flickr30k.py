"""Flickr30k Entities (Plummer et al.): phrase-annotated captions and per-entity boxes.

Layout under ``root``::

    Sentences/<id>.txt       one caption a line, phrases marked up inline as
                             "[/EN#<entity id>/<type>[/<type>...] phrase words]"
    Annotations/<id>.xml     PASCAL-VOC-like: <size><width>/<height>, then <object>s with one or
                             more <name> (entity ids sharing the box) and either a <bndbox> or
                             <nobndbox>/<scene> flags (no box)
    flickr30k-images/<id>.jpg
    train.txt, val.txt, test.txt   image ids, one a line (only needed with ``split``)

Objects: every box of an entity whose type is in ``types`` becomes an
:class:`~counterfactual.records.ObjectAnnotation` whose class is that type (the first of the
entity's types that is in ``types``, in the order the captions give them). Entities of other types (clothing,
bodyparts, scene, other, notvisual, ...) and entities without a box do not become objects; they
still appear as phrases of their captions. A box shared by several entities of the same class is
listed once.

Boxes: the XML stores 1-based, inclusive pixel indices (VOC convention; the official
``flickr30k_entities_utils.py`` subtracts 1 from all four). The pixel columns ``xmin..xmax``
(1-based) cover ``[xmin - 1, xmax)`` in 0-based edge coordinates, so the record's ``xywh`` box is
``(xmin - 1, ymin - 1, xmax - xmin + 1, ymax - ymin + 1)``, clipped to the annotated size (a
stray ``0`` or a ``max`` one past the border only loses the part outside the image).

Captions: ``Caption(f"{id}_{n}", text, phrases)`` with ``n`` counting the non-empty lines from
0 (lines end in ``\n``); ``text`` is the line, cleaned (control and invisible characters out,
whitespace runs as one space: :func:`counterfactual.readers.clean.clean_text`), without markup
(the dataset's tokenisation is kept, e.g. "a dog ." with a space before the full stop), and each
:class:`~counterfactual.records.Phrase` gives character offsets into it (``text[start:end]`` is
the phrase), all its types and its entity id.

``root`` (and ``images``) may be a local folder or a URL (``s3://bucket/flickr30k``, see
:mod:`counterfactual.fs`): the ``Annotations`` and ``Sentences`` folders are listed once and each
image's two files read; records keep the picture folder as their ``root``.

An image whose files are missing or malformed becomes a ``failed``
:class:`~counterfactual.records.Status` in ``Dataset.failures`` (reasons ``missing-annotation``,
``missing-sentences``, ``bad-annotation``, ``unreadable``, ``unsafe-path``); the others are
read. A ``bad-annotation`` detail names the file, and for a sentence the line.
"""

from __future__ import annotations

import math
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from counterfactual import fs
from counterfactual.fs import safe_relative_path
from counterfactual.readers.clean import clean_text
from counterfactual.records import Caption, Dataset, ImageRecord, ObjectAnnotation, Phrase, Status

SPLITS = ("train", "val", "test")
DEFAULT_TYPES = ("people", "animals", "vehicles", "instruments")
ALL_TYPES = (
    "people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other",
    "notvisual",
)  # fmt: skip
_URL_THREADS = 16
"""Annotation and sentence files read at once from a URL root."""
_HEADER = re.compile(r"\[/EN#([^/\s\]]+)((?:/[^/\s\]]+)+)\s")


class FormatError(ValueError):
    """A sentence or annotation file that does not follow the Flickr30k Entities format."""


@dataclass(frozen=True, slots=True)
class EntityBox:
    """One ``<object>`` with a box: the entity ids that share it and the ``xywh`` pixel box."""

    entity_ids: tuple[str, ...]
    xywh: tuple[float, float, float, float]


def parse_sentence(line: str) -> tuple[str, tuple[Phrase, ...]]:
    """One line of a ``Sentences`` file: the text without markup and its phrases, by start.

    ``"[/EN#1/people A man] rides [/EN#2/animals a horse] ."`` gives
    ``"A man rides a horse ."`` with phrases at ``0:5`` and ``12:19``. Everything outside the
    markup is kept as it is. Markup may nest; a ``]`` outside any phrase is kept as text.
    Raises :class:`FormatError` on a malformed header or a phrase left open.
    """
    out: list[str] = []
    stack: list[tuple[int, str, tuple[str, ...]]] = []
    spans: list[tuple[int, int, str, tuple[str, ...]]] = []
    i = 0
    while i < len(line):
        if line.startswith("[/EN#", i):
            header = _HEADER.match(line, i)
            if header is None:
                raise FormatError(f"malformed phrase markup at {line[i : i + 30]!r}")
            stack.append((len(out), header.group(1), tuple(header.group(2)[1:].split("/"))))
            i = header.end()
        elif line[i] == "]" and stack:
            start, entity, types = stack.pop()
            spans.append((start, len(out), entity, types))
            i += 1
        else:
            out.append(line[i])
            i += 1
    if stack:
        raise FormatError(f"the phrase of entity {stack[-1][1]} is never closed")
    text = "".join(out)
    phrases = []
    for start, end, entity, types in sorted(spans, key=lambda s: (s[0], -s[1])):
        inner = text[start:end]
        start += len(inner) - len(inner.lstrip())
        end = start + len(inner.strip())
        phrases.append(Phrase(start, end, text[start:end], types, entity))
    return text, tuple(phrases)


def _number(element: ET.Element, tag: str) -> float:
    child = element.find(tag)
    if child is None or child.text is None:
        raise FormatError(f"<{element.tag}> has no <{tag}>")
    try:
        value = float(child.text.strip())
    except ValueError as err:
        raise FormatError(f"<{tag}> is {child.text!r}, not a number") from err
    if not math.isfinite(value):
        raise FormatError(f"<{tag}> is {child.text!r}")
    return value


def parse_annotation(xml: str | bytes) -> tuple[int, int, tuple[EntityBox, ...]]:
    """``(width, height, boxes)`` of one ``Annotations`` file; boxes as ``xywh`` pixels (see the
    module docstring for the conversion). Raises :class:`FormatError`."""
    try:
        root = ET.fromstring(xml)
    except (ET.ParseError, LookupError, ValueError) as err:  # LookupError: unknown encoding
        raise FormatError(f"not well-formed XML ({err})") from err
    size = root.find("size")
    if size is None:
        raise FormatError("no <size>")
    width, height = _number(size, "width"), _number(size, "height")
    if width <= 0 or height <= 0 or width != int(width) or height != int(height):
        raise FormatError(f"size {width}x{height}")
    w_img, h_img = int(width), int(height)
    boxes = []
    for obj in root.iter("object"):
        names = tuple(n.text.strip() for n in obj.findall("name") if n.text and n.text.strip())
        bndbox = obj.find("bndbox")
        if bndbox is None:
            continue
        if not names:
            raise FormatError("an <object> with a box has no <name>")
        xmin, ymin = _number(bndbox, "xmin"), _number(bndbox, "ymin")
        xmax, ymax = _number(bndbox, "xmax"), _number(bndbox, "ymax")
        x0, y0 = max(xmin - 1, 0.0), max(ymin - 1, 0.0)
        x1, y1 = min(xmax, w_img), min(ymax, h_img)
        if x1 <= x0 or y1 <= y0:
            raise FormatError(
                f"box {xmin:g},{ymin:g},{xmax:g},{ymax:g} of {'/'.join(names)} is empty "
                f"inside {w_img}x{h_img}"
            )
        boxes.append(EntityBox(names, (x0, y0, x1 - x0, y1 - y0)))
    return w_img, h_img, tuple(boxes)


def split_ids(root: fs.PathLike, split: str) -> list[str]:
    """Image ids listed in ``root/<split>.txt``, in file order."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {SPLITS}")
    path = fs.join(root, f"{split}.txt")
    if not fs.isfile(path):
        raise ValueError(f"split file {path} does not exist")
    ids = (line.strip() for line in fs.read_text(path).splitlines())
    return list(dict.fromkeys(i for i in ids if i))


def _read_image(
    image_id: str,
    root: Path | str,
    images: Path | str,
    types: tuple[str, ...],
    split: str | None,
    listed: tuple[set[str], set[str]],
) -> ImageRecord | Status:
    """One image's record or failure; ``listed`` holds the file names in ``Annotations`` and
    ``Sentences``."""
    file = safe_relative_path(f"{image_id}.jpg")
    if file is None or "/" in image_id or "\\" in image_id:
        return Status(image_id, "failed", "unsafe-path", repr(image_id))
    xml_path = fs.join(root, "Annotations", f"{image_id}.xml")
    txt_path = fs.join(root, "Sentences", f"{image_id}.txt")
    if f"{image_id}.xml" not in listed[0]:
        return Status(image_id, "failed", "missing-annotation", str(xml_path))
    if f"{image_id}.txt" not in listed[1]:
        return Status(image_id, "failed", "missing-sentences", str(txt_path))
    leaving = next((p for p in (xml_path, txt_path) if fs.inside(root, p) is None), None)
    if leaving is not None:
        detail = f"{leaving}: resolves outside {root} (a link out of the dataset)"
        return Status(image_id, "failed", "unsafe-path", detail)
    try:
        width, height, boxes = parse_annotation(fs.read_bytes(xml_path))
    except FormatError as err:
        return Status(image_id, "failed", "bad-annotation", f"{fs.name(xml_path)}: {err}")
    except OSError as err:
        return Status(image_id, "failed", "unreadable", str(err))
    try:
        captions = _captions(image_id, fs.read_text(txt_path))
    except FormatError as err:
        return Status(image_id, "failed", "bad-annotation", f"{fs.name(txt_path)} {err}")
    except UnicodeDecodeError as err:
        return Status(image_id, "failed", "bad-annotation", f"{fs.name(txt_path)}: {err}")
    except OSError as err:
        return Status(image_id, "failed", "unreadable", str(err))
    entity_types: dict[str, tuple[str, ...]] = {}
    for caption in captions:
        for phrase in caption.phrases or ():
            known = entity_types.get(phrase.entity_id, ())
            entity_types[phrase.entity_id] = tuple(dict.fromkeys(known + phrase.types))
    objects: dict[tuple[tuple[float, ...], str], ObjectAnnotation] = {}
    for box in boxes:
        for entity in box.entity_ids:
            cls = next((t for t in entity_types.get(entity, ()) if t in types), None)
            if cls is not None:
                objects.setdefault((box.xywh, cls), ObjectAnnotation(box.xywh, cls))
    return ImageRecord(
        image_id=image_id,
        file=file,
        width=width,
        height=height,
        objects=tuple(objects.values()),
        captions=tuple(captions),
        root=images,
        split=split,
        dataset="flickr30k",
    )


def _captions(image_id: str, content: str) -> list[Caption]:
    """The captions of a ``Sentences`` file: one a line (``\\n`` or ``\\r\\n``), cleaned
    (:func:`~counterfactual.readers.clean.clean_text`) before the markup is parsed, so phrase
    offsets index the clean text; lines empty after cleaning are not counted.
    ``FormatError`` names the line."""
    captions: list[Caption] = []
    for number, line in enumerate(content.split("\n"), 1):
        clean = clean_text(line)
        if not clean.text:
            continue
        try:
            text, phrases = parse_sentence(clean.text)
        except FormatError as err:
            raise FormatError(f"line {number}: {err}") from err
        captions.append(Caption(f"{image_id}_{len(captions)}", text, phrases, clean.removed))
    return captions


def _names(files: list[str], suffix: str) -> set[str]:
    """The names in ``files`` that end in ``suffix`` and are not hidden (``*.xml`` in a glob)."""
    return {n for n in files if n.endswith(suffix) and not n.startswith(".")}


def read_flickr30k(
    root: fs.PathLike,
    split: str | None = None,
    types: Sequence[str] = DEFAULT_TYPES,
    images: str | Path = "flickr30k-images",
) -> Dataset:
    """Read Flickr30k Entities under ``root``; with ``split`` only the ids in ``root/<split>.txt``,
    else every id that has a sentence or an annotation file. ``types`` are the entity types that
    become object classes; ``images`` is the picture folder, relative to ``root`` or absolute (a
    local path or a URL). ``root`` may be a local folder or a URL."""
    root = fs.as_path(root)
    types = tuple(types)
    if not types or not all(isinstance(t, str) and t for t in types):
        raise ValueError(f"types must be non-empty type names, got {types!r}")
    if not fs.isdir(root):
        raise ValueError(f"Flickr30k root {root} is not a folder")
    listed = (
        _names(fs.listdir(fs.join(root, "Annotations")), ".xml"),
        _names(fs.listdir(fs.join(root, "Sentences")), ".txt"),
    )
    if split is not None:
        ids = split_ids(root, split)
    else:
        stems = {n.removesuffix(".xml") for n in listed[0]}
        stems |= {n.removesuffix(".txt") for n in listed[1]}
        ids = sorted(stems, key=lambda s: (len(s), s))
    absolute = fs.is_url(images) or Path(fs.as_path(images)).is_absolute()
    image_dir = fs.as_path(images) if absolute else fs.join(root, os.fspath(images))

    def read(image_id: str) -> ImageRecord | Status:
        return _read_image(image_id, root, image_dir, types, split, listed)

    if fs.is_url(root):  # two requests an image: overlap them (results stay in id order)
        with ThreadPoolExecutor(_URL_THREADS) as pool:
            results = list(pool.map(read, ids))
    else:
        results = [read(image_id) for image_id in ids]
    records = [r for r in results if isinstance(r, ImageRecord)]
    failures = [r for r in results if not isinstance(r, ImageRecord)]
    return Dataset(
        name="flickr30k",
        records=tuple(records),
        class_names=types,
        failures=tuple(failures),
    )


__all__ = [
    "ALL_TYPES",
    "DEFAULT_TYPES",
    "EntityBox",
    "SPLITS",
    "FormatError",
    "parse_annotation",
    "parse_sentence",
    "read_flickr30k",
    "split_ids",
]
