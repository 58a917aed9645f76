"""Dataset readers: each turns a dataset's own files into :class:`~counterfactual.records.Dataset`.

A reader never opens images; it checks what the annotations say. An image whose annotations
are unusable becomes a :class:`~counterfactual.records.Status` in ``Dataset.failures`` with its
reason, so every image named by the dataset is accounted for.
"""

from __future__ import annotations

from pathlib import PurePosixPath

DATASETS = ("coco", "flickr30k", "demo")
"""Datasets with annotated boxes."""
CORPORA = ("wds", "parquet", "csv", "files")
"""Image-text corpora without boxes (:mod:`counterfactual.readers.corpus`): synth finds the
objects with a detector. ``files``: img2dataset's ``files`` output (shard folders of
``KEY.jpg``, ``KEY.txt``, ``KEY.json``)."""


def safe_relative_path(name: str) -> str | None:
    """``name`` as a relative POSIX path inside the dataset root, or ``None`` when it is absolute,
    empty or climbs out with ``..`` (a dataset file must never make us read elsewhere)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return None
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        return None
    return path.as_posix()
