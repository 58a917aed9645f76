"""Dataset readers: each turns a dataset's own files into :class:`~counterfactual.records.Dataset`.

A reader never opens images; it checks what the annotations say. An image whose annotations
are unusable becomes a :class:`~counterfactual.records.Status` in ``Dataset.failures`` with its
reason, so every image named by the dataset is accounted for.
"""

from __future__ import annotations

DATASETS = ("coco", "flickr30k", "demo")
"""Datasets with annotated boxes."""
CORPORA = ("wds", "parquet", "csv", "files")
"""Image-text corpora without boxes (:mod:`counterfactual.readers.corpus`): synth finds the
objects with a detector. ``files``: img2dataset's ``files`` output (shard folders of
``KEY.jpg``, ``KEY.txt``, ``KEY.json``)."""
