"""CSV corpora as spreadsheets write them: a UTF-8 byte-order mark before the header is no part
of the first column's name (Excel's "CSV UTF-8" writes one), and the same key in two files or
two pieces of a run is written once: every later row is a ``duplicate-key`` status row, found
by the driver's run-wide key set (:class:`~counterfactual.readers.keyset.KeySet`)."""

from __future__ import annotations

import random
import tarfile
from collections import Counter

import pytest
from test_corpus_synth import _args

from counterfactual.cli import main
from counterfactual.readers.corpus import iter_table, plan_pieces, read_piece
from counterfactual.readers.keyset import KeySet
from counterfactual.records import ImageRecord, Status
from counterfactual.synth.run import read_status
from counterfactual.testing.corpora import demo_samples, write_csv
from counterfactual.testing.owlv2 import build_tiny_owlv2


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return demo_samples(tmp_path_factory.mktemp("demo"), shrink=4)


def _with_bom(path):
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    return path


def _rows(pieces):
    out = []
    for piece in pieces:
        out.extend([piece] if isinstance(piece, Status) else read_piece(piece))
    return out


def test_a_bom_before_the_header_keeps_the_key_column(samples, tmp_path):
    table = _with_bom(write_csv(samples, tmp_path / "pairs.csv", tmp_path / "pictures"))
    keys = [key for key, *_ in samples]
    for pieces in (plan_pieces(table, "csv", 3), plan_pieces(table, "csv", 3, id_column="key")):
        rows = _rows(pieces)
        assert [r.image_id for r in rows] == keys  # not pairs-00000000, ..., none lost
        assert all(isinstance(r, ImageRecord) for r in rows)
    assert [r.image_id for r in iter_table(table, "csv")] == keys


def test_the_same_key_in_two_pieces_or_files_is_written_once(samples, tmp_path):
    first = write_csv(samples[:5], tmp_path / "a" / "part-1.csv", tmp_path / "pictures")
    # part-2 repeats two keys of part-1 (a re-download) and one of its own, in another piece
    again = [samples[1], samples[5], samples[3], samples[6], samples[5], samples[7]]
    write_csv(again, tmp_path / "a" / "part-2.csv", tmp_path / "pictures")
    rows = _rows(plan_pieces(str(tmp_path / "a" / "*.csv"), "csv", 2, images=tmp_path / "pictures"))
    assert len(rows) == 11  # every input row ends as a record or a status row
    records = [r.image_id for r in rows if isinstance(r, ImageRecord)]
    assert len(records) == len(set(records)) == 8
    repeats = [r for r in rows if isinstance(r, Status)]
    assert [(r.image_id, r.reason) for r in repeats] == [
        (samples[1][0], "duplicate-key"),
        (samples[3][0], "duplicate-key"),
        (samples[5][0], "duplicate-key"),
    ]
    assert "part-2.csv#0" in repeats[0].detail
    assert first.exists()
    # the whole stream read at once agrees
    streamed = list(iter_table(str(tmp_path / "a" / "*.csv"), "csv", images=tmp_path / "pictures"))
    assert [(r.image_id, getattr(r, "reason", None)) for r in streamed] == [
        (r.image_id, getattr(r, "reason", None)) for r in rows
    ]


def test_ids_made_from_the_row_repeat_across_files_of_the_same_stem(samples, tmp_path):
    """Without an id column a row's id is ``STEM-ROW``: two folders' ``pairs.csv`` collide."""
    for folder in ("x", "y"):
        table = write_csv(samples[:3], tmp_path / folder / "pairs.csv", tmp_path / "pictures")
        lines = table.read_text().splitlines()
        table.write_text("\n".join(line.split(",", 1)[1] for line in lines) + "\n")
    pieces = plan_pieces(str(tmp_path / "*" / "pairs.csv"), "csv", 2, images=tmp_path / "pictures")
    rows = _rows(pieces)
    assert [r.image_id for r in rows] == [f"pairs-{i:08d}" for i in (0, 1, 2, 0, 1, 2)]
    assert [getattr(r, "reason", None) for r in rows] == [None] * 3 + ["duplicate-key"] * 3


def test_the_key_set_agrees_with_a_python_set():
    rng = random.Random(7)
    keys = KeySet()
    reference: set[str] = set()
    for _ in range(300):
        batch = [f"k{rng.randrange(5000)}" for _ in range(rng.randrange(0, 60))]
        expected = []
        for key in batch:
            expected.append(key in reference)
            reference.add(key)
        assert keys.add(batch) == expected
    assert len(keys) == len(reference)
    assert keys.nbytes == 8 * len(reference)
    assert len(keys._runs) <= len(reference).bit_length()


def test_a_csv_run_writes_each_key_once(samples, tmp_path):
    owl = build_tiny_owlv2(tmp_path / "owlv2", grid_boxes=True)
    pictures = tmp_path / "pictures"
    _with_bom(write_csv(samples[:5], tmp_path / "csv" / "part-1.csv", pictures))
    write_csv([samples[2], samples[5], samples[0]], tmp_path / "csv" / "part-2.csv", pictures)
    out = tmp_path / "out"
    assert main(_args(owl, "csv", tmp_path / "csv", out, "--images", str(pictures))) == 0
    statuses = list(read_status(out))
    failed = Counter((s.image_id, s.reason) for s in statuses if s.status == "failed")
    assert failed == {(samples[2][0], "duplicate-key"): 1, (samples[0][0], "duplicate-key"): 1}
    members = []
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            members += tar.getnames()
    assert members and len(members) == len(set(members))  # no sample twice
    assert {s.image_id for s in statuses} == {key for key, *_ in samples[:6]}
