"""In which frame a dataset's boxes lie on a picture that carries an EXIF orientation.

A picture may be stored sideways, upside down or mirrored with an EXIF ``Orientation`` tag
(2..8) saying how to turn it upright. Tools disagree on whether boxes are drawn on the stored
pixels (PIL-based loaders such as pycocotools' and torchvision's, many annotation exports) or on
the upright ones (detectron2, OpenCV, browsers). One rule decides it for every picture of a run:

1. Where the annotated ``width``/``height`` tell the frame, they decide: orientations 5..8 swap
   the axes of a non-square picture, so the annotated size is either the stored size or the
   upright one (exactly, else by aspect ratio within 1%).
2. Where they cannot (orientations 2..4 keep the axes; a square picture), the frame is the
   dataset's: ``--exif-frame stored|oriented`` when given, else the frame in which the dataset's
   pictures of rule 1 are annotated (:func:`scan_rule`, a driver-side pass over the pictures'
   headers, so every shard, worker and rerun uses the same), else ``stored``
   (:data:`DEFAULT_FRAME`: what pycocotools- and PIL-based loaders read, which never apply the
   tag). A dataset whose pictures of rule 1 are annotated in both frames has no frame of its
   own: its ambiguous pictures fail ``exif-frame-unknown`` until ``--exif-frame`` is given.
3. With ``--exif-frame`` given, a picture whose annotated size says the other frame fails
   ``exif-frame-mismatch`` rather than have the wrong object erased.

The shard holds the picture in the frame its boxes were drawn in, boxes and masks unchanged; the
sample json records ``exif_orientation`` and ``exif_frame`` so a reader can turn it upright.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from counterfactual.imageio import (
    SWAPPING,
    Decoded,
    Header,
    SampleError,
    read_header,
    resolve_inside,
)
from counterfactual.records import ImageRecord

FRAMES = ("stored", "oriented")
"""``stored``: boxes on the pixels as the file stores them; ``oriented``: on the upright
picture, the EXIF orientation applied."""
EXIF_FRAMES = ("auto", *FRAMES)
"""The values of ``--exif-frame``; ``auto``: the dataset's frame (:func:`scan_rule`)."""
DEFAULT_FRAME = "stored"
"""The frame of an ambiguous picture in a dataset that gives no hint (see the module doc)."""
HEADER_THREADS = 16
"""Pictures whose header :func:`scan_rule` reads at once (the reads wait on storage)."""


@dataclass(frozen=True, slots=True)
class FrameRule:
    """The frame of the pictures whose annotated size cannot tell it: ``frame`` (one of
    :data:`FRAMES`; ``None``: unknown, the dataset's pictures are annotated in both); ``given``:
    named by ``--exif-frame``, so a picture whose size says the other frame fails;
    ``stored``/``oriented``: how many of the dataset's pictures told each frame by their size."""

    frame: str | None = DEFAULT_FRAME
    given: bool = False
    stored: int = 0
    oriented: int = 0

    def __post_init__(self) -> None:
        if self.frame is not None and self.frame not in FRAMES:
            raise ValueError(f"exif frame {self.frame!r} is not one of {FRAMES}")


DEFAULT_RULE = FrameRule()


@dataclass(frozen=True, slots=True)
class Framed:
    """A record's picture in the frame of its boxes: ``pixels`` (H, W, 3) uint8 RGB,
    ``orientation`` its EXIF tag (1..8, 1 untagged) and ``frame`` (one of :data:`FRAMES`;
    ``oriented`` for a record of unknown size, whose boxes a detector finds upright)."""

    pixels: np.ndarray
    orientation: int
    frame: str


def frame_sizes(width: int, height: int, orientation: int) -> dict[str, tuple[int, int]]:
    """The ``(w, h)`` of a picture stored ``width`` x ``height`` in each frame."""
    upright = (height, width) if orientation in SWAPPING else (width, height)
    return {"stored": (width, height), "oriented": upright}


def fitting_frames(
    width: int, height: int, orientation: int, declared: tuple[int, int]
) -> tuple[str, ...]:
    """The frames whose size is the ``declared`` (annotated) one: exactly, else by aspect ratio
    within 1%; both when the size cannot tell them apart, none when it fits neither."""
    sizes = frame_sizes(width, height, orientation)
    for exact in (True, False):
        hits = tuple(f for f in FRAMES if same_shape(sizes[f], declared, exact))
        if hits:
            return hits
    return ()


def same_shape(size: tuple[int, int], declared: tuple[int, int], exact: bool) -> bool:
    """``size`` (w, h) is ``declared``, or (``exact=False``) has its aspect ratio within 1%."""
    (w, h), (dw, dh) = size, declared
    if exact or not (w and h and dw and dh):
        return (w, h) == (dw, dh)
    return abs(w / h - dw / dh) <= 0.01 * dw / dh


def told_frame(header: Header, declared: tuple[int, int]) -> str | None:
    """The frame a tagged picture's annotated size tells by itself (rule 1), else ``None``."""
    if header.orientation == 1:
        return None
    hits = fitting_frames(header.width, header.height, header.orientation, declared)
    return hits[0] if len(hits) == 1 else None


def choose_frame(record: ImageRecord, decoded: Decoded, rule: FrameRule = DEFAULT_RULE) -> Framed:
    """``decoded`` in the frame of ``record``'s boxes under ``rule`` (see the module doc).

    ``size-mismatch`` when the annotated size fits neither frame, ``exif-frame-mismatch`` when
    it says the frame the user did not give, ``exif-frame-unknown`` for an ambiguous picture of a
    dataset without a frame. A record of unknown size (``0 x 0``) is upright."""
    o = decoded.orientation
    if record.width == record.height == 0:
        return Framed(decoded.upright(), o, "oriented")
    declared = (record.width, record.height)
    h, w = decoded.stored.shape[:2]
    hits = fitting_frames(w, h, o, declared)
    if not hits:
        uw, uh = frame_sizes(w, h, o)["oriented"]
        raise SampleError(
            "size-mismatch", f"annotated {declared[0]}x{declared[1]}, decoded {uw}x{uh}"
        )
    if o == 1:
        return Framed(decoded.stored, o, "stored")
    if len(hits) == 1:
        frame = hits[0]
        if rule.given and rule.frame != frame:
            raise SampleError(
                "exif-frame-mismatch",
                f"annotated {declared[0]}x{declared[1]} is the {frame} size of a picture with "
                f"EXIF orientation {o}, but --exif-frame {rule.frame}",
            )
    elif rule.frame is None:
        raise SampleError(
            "exif-frame-unknown",
            f"EXIF orientation {o}: the size cannot tell the frame and the dataset's pictures "
            f"are annotated in both ({rule.stored} stored, {rule.oriented} oriented): give "
            "--exif-frame stored or oriented",
        )
    else:
        frame = rule.frame
    return Framed(decoded.frame(frame == "oriented"), o, frame)


def scan_rule(
    records: Iterable[ImageRecord], exif_frame: str = "auto", threads: int = HEADER_THREADS
) -> FrameRule:
    """The run's :class:`FrameRule`: ``exif_frame`` when it names a frame; for ``auto`` the
    frame the pictures that tell one by their size (:func:`told_frame`) are annotated in, read
    from the headers of every record of known size (no pixel decoded; a picture that cannot be
    read tells nothing, its worker fails it). The same records give the same rule, whatever the
    order the headers arrive in."""
    if exif_frame not in EXIF_FRAMES:
        raise ValueError(f"exif frame {exif_frame!r} is not one of {EXIF_FRAMES}")
    if exif_frame != "auto":
        return FrameRule(exif_frame, given=True)
    sized = [r for r in records if r.width and r.height]
    with ThreadPoolExecutor(max(1, min(threads, len(sized)))) as pool:
        counts = Counter(told for told in pool.map(_told, sized) if told is not None)
    stored, oriented = counts["stored"], counts["oriented"]
    if stored and oriented:
        return FrameRule(None, stored=stored, oriented=oriented)
    frame = "oriented" if oriented else DEFAULT_FRAME
    return FrameRule(frame, stored=stored, oriented=oriented)


def _told(record: ImageRecord) -> str | None:
    try:
        return told_frame(_header(record), (record.width, record.height))
    except SampleError:
        return None


def _header(record: ImageRecord) -> Header:
    if record.source is not None:
        from counterfactual.readers.corpus import read_source

        return read_header(read_source(record.source))
    if record.root is None:
        raise SampleError("missing-file", f"record {record.image_id} has no root folder")
    return read_header(resolve_inside(record.root, record.file))


__all__: Sequence[str] = (
    "DEFAULT_FRAME",
    "DEFAULT_RULE",
    "EXIF_FRAMES",
    "FRAMES",
    "FrameRule",
    "Framed",
    "choose_frame",
    "fitting_frames",
    "frame_sizes",
    "same_shape",
    "scan_rule",
    "told_frame",
)
