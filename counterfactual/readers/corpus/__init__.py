"""Box-less image-text corpora: WebDataset shards, Parquet tables and CSV tables.

These corpora have pictures and captions but no boxes, so every record has ``objects=()``,
``width = height = 0`` (unknown until decoded; a detector supplies the objects later), one
:class:`~counterfactual.records.Caption` with ``caption_id`` ``"0"`` (or none), ``split=None``
and ``dataset`` ``"wds"``, ``"parquet"``, ``"csv"`` or ``"files"``, and the
:class:`~counterfactual.records.Origin` its downloader recorded (img2dataset's ``url``,
``key``, ``status``, ``sha256``: the ``json`` member or file, or those table columns).

Formats:

- **WebDataset** (:func:`iter_wds`): uncompressed tar shards in which the members of one sample
  share a key, the member name up to the first dot of its base name, directory kept
  (``a/000000123.jpg`` -> key ``a/000000123``, field ``jpg``), as :mod:`webdataset` groups them:
  consecutive members with the same key form a sample. img2dataset writes ``jpg``, ``txt`` (the
  caption) and ``json`` (metadata, with ``caption`` among other fields) per sample. The picture
  is the first of the fields ``jpg``, ``jpeg``, ``png``, ``webp`` that the sample has; the
  caption is ``txt`` (UTF-8), else ``json["caption"]``.

Captions are cleaned (:func:`counterfactual.readers.clean.clean_text`: control and invisible
characters out, whitespace runs as one space); one empty after cleaning is no caption.
- **Parquet** (:func:`iter_table`, ``kind="parquet"``): one row per picture. The image column
  holds the encoded picture (a binary column, or a struct ``{bytes, path}`` as Hugging Face
  datasets write images) or a path to a picture file.
- **CSV** (:func:`iter_table`, ``kind="csv"``): like Parquet, but the image column holds paths.
  Read as Python's :mod:`csv` reads it (the ``excel`` dialect, UTF-8, blank lines skipped).
- **files** (:func:`iter_files`): img2dataset's ``files`` output, shard folders of
  ``KEY.jpg``, ``KEY.txt``, ``KEY.json``.

img2dataset's output folder is read as it is (:func:`expand_pattern` with a kind: a folder
means its ``*.tar``, ``*.parquet`` or ``*.csv``, or its shard folders); the urls it failed are
in its metadata ``SHARD.parquet`` beside each tar or shard folder, not in them, and become
``download-failed`` rows after the shard's samples.

Every path may be a local path or an fsspec URL (``s3://bucket/shards/{00000..00099}.tar``),
read through :mod:`counterfactual.fs`: pattern expansion, tars, tables, and the pictures that
:func:`read_source` reads back.

Pieces: a run cuts a corpus into :class:`InputPiece` s, one output shard each, so that the
driver holds O(files), never O(samples). :func:`plan_pieces` (the driver) lists the files and
cuts them without reading samples: one piece per tar, Parquet by row counts from the footer,
CSV by one binary scan that records the byte offset of every ``rows_per_piece``-th row; and it
reads every piece's keys (a tar's headers, a Parquet file's id column, a CSV's id cells, a
shard folder's names) into the run's :class:`~counterfactual.readers.keyset.KeySet`, in piece
order, so that each piece carries the keys an earlier one had. :func:`read_piece` (a worker)
reads one piece's records.
:func:`iter_wds` and :func:`iter_table` are the same machinery with one piece per file.

Streaming: readers never read picture data. A shard's tar headers are read one after another
and the data between them is skipped by seeking; only the small ``txt`` / ``json`` members are
read. Parquet is read by row group, only the id and caption columns, plus the image column when
the row group's statistics do not rule out empty cells. A picture inside another file gets a
``source`` (:class:`~counterfactual.records.TarMember`: byte offset and size;
:class:`~counterfactual.records.ParquetCell`: row group, row and column), which a worker reads
with :func:`read_source` (one ranged read for a tar member); a picture file of its own gets
``file`` relative to ``root`` (a ``Path``, or a ``str`` URL), as in the annotated datasets.

Bad data never raises; it becomes a ``failed`` :class:`~counterfactual.records.Status`:

- ``missing-image``: a sample without a picture member, or a row whose image cell is null
  (a struct with neither ``bytes`` nor ``path``; in a CSV, an empty cell); a url img2dataset's
  metadata lists as downloaded that its shard lacks.
- ``download-failed``: a url img2dataset could not fetch or resize (its metadata's ``status``
  is not ``success``; ``detail``: :func:`download_detail`).
- ``duplicate-key``: a key or id already seen earlier in the same stream; the first one is
  kept, ``detail`` names both places. :func:`iter_wds` / :func:`iter_table` check the whole
  stream (every shard or file); :func:`read_piece` checks its piece, and the keys the planner
  found in an earlier piece (:func:`plan_pieces`: ``detail`` says "an earlier piece" or "an
  earlier row"). img2dataset's metadata rows (``download-failed``) are checked within their
  shard only.
- ``bad-metadata``: the caption would come from a member that cannot be read as text (a ``txt``
  that is not UTF-8, a ``json`` that does not parse or is not an object, text members over
  1 MiB), or a table's caption cell is over 1 MiB (a CSV cell of any size is read: Python's
  csv field limit is raised, so the rows after a long cell are read).
- ``unsafe-path``: a path cell that is absolute outside the images folder, climbs out with
  ``..``, names a drive or URL (other than one inside a URL images folder), is an empty
  string (Parquet) or resolves outside the images folder (a link out); a shard folder's
  picture, ``txt`` or ``json`` that resolves outside the folder holding the shard folders;
  img2dataset's metadata that resolves outside its shard's folder; and (``image_id`` = the
  path) a tar, table or shard folder that resolves outside the pattern's root
  (:func:`~counterfactual.readers.corpus.pattern.pattern_root`). One rule for all of them,
  :func:`counterfactual.fs.inside`: links that stay inside are fine; none of these is read.
- ``missing-file`` (``image_id`` = the path): a shard or table that does not exist.
- ``bad-shard`` (``image_id`` = the path): a tar that is corrupt, truncated or compressed, or a
  table that cannot be read. Records read before the problem are kept; a sample that was still
  being grouped when it occurred is dropped (it may be incomplete) and named in ``detail``. A
  CSV that stops being UTF-8 fails the piece that holds the bad bytes, from the decoding block
  that holds them; other pieces of the file are read.

Bad configuration raises ``ValueError`` up front: a pattern that matches nothing, a named
column that a table lacks, a table with no caption or image column to be found, a caption or
image column of the wrong type.

Modules: :mod:`.common` (the layouts, the :class:`CorpusFormat` protocol, shared helpers),
:mod:`.formats` (``FORMATS``: each kind's format), :mod:`.pattern` (:func:`expand_pattern`),
:mod:`.pieces` (planning, reading pieces, the whole-stream readers, :func:`read_source`), one
module per format (:mod:`.wds`, :mod:`.parquet`, :mod:`.csv_table`, :mod:`.files`; the tables
share :mod:`.table`, the tars and shard folders :mod:`.members`).
"""

from __future__ import annotations

from counterfactual.readers.corpus.common import (
    CAPTION_COLUMNS,
    ID_COLUMNS,
    IMAGE_COLUMNS,
    MAX_TEXT_BYTES,
    PICTURE_FIELDS,
    CorpusFormat,
    InputPiece,
    PlannedFile,
    PlanOptions,
    TableLayout,
    collect,
)
from counterfactual.readers.corpus.files import files_root
from counterfactual.readers.corpus.formats import (
    FORMATS,
    KIND_SUFFIXES,
    PIECE_KINDS,
    TABLE_KINDS,
    corpus_format,
)
from counterfactual.readers.corpus.members import download_detail
from counterfactual.readers.corpus.pattern import expand_pattern, pattern_root
from counterfactual.readers.corpus.pieces import (
    iter_corpus,
    iter_files,
    iter_table,
    iter_wds,
    plan_pieces,
    read_files,
    read_piece,
    read_source,
    read_table,
    read_wds,
)
from counterfactual.readers.corpus.wds import member_key_field

__all__ = [
    "CAPTION_COLUMNS",
    "FORMATS",
    "ID_COLUMNS",
    "IMAGE_COLUMNS",
    "KIND_SUFFIXES",
    "MAX_TEXT_BYTES",
    "PICTURE_FIELDS",
    "PIECE_KINDS",
    "TABLE_KINDS",
    "CorpusFormat",
    "InputPiece",
    "PlanOptions",
    "PlannedFile",
    "TableLayout",
    "collect",
    "corpus_format",
    "download_detail",
    "expand_pattern",
    "files_root",
    "iter_corpus",
    "iter_files",
    "iter_table",
    "iter_wds",
    "member_key_field",
    "pattern_root",
    "plan_pieces",
    "read_files",
    "read_piece",
    "read_source",
    "read_table",
    "read_wds",
]
