"""A record's picture as synth edits it and the report shows it: decoded, checked against its
annotated size and turned into the frame its boxes were drawn in (:mod:`.frames`), and the scale
from the annotated pixels to it."""

from __future__ import annotations

import numpy as np

from counterfactual.imageio import (
    Decoded,
    SampleError,
    decode_picture,
    load_picture,
    resolve_inside,
)
from counterfactual.records import ImageRecord
from counterfactual.shards.frames import DEFAULT_RULE, Framed, FrameRule, choose_frame


def load_record_image(
    record: ImageRecord, max_pixels: int, rule: FrameRule = DEFAULT_RULE
) -> np.ndarray:
    """The record's picture in the frame of its boxes (:func:`load_record_picture`)."""
    return load_record_picture(record, max_pixels, rule).pixels


def load_record_picture(
    record: ImageRecord, max_pixels: int, rule: FrameRule = DEFAULT_RULE
) -> Framed:
    """The record's picture, checked against its annotated size, in the frame its boxes were
    drawn in: stored or upright per its EXIF orientation, as the annotated size tells, else as
    ``rule`` says (:mod:`counterfactual.shards.frames`). A picture whose size differs but whose
    aspect ratio matches (within 1%) is used and boxes are scaled to it (:func:`box_scale`);
    any other size is a ``size-mismatch`` failure. A record of unknown size (``0 x 0``, a
    corpus without boxes) is not checked and is returned upright. A picture inside another
    file (a tar member, a Parquet cell: ``record.source``) is read from there; a ``root`` that
    is a URL (``s3://bucket/images``) is read through :mod:`counterfactual.fs`.
    """
    return choose_frame(record, _decode_record(record, max_pixels), rule)


def _decode_record(record: ImageRecord, max_pixels: int) -> Decoded:
    if record.source is not None:
        from counterfactual.readers.corpus import read_source

        return decode_picture(read_source(record.source), max_pixels)
    if record.root is None:
        raise SampleError("missing-file", f"record {record.image_id} has no root folder")
    return load_picture(resolve_inside(record.root, record.file), max_pixels)


def box_scale(record: ImageRecord, image: np.ndarray) -> tuple[float, float]:
    """``(sx, sy)`` taking the record's annotated pixels to ``image``'s (see
    :func:`load_record_image`); ``(1, 1)`` for a record of unknown size, whose boxes (from a
    detector) are already in decoded pixels."""
    if not (record.width and record.height):
        return 1.0, 1.0
    return image.shape[1] / record.width, image.shape[0] / record.height
