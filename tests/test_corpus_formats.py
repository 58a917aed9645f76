"""The table of corpus formats: every ``--dataset`` corpus kind has one module's format behind
the :class:`CorpusFormat` protocol, found by its kind."""

from __future__ import annotations

import pytest

from counterfactual.readers import CORPORA
from counterfactual.readers.corpus import (
    FORMATS,
    KIND_SUFFIXES,
    PIECE_KINDS,
    TABLE_KINDS,
    CorpusFormat,
    corpus_format,
)
from counterfactual.readers.spec import DataSpec


def test_every_corpus_kind_has_its_format():
    assert tuple(FORMATS) == CORPORA == PIECE_KINDS
    for kind, form in FORMATS.items():
        assert isinstance(form, CorpusFormat)
        assert form.kind == kind
        assert corpus_format(kind) is form
    assert TABLE_KINDS == ("parquet", "csv")
    assert KIND_SUFFIXES == {"wds": ".tar", "parquet": ".parquet", "csv": ".csv"}


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match=r"corpus kind 'tsv' is not one of \('wds', 'parquet'"):
        corpus_format("tsv")


@pytest.mark.parametrize(
    ("kind", "hint"),
    [
        ("wds", "its files or their folder, e.g. 'data/{00000..00009}.tar' or 'data'"),
        ("parquet", "its files or their folder, e.g. 'data/{00000..00009}.parquet' or 'data'"),
        ("csv", "its files or their folder, e.g. 'data/{00000..00009}.csv' or 'data'"),
        ("files", "img2dataset's output folder (its shard folders 00000/, 00001/, ...)"),
    ],
)
def test_a_corpus_without_root_says_what_root_names(kind, hint):
    with pytest.raises(ValueError) as err:
        DataSpec(kind=kind).resolved()
    assert str(err.value).startswith(f"--dataset {kind} needs --root: {hint}")


def test_only_a_files_corpus_fills_in_its_images_folder(tmp_path):
    (tmp_path / "00000").mkdir()
    (tmp_path / "00000" / "a.jpg").write_bytes(b"")
    assert DataSpec(kind="files", root=str(tmp_path)).resolved().images == str(tmp_path)
    assert DataSpec(kind="wds", root=str(tmp_path)).resolved().images is None
