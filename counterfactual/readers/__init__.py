"""Dataset readers: each turns a dataset's own files into :class:`~counterfactual.records.Dataset`.

A reader never opens images; it checks what the annotations say. An image whose annotations
are unusable becomes a :class:`~counterfactual.records.Status` in ``Dataset.failures`` with its
reason, so every image named by the dataset is accounted for.
"""

from __future__ import annotations

from counterfactual import plugins

DATASETS = ("coco", "flickr30k", "demo")
"""Datasets with annotated boxes."""
FORMAT_MODULES = {
    "wds": "counterfactual.readers.corpus.wds",
    "parquet": "counterfactual.readers.corpus.parquet",
    "csv": "counterfactual.readers.corpus.csv_table",
    "files": "counterfactual.readers.corpus.files",
}
"""The corpus formats this package ships, by kind: the module whose ``FORMAT`` reads it
(imported only when a corpus is read, :data:`counterfactual.readers.corpus.formats.FORMATS`)."""
CORPORA = tuple(
    dict.fromkeys(
        [*FORMAT_MODULES, *(k for k in plugins.names(plugins.FORMATS) if k not in DATASETS)]
    )
)
"""Image-text corpora without boxes (:mod:`counterfactual.readers.corpus`): synth finds the
objects with a detector. ``files``: img2dataset's ``files`` output (shard folders of
``KEY.jpg``, ``KEY.txt``, ``KEY.json``). The built-in kinds (:data:`FORMAT_MODULES`), then the
kinds of the ``counterfactual.formats`` entry points (read without importing them; one that
fails to load is skipped with a warning when the formats are)."""
