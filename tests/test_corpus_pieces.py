"""Corpora cut into pieces (one output shard each): the driver plans them from file listings,
Parquet footers and one binary scan of a CSV; a worker reads one piece. Read piece by piece, a
corpus gives exactly the records of the whole-stream readers; on S3 the same as on disk."""

from __future__ import annotations

import csv
import dataclasses
import io
import pickle
import random
import tarfile
from pathlib import Path

import msgspec
import pytest
from arrays import random_image

from counterfactual import fs
from counterfactual.imageio import SampleError, encode_jpeg
from counterfactual.readers.corpus import (
    InputPiece,
    TableLayout,
    expand_pattern,
    iter_table,
    iter_wds,
    plan_pieces,
    read_piece,
    read_source,
)
from counterfactual.readers.corpus.csv_table import _binary_lines, _csv_records
from counterfactual.records import ImageRecord, ParquetCell, Status, TarMember
from counterfactual.testing.corpora import (
    Sample,
    write_csv,
    write_parquet,
    write_pictures,
    write_wds,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

SIZES = [1, 2, 7, 1000]
"""Rows per piece: single rows, pairs, a size that does not divide the files, one per file."""


def tiny(n: int, prefix: str = "s") -> list[Sample]:
    return [
        (f"{prefix}{i:03d}", encode_jpeg(random_image(8, 12, seed=i)), f"caption {i}", {"i": i})
        for i in range(n)
    ]


def pieces(plan: object) -> list[InputPiece]:
    return [p for p in plan if isinstance(p, InputPiece)]  # type: ignore[attr-defined]


def by_pieces(*args: object, **kwargs: object) -> list[ImageRecord | Status]:
    """``read_piece`` over ``plan_pieces``, planning statuses kept in place."""
    rows: list[ImageRecord | Status] = []
    for item in plan_pieces(*args, **kwargs):  # type: ignore[arg-type]
        rows += [item] if isinstance(item, Status) else list(read_piece(item))
    return rows


# --------------------------------------------------------------------------- the CSV scan


def test_csv_record_scan_agrees_with_the_csv_module_on_random_text() -> None:
    # every boundary the scan finds cuts the text into exactly the records csv.reader reads,
    # whatever the quoting (stray quotes, text after a closing quote, bare CR, unclosed quote)
    rng = random.Random(0)
    alphabet = ["a", "b", ",", '"', '"', "\r", "\n", "\n", "é", " "]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        data = text.encode()
        block = rng.choice([1, 3, 1 << 20])
        ends = list(_csv_records(_binary_lines(io.BytesIO(data), block), 0))
        cut: list[list[str]] = []
        start = 0
        for end, blank in ends:
            (record,) = csv.reader(io.StringIO(data[start:end].decode(), newline=""))
            assert (record == []) == blank, (text, ends)
            cut.append(record)
            start = end
        assert start == len(data), (text, ends)
        assert cut == list(csv.reader(io.StringIO(text, newline=""))), (text, ends)


TRICKY_CSV = [
    # quoted newlines, doubled quotes, commas, UTF-8, blank lines, CRLF, no final newline
    'key,caption,image\n1,"two\nlines",a.jpg\n2,"say ""hi"", ok",b.jpg\n\n3,café ☕,c.jpg\n'
    '4,"a,b\r\nc",d.jpg\r\n\r\n5,plain,e.jpg\r\n6,"",f.jpg\n7,"last\n\n""row""",g.jpg',
    # a stray quote in an unquoted field, text after a closing quote, a bare CR, an empty row
    'id,text,path\r\nx1,a"b,x1.jpg\r\nx2,"q"tail,x2.jpg\rx3,,x3.jpg\n""\nx4,"\n",\n'
    'x5,"open to the end,x5.jpg\n',
    # a quoted header, a missing id (the row id is used), rows shorter than the header
    '"key","caption","file_name"\n,no id,n.jpg\nonly-key\n,,\n"k2",,k2.jpg\n',
]


@pytest.mark.parametrize("rows_per_piece", SIZES)
def test_csv_pieces_read_like_the_whole_file(tmp_path: Path, rows_per_piece: int) -> None:
    for i, text in enumerate(TRICKY_CSV):
        (tmp_path / f"t{i}.csv").write_bytes(text.encode())
    pattern = tmp_path / "t*.csv"
    whole = list(iter_table(pattern, "csv"))
    assert len(whole) == 17
    assert by_pieces(pattern, "csv", rows_per_piece) == whole
    plan = pieces(plan_pieces(pattern, "csv", rows_per_piece))
    for piece in plan:  # each piece starts at a row boundary and holds its rows
        data = Path(piece.path).read_bytes()
        assert piece.stop is not None and 0 < piece.stop - piece.start <= rows_per_piece
        assert piece.offset > 0 and piece.table is not None
        if piece.end is not None and piece.end < len(data):
            assert data[piece.end - 1 : piece.end] in (b"\n", b"\r")
        assert len(list(read_piece(piece))) == piece.stop - piece.start


def test_csv_piece_ranges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b'key,caption,image\n1,"x\ny",1.jpg\n\n2,b,2.jpg\n3,c,3.jpg\n')
    parsed: list[object] = []
    reader = csv.reader
    monkeypatch.setattr(csv, "reader", lambda *a, **k: parsed.append(a) or reader(*a, **k))
    plan = list(plan_pieces(path, "csv", 2))
    monkeypatch.undo()
    # the header, then one pass over the ids (a key repeated across pieces is found by the
    # planner); the rows, quoted newline and blank line included, are found by the byte scan
    assert len(parsed) == 2
    layout = TableLayout("caption", "image", "key", "path", ("key", "caption", "image"), None)
    header = len(b"key,caption,image\n")
    third = len(b'key,caption,image\n1,"x\ny",1.jpg\n\n2,b,2.jpg\n')
    assert plan == [
        InputPiece("csv", str(path), 0, 0, 2, header, third, layout),
        InputPiece("csv", str(path), 0, 2, 3, third, None, layout),
    ]
    # a header only, or blank lines after it: no piece
    (tmp_path / "empty.csv").write_bytes(b"key,caption,image\n\r\n\n")
    assert list(plan_pieces(tmp_path / "empty.csv", "csv", 5)) == []


# --------------------------------------------------------------------------- Parquet


def parquet_corpus(tmp_path: Path, images_as: str) -> Path:
    """Three tables with several row groups (2 rows each), one of them with null pictures in
    one row group only, and one without rows."""
    samples = tiny(12)
    samples[7] = (samples[7][0], None, samples[7][2], {})
    folder = tmp_path / "images"
    write_parquet(samples[:5], tmp_path / "p0.parquet", images_as, folder, row_group_size=2)
    write_parquet(samples[5:11], tmp_path / "p1.parquet", images_as, folder, row_group_size=2)
    write_parquet(samples[11:], tmp_path / "p2.parquet", images_as, folder, row_group_size=2)
    write_parquet([], tmp_path / "p3.parquet", images_as, folder)
    return tmp_path / "p*.parquet"


@pytest.mark.parametrize("images_as", ["bytes", "struct", "paths"])
@pytest.mark.parametrize("rows_per_piece", SIZES)
def test_parquet_pieces_read_like_the_whole_table(
    tmp_path: Path, images_as: str, rows_per_piece: int
) -> None:
    pattern = parquet_corpus(tmp_path, images_as)
    images = tmp_path / "images"
    whole = list(iter_table(pattern, "parquet", images=images))
    assert len(whole) == 12 and [r.image_id for r in whole if isinstance(r, Status)] == ["s007"]
    assert by_pieces(pattern, "parquet", rows_per_piece, images=images) == whole
    for record in whole:
        if isinstance(record, ImageRecord) and record.source is not None:
            assert read_source(record.source) == tiny(12)[int(record.image_id[1:])][1]


def test_parquet_pieces_come_from_the_footer_and_cross_row_groups(tmp_path: Path) -> None:
    pattern = parquet_corpus(tmp_path, "bytes")
    plan = pieces(plan_pieces(pattern, "parquet", 3))
    assert [(Path(p.path).name, p.index, p.start, p.stop) for p in plan] == [
        ("p0.parquet", 0, 0, 3),
        ("p0.parquet", 0, 3, 5),
        ("p1.parquet", 1, 0, 3),
        ("p1.parquet", 1, 3, 6),
        ("p2.parquet", 2, 0, 1),
    ]  # p3 has no rows
    # rows 3..5 of p1 cross row groups 1 and 2 (two rows each)
    rows = list(read_piece(plan[3]))
    assert [r.image_id for r in rows] == ["s008", "s009", "s010"]
    sources = [r.source for r in rows if isinstance(r, ImageRecord)]
    assert sources == [
        ParquetCell(str((tmp_path / "p1.parquet").absolute()), g, r, "image")
        for g, r in [(1, 1), (2, 0), (2, 1)]
    ]
    assert plan[0].table == TableLayout("caption", "image", "key", "bytes")
    assert all(pickle.loads(pickle.dumps(p)) == p for p in plan)


def test_table_pieces_statuses_and_configuration_errors(tmp_path: Path) -> None:
    samples = tiny(3)
    write_parquet(samples[:2], tmp_path / "0.parquet")
    (tmp_path / "1.parquet").write_bytes(b"PAR1 but not really parquet")
    plan = list(plan_pieces(f"{tmp_path}/{{0,1,2}}.parquet", "parquet", 1))
    assert [p.start for p in pieces(plan)] == [0, 1]
    assert [(s.image_id, s.reason) for s in plan if isinstance(s, Status)] == [
        (str(tmp_path / "1.parquet"), "bad-shard"),
        (str(tmp_path / "2.parquet"), "missing-file"),
    ]
    # bad configuration raises at the call, before any piece
    pq.write_table(pa.table({"caption": ["x"], "url": ["u"]}), tmp_path / "3.parquet")
    with pytest.raises(ValueError, match="no image column") as err:
        plan_pieces(f"{tmp_path}/{{0,3}}.parquet", "parquet", 1)
    assert "3.parquet" in str(err.value)
    with pytest.raises(ValueError, match="no id column 'uid'"):
        plan_pieces(tmp_path / "0.parquet", "parquet", 1, id_column="uid")
    with pytest.raises(ValueError, match="no file matches"):
        plan_pieces(tmp_path / "none-*.parquet", "parquet", 1)
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="rows_per_piece"):
            plan_pieces(tmp_path / "0.parquet", "parquet", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="corpus kind"):
        plan_pieces(tmp_path / "0.parquet", "tsv", 1)
    with pytest.raises(ValueError, match="layout"):
        list(read_piece(InputPiece("csv", str(tmp_path / "t.csv"), 0)))


def test_duplicate_ids_are_found_within_and_across_pieces(tmp_path: Path) -> None:
    samples = tiny(3)
    write_parquet([samples[0], samples[1], samples[0], samples[2]], tmp_path / "t.parquet")
    path = tmp_path / "t.parquet"
    whole = [(r.image_id, getattr(r, "reason", None)) for r in iter_table(path, "parquet")]
    assert whole == [("s000", None), ("s001", None), ("s000", "duplicate-key"), ("s002", None)]
    plan = pieces(plan_pieces(path, "parquet", 2))  # the planner's key set, across pieces
    assert [(r.image_id, getattr(r, "reason", None)) for p in plan for r in read_piece(p)] == whole
    (first, again) = (list(read_piece(p)) for p in pieces(plan_pieces(path, "parquet", 3)))
    assert [getattr(r, "reason", None) for r in first] == [None, None, "duplicate-key"]
    assert first[2].detail == f"first at {path}#0, again at {path}#2"  # type: ignore[union-attr]


# --------------------------------------------------------------------------- WebDataset


def wds_corpus(tmp_path: Path) -> str:
    """Six shards: good ones, a truncated one, one that is not a tar, one missing."""
    samples = tiny(10)
    pattern = write_wds(samples, tmp_path, per_shard=2)  # 00000..00004
    data = (tmp_path / "00001.tar").read_bytes()
    with tarfile.open(tmp_path / "00001.tar") as tar:
        cut = tar.getmember("s003.jpg").offset_data + 10
    (tmp_path / "00001.tar").write_bytes(data[:cut])
    (tmp_path / "00003.tar").write_bytes(b"not a tar" * 200)
    assert pattern.endswith("{00000..00004}.tar")
    return pattern.replace("00004}", "00005}")


def test_wds_pieces_read_like_the_whole_stream(tmp_path: Path) -> None:
    pattern = wds_corpus(tmp_path)
    whole = list(iter_wds(pattern))
    assert [r.image_id for r in whole if isinstance(r, ImageRecord)] == [
        "s000",
        "s001",
        "s002",
        "s004",
        "s005",
        "s008",
        "s009",
    ]
    assert [(Path(s.image_id).name, s.reason) for s in whole if isinstance(s, Status)] == [
        ("00001.tar", "bad-shard"),
        ("00003.tar", "bad-shard"),
        ("00005.tar", "missing-file"),
    ]
    for rows_per_piece in SIZES:  # one piece per tar whatever the size
        plan = list(plan_pieces(pattern, "wds", rows_per_piece))
        assert plan == [InputPiece("wds", str(tmp_path / f"{i:05d}.tar"), i) for i in range(6)]
        assert by_pieces(pattern, "wds", rows_per_piece) == whole


def test_wds_planning_reads_each_tar_once_for_its_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner opens each tar once (its headers: the keys it repeats across tars, see
    ``test_corpus_keys.py``); a missing one or one that is not a tar is left to its worker."""
    pattern = wds_corpus(tmp_path)
    opened: list[str] = []
    real = fs.open_file

    def counted(path: str, *args: object, **kwargs: object) -> object:
        opened.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr("counterfactual.fs.open_file", counted)
    assert len(list(plan_pieces(pattern, "wds", 1))) == 6
    assert sorted(opened) == sorted(set(opened)) and len(opened) >= 5


# --------------------------------------------------------------------------- on S3


def strip_paths(rows: list[ImageRecord | Status]) -> list[ImageRecord | Status]:
    """Records without the path strings that differ between a local and a remote copy."""
    out: list[ImageRecord | Status] = []
    for row in rows:
        if isinstance(row, ImageRecord):
            source = row.source and msgspec.structs.replace(row.source, path="")
            out.append(dataclasses.replace(row, root=None, source=source))
        else:
            out.append(dataclasses.replace(row, image_id=Path(row.image_id).name, detail=""))
    return out


def test_s3_wds_corpus_reads_like_the_local_copy(tmp_path: Path, s3: object) -> None:
    pattern = wds_corpus(tmp_path / "local")
    bucket = s3.bucket()  # type: ignore[attr-defined]
    s3.upload(tmp_path / "local", f"{bucket}/shards")  # type: ignore[attr-defined]
    remote = f"{bucket}/shards/{{00000..00005}}.tar"
    assert expand_pattern(f"{bucket}/shards/0000[0-2].tar") == [
        f"{bucket}/shards/0000{i}.tar" for i in range(3)
    ]
    rows = by_pieces(remote, "wds", 3)
    assert strip_paths(rows) == strip_paths(list(iter_wds(pattern)))
    assert strip_paths(list(iter_wds(remote))) == strip_paths(rows)
    records = [r for r in rows if isinstance(r, ImageRecord)]
    assert records[0].file == "00000.tar/s000.jpg"
    for record in records:
        assert isinstance(record.source, TarMember)
        assert record.source.path.startswith(f"{bucket}/shards/")
        assert read_source(record.source) == tiny(10)[int(record.image_id[1:])][1]
    with pytest.raises(SampleError) as err:
        read_source(msgspec.structs.replace(records[0].source, size=10**6))  # type: ignore[arg-type]
    assert err.value.reason == "read-error"
    with pytest.raises(SampleError) as err:
        read_source(TarMember(f"{bucket}/shards/gone.tar", 0, 1))
    assert err.value.reason == "missing-file"


@pytest.mark.parametrize("images_as", ["bytes", "struct", "paths"])
def test_s3_parquet_reads_like_the_local_copy(tmp_path: Path, s3: object, images_as: str) -> None:
    pattern = parquet_corpus(tmp_path / "local", images_as)
    bucket = s3.bucket()  # type: ignore[attr-defined]
    s3.upload(tmp_path / "local", f"{bucket}/t")  # type: ignore[attr-defined]
    local = by_pieces(pattern, "parquet", 3, images=tmp_path / "local" / "images")
    rows = by_pieces(f"{bucket}/t/p*.parquet", "parquet", 3, images=f"{bucket}/t/images")
    assert strip_paths(rows) == strip_paths(local) and len(rows) == 12
    for record in rows:
        if isinstance(record, ImageRecord):
            if images_as == "paths":
                assert record.root == f"{bucket}/t/images" and record.file.endswith(".jpg")
                continue
            assert isinstance(record.source, ParquetCell)
            assert read_source(record.source) == tiny(12)[int(record.image_id[1:])][1]
    if images_as == "bytes":
        gone = ParquetCell(f"{bucket}/t/gone.parquet", 0, 0, "image")
        with pytest.raises(SampleError) as err:
            read_source(gone)
        assert err.value.reason == "missing-file"


def test_s3_csv_with_images_on_s3_reads_like_the_local_copy(tmp_path: Path, s3: object) -> None:
    local = tmp_path / "local"
    local.mkdir()
    for i, text in enumerate(TRICKY_CSV):
        (local / f"t{i}.csv").write_bytes(text.encode())
    write_csv(tiny(3), local / "t3.csv", local / "images")
    write_pictures(tiny(3), local / "images")
    bucket = s3.bucket()  # type: ignore[attr-defined]
    s3.upload(local, f"{bucket}/c")  # type: ignore[attr-defined]
    images = f"{bucket}/c/images"
    for size in (1, 7):
        rows = by_pieces(f"{bucket}/c/t*.csv", "csv", size, images=images)
        want = list(iter_table(local / "t*.csv", "csv", images=local / "images"))
        assert strip_paths(rows) == strip_paths(want) and len(rows) == 20
    records = [r for r in rows if isinstance(r, ImageRecord) and r.image_id.startswith("s")]
    assert [(r.root, r.file) for r in records] == [(images, f"s00{i}.jpg") for i in range(3)]
    # a URL cell inside the images folder is accepted like an absolute path inside it
    (tmp_path / "u.csv").write_text(f"key,caption,image\nu,x,{images}/s000.jpg\nv,y,/etc/p\n")
    s3.upload(tmp_path / "u.csv", f"{bucket}/c/u.csv")  # type: ignore[attr-defined]
    record, status = iter_table(f"{bucket}/c/u.csv", "csv", images=images)
    assert isinstance(record, ImageRecord) and (record.image_id, record.file) == ("u", "s000.jpg")
    assert isinstance(status, Status) and (status.image_id, status.reason) == ("v", "unsafe-path")
