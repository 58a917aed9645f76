"""The corpus formats by kind: the one table the planner, the workers and
:class:`~counterfactual.readers.spec.DataSpec` look a kind up in. A new format is a module with
a :class:`~counterfactual.readers.corpus.common.CorpusFormat` and one line here (and its kind in
:data:`counterfactual.readers.CORPORA`, the ``--dataset`` choices)."""

from __future__ import annotations

from counterfactual.readers.corpus import csv_table, files, parquet, wds
from counterfactual.readers.corpus.common import CorpusFormat
from counterfactual.readers.corpus.table import TableFormat

FORMATS: dict[str, CorpusFormat] = {
    f.kind: f for f in (wds.FORMAT, parquet.FORMAT, csv_table.FORMAT, files.FORMAT)
}
"""Each corpus kind's format, in the order of :data:`counterfactual.readers.CORPORA`."""
PIECE_KINDS = tuple(FORMATS)
TABLE_KINDS = tuple(kind for kind, f in FORMATS.items() if isinstance(f, TableFormat))
KIND_SUFFIXES = {kind: f.suffix for kind, f in FORMATS.items() if f.suffix is not None}
"""The files a glob or a folder stands for, by corpus kind (``files``: folders)."""


def corpus_format(kind: str) -> CorpusFormat:
    """The format of corpus ``kind``, or ``ValueError`` naming it."""
    found = FORMATS.get(kind)
    if found is None:
        raise ValueError(f"corpus kind {kind!r} is not one of {PIECE_KINDS}")
    return found
