"""Box-less corpora: WebDataset shards, Parquet and CSV tables read as records (headers only),
their pictures read back through ``read_source``, and every failure reason."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from arrays import random_image

from counterfactual.imageio import SampleError, decode_rgb, encode_jpeg, load_rgb
from counterfactual.readers.corpus import (
    expand_pattern,
    iter_table,
    iter_wds,
    read_source,
    read_table,
    read_wds,
)
from counterfactual.records import Caption, ImageRecord, ParquetCell, Status, TarMember
from counterfactual.testing.corpora import (
    Sample,
    demo_samples,
    write_csv,
    write_parquet,
    write_shard,
    write_wds,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> list[Sample]:
    pytest.importorskip("skimage")
    return demo_samples(tmp_path_factory.mktemp("demo"))


def tiny(n: int, prefix: str = "s") -> list[Sample]:
    """``n`` small noise JPEGs keyed ``s000``, ``s001``, ... with captions ``caption 0``, ..."""
    return [
        (f"{prefix}{i:03d}", encode_jpeg(random_image(8, 12, seed=i)), f"caption {i}", {"i": i})
        for i in range(n)
    ]


def records(rows: list[ImageRecord | Status]) -> list[ImageRecord]:
    return [r for r in rows if isinstance(r, ImageRecord)]


def statuses(rows: list[ImageRecord | Status]) -> list[Status]:
    return [r for r in rows if isinstance(r, Status)]


def touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_members(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar with exactly these members, in this order."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


# --------------------------------------------------------------------------- expand_pattern


def test_expand_pattern_keeps_brace_order_and_sorts_globs(tmp_path: Path) -> None:
    for name in ("a/2.tar", "a/1.tar", "b/9.tar", "b/0.tar", "b/0.txt", "00000.tar", "00001.tar"):
        touch(tmp_path / name)
    (tmp_path / "a" / "dir.tar").mkdir()  # a folder that a glob matches is not a file
    assert expand_pattern(tmp_path / "{b,a}/*.tar") == [
        tmp_path / p for p in ("b/0.tar", "b/9.tar", "a/1.tar", "a/2.tar")
    ]
    assert expand_pattern(f"{tmp_path}/{{00001,00000}}.tar") == [
        tmp_path / "00001.tar",
        tmp_path / "00000.tar",
    ]
    assert expand_pattern(f"{tmp_path}/{{00000..00002}}.tar") == [
        tmp_path / f"0000{i}.tar" for i in range(3)
    ]  # 00002.tar is missing: kept, the reader reports it
    assert expand_pattern(f"{tmp_path}/b/[0-5].t?r") == [tmp_path / "b/0.tar"]


@pytest.mark.parametrize("pattern", ["nothing-*.tar", "{0..3}.tar", "missing.tar", "a/*.tar"])
def test_expand_pattern_without_a_match_names_the_pattern(tmp_path: Path, pattern: str) -> None:
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="no file matches") as err:
        expand_pattern(tmp_path / pattern)
    assert str(tmp_path / pattern) in str(err.value)


# --------------------------------------------------------------------------- WebDataset


def test_wds_round_trip(tmp_path: Path, demo: list[Sample]) -> None:
    pattern = write_wds(demo, tmp_path / "shards", per_shard=3)
    assert pattern == f"{tmp_path / 'shards'}/{{00000..00002}}.tar"
    dataset = read_wds(pattern)
    assert dataset.name == "wds" and dataset.failures == () and dataset.class_names == ()
    assert [r.image_id for r in dataset.records] == [s[0] for s in demo]
    for i, (record, (key, picture, caption, _)) in enumerate(
        zip(dataset.records, demo, strict=True)
    ):
        shard = tmp_path / "shards" / f"{i // 3:05d}.tar"
        assert record.file == f"{shard.name}/{key}.jpg"
        assert record.captions == (Caption("0", caption),)
        assert (record.width, record.height, record.objects) == (0, 0, ())
        assert (record.root, record.split, record.dataset) == (None, None, "wds")
        assert isinstance(record.source, TarMember)
        assert record.source.path == str(shard.absolute()) and record.source.size == len(picture)
        assert read_source(record.source) == picture
    # the pixels a worker decodes are the original file's
    first = dataset.records[0]
    original = tmp_path / "demo-check.jpg"
    original.write_bytes(demo[0][1])
    assert np.array_equal(decode_rgb(read_source(first.source)), load_rgb(original))


def test_wds_keys_match_webdatasets_own_loader(tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset")
    samples = tiny(7)
    pattern = write_wds(samples, tmp_path, per_shard=3)
    extra = write_members(
        tmp_path / "00003.tar",
        [
            ("__meta__", b"{}"),  # top-level metadata, skipped
            ("part/x.y.jpg", samples[0][1]),  # key part/x, field y.jpg (no picture field)
            ("part/x.y.txt", b"multi-dot"),
            ("part/z.JPG", samples[1][1]),  # fields are lower-cased
            ("part/z.txt", b"upper"),
            ("noext", b"skipped: no dot"),
        ],
    )
    assert pattern == f"{tmp_path}/{{00000..00002}}.tar" and extra.exists()
    full = f"{tmp_path}/{{00000..00003}}.tar"
    ours = list(iter_wds(full))
    loader = wds.WebDataset(full, shardshuffle=False)
    theirs = [(s["__key__"], s.get("jpg")) for s in loader]
    assert [r.image_id for r in ours] == [k for k, _ in theirs]
    assert [r.image_id for r in records(ours)] == [s[0] for s in samples] + ["part/z"]
    assert [s.reason for s in statuses(ours)] == ["missing-image"]  # part/x: y.jpg, y.txt
    for record, (_, picture) in zip(
        records(ours), [t for t in theirs if t[0] != "part/x"], strict=True
    ):
        assert read_source(record.source) == picture  # type: ignore[arg-type]
    assert records(ours)[-1].file == "00003.tar/part/z.JPG"
    assert records(ours)[-1].captions == (Caption("0", "upper"),)


def test_wds_picture_field_priority_and_caption_sources(tmp_path: Path) -> None:
    jpg, png = b"JPG-bytes", b"PNG-bytes"
    shard = write_members(
        tmp_path / "0.tar",
        [
            ("a.png", png),
            ("a.jpg", jpg),  # jpg wins over png whatever the order
            ("a.txt", "  café au lait \n".encode()),
            ("a.json", b'{"caption": "ignored: txt wins"}'),
            ("b.webp", b"WEBP"),
            ("b.json", b'{"caption": " from json "}'),  # no txt: json caption
            ("c.jpeg", b"JPEG"),
            ("c.txt", b"   "),  # blank txt: falls back to json, which has none
            ("c.json", b'{"url": "http://x"}'),
            ("d.jpg", jpg),  # no caption at all
            ("e.png", png),
            ("e.txt", b"txt present"),
            ("e.json", b"{not json"),  # ignored: the caption comes from txt
        ],
    )
    rows = list(iter_wds(shard))
    assert statuses(rows) == []
    by_id = {r.image_id: r for r in records(rows)}
    assert [by_id[k].file for k in "abcde"] == [
        "0.tar/a.jpg",
        "0.tar/b.webp",
        "0.tar/c.jpeg",
        "0.tar/d.jpg",
        "0.tar/e.png",
    ]
    assert read_source(by_id["a"].source) == jpg  # type: ignore[arg-type]
    assert by_id["a"].captions == (Caption("0", "café au lait"),)
    assert by_id["b"].captions == (Caption("0", "from json"),)
    assert by_id["c"].captions == by_id["d"].captions == ()
    assert by_id["e"].captions == (Caption("0", "txt present"),)


def test_wds_bad_metadata_only_when_the_caption_comes_from_it(tmp_path: Path) -> None:
    shard = write_members(
        tmp_path / "0.tar",
        [
            ("a.jpg", b"x"),
            ("a.json", b"{broken"),
            ("b.jpg", b"x"),
            ("b.json", b"[1, 2]"),
            ("c.jpg", b"x"),
            ("c.txt", b"\xff\xfe not utf-8"),
            ("d.jpg", b"x"),
            ("d.txt", b"fine"),
        ],
    )
    rows = list(iter_wds(shard))
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [
        ("a", "bad-metadata"),
        ("b", "bad-metadata"),
        ("c", "bad-metadata"),
    ]
    assert "a.json" in statuses(rows)[0].detail and "c.txt" in statuses(rows)[2].detail
    assert [r.image_id for r in records(rows)] == ["d"]


def test_wds_missing_image(tmp_path: Path) -> None:
    samples = tiny(3)
    samples[1] = (samples[1][0], None, samples[1][2], {})
    dataset = read_wds(write_wds(samples, tmp_path, per_shard=3))
    assert [r.image_id for r in dataset.records] == ["s000", "s002"]
    (failure,) = dataset.failures
    assert (failure.image_id, failure.status, failure.reason) == ("s001", "failed", "missing-image")
    assert "json" in failure.detail and "txt" in failure.detail


def test_wds_duplicate_keys_across_and_within_shards(tmp_path: Path) -> None:
    samples = tiny(4)
    write_shard(samples[:2], tmp_path / "00000.tar")
    write_shard([samples[2], samples[0], samples[3]], tmp_path / "00001.tar")
    write_shard([samples[3]], tmp_path / "00002.tar")
    write_members(tmp_path / "00003.tar", [("x.jpg", b"1"), ("y.jpg", b"2"), ("x.jpg", b"3")])
    write_members(tmp_path / "00004.tar", [("z.jpg", b"1"), ("z.jpg", b"2")])  # same field twice
    dataset = read_wds(f"{tmp_path}/{{00000..00004}}.tar")
    assert [r.image_id for r in dataset.records] == ["s000", "s001", "s002", "s003", "x", "y", "z"]
    assert [r.file for r in dataset.records][-3:] == [
        "00003.tar/x.jpg",
        "00003.tar/y.jpg",
        "00004.tar/z.jpg",
    ]
    got = [(f.image_id, f.reason, f.detail) for f in dataset.failures]
    shard = [str(tmp_path / f"0000{i}.tar") for i in range(5)]
    assert got == [
        ("s000", "duplicate-key", f"first in {shard[0]}, again in {shard[1]}"),
        ("s003", "duplicate-key", f"first in {shard[1]}, again in {shard[2]}"),
        ("x", "duplicate-key", f"first in {shard[3]}, again in {shard[3]}"),
        ("z", "duplicate-key", f"first in {shard[4]}, again in {shard[4]}"),
    ]
    # the kept x is the first one
    assert read_source(dataset.records[4].source) == b"1"  # type: ignore[arg-type]


def _member_offsets(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.mark.parametrize("where", ["picture data", "a header", "the last member's padding"])
def test_wds_truncated_shard_keeps_what_was_read(tmp_path: Path, where: str) -> None:
    samples = tiny(3)
    shard = tmp_path / "00000.tar"
    write_shard(samples, shard)
    members = _member_offsets(shard)
    data = shard.read_bytes()
    if where == "picture data":  # the middle of the 2nd sample's jpg
        cut = members["s001.jpg"].offset_data + members["s001.jpg"].size // 2
        expected = ["s000"]
    elif where == "a header":  # the middle of the 2nd sample's json header
        cut = members["s001.json"].offset + 100
        expected = ["s000"]
    else:  # inside the padding after the 3rd sample's txt data
        last = members["s002.txt"]
        cut = last.offset_data + last.size + 1
        expected = ["s000", "s001"]
    shard.write_bytes(data[:cut])
    rows = list(iter_wds(shard))
    assert [r.image_id for r in records(rows)] == expected
    assert isinstance(rows[-1], Status)
    assert (rows[-1].image_id, rows[-1].reason) == (str(shard), "bad-shard")
    assert len(statuses(rows)) == 1
    if where != "the last member's padding":
        assert "'s001' was incomplete" in rows[-1].detail
    else:
        assert "'s002' was incomplete" in rows[-1].detail


def test_wds_shard_cut_between_samples_without_end_marker_is_accepted(tmp_path: Path) -> None:
    # tar writers that omit the end-of-archive blocks exist; webdataset reads such shards too
    samples = tiny(2)
    shard = tmp_path / "00000.tar"
    write_shard(samples, shard)
    first_of_second = _member_offsets(shard)["s001.jpg"].offset
    shard.write_bytes(shard.read_bytes()[:first_of_second])
    dataset = read_wds(shard)
    assert [r.image_id for r in dataset.records] == ["s000"] and dataset.failures == ()


def test_wds_missing_compressed_and_garbage_shards(tmp_path: Path) -> None:
    samples = tiny(4)
    pattern = write_wds(samples, tmp_path, per_shard=1)  # 00000..00003
    (tmp_path / "00001.tar").unlink()
    gz = tmp_path / "00002.tar"
    gz.write_bytes(gzip.compress(gz.read_bytes()))
    (tmp_path / "00003.tar").write_bytes(b"not a tar at all" * 100)
    rows = list(iter_wds(pattern))
    assert [r.image_id for r in records(rows)] == ["s000"]
    got = [(s.image_id, s.reason) for s in statuses(rows)]
    assert got == [
        (str(tmp_path / "00001.tar"), "missing-file"),
        (str(tmp_path / "00002.tar"), "bad-shard"),
        (str(tmp_path / "00003.tar"), "bad-shard"),
    ]
    assert "gzip" in statuses(rows)[1].detail


def test_wds_reader_never_decodes_pictures(tmp_path: Path) -> None:
    shard = write_members(tmp_path / "0.tar", [("a.jpg", b"\x00garbage" * 1000), ("a.txt", b"hi")])
    (record,) = read_wds(shard).records
    assert record.captions == (Caption("0", "hi"),)
    with pytest.raises(SampleError) as err:
        decode_rgb(read_source(record.source))  # type: ignore[arg-type]
    assert err.value.reason == "decode-error"


def test_read_source_tar_member_errors(tmp_path: Path) -> None:
    shard = write_members(tmp_path / "0.tar", [("a.jpg", b"abc")])
    (record,) = read_wds(shard).records
    source = record.source
    assert isinstance(source, TarMember) and read_source(source) == b"abc"
    with pytest.raises(SampleError) as err:
        read_source(TarMember(source.path, source.offset, shard.stat().st_size))
    assert err.value.reason == "read-error"
    shard.unlink()
    with pytest.raises(SampleError) as err:
        read_source(source)
    assert err.value.reason == "missing-file"


# --------------------------------------------------------------------------- Parquet and CSV


@pytest.mark.parametrize("images_as", ["bytes", "struct"])
def test_parquet_pictures_in_the_table_round_trip(
    tmp_path: Path, demo: list[Sample], images_as: str
) -> None:
    tables = [
        write_parquet(demo[:5], tmp_path / "part-0.parquet", images_as, row_group_size=2),
        write_parquet(demo[5:], tmp_path / "part-1.parquet", images_as, row_group_size=2),
    ]
    dataset = read_table(tmp_path / "part-*.parquet", "parquet")
    assert dataset.name == "parquet" and dataset.failures == ()
    assert [r.image_id for r in dataset.records] == [s[0] for s in demo]
    for i, (record, (_, picture, caption, _)) in enumerate(zip(dataset.records, demo, strict=True)):
        table, row = (tables[0], i) if i < 5 else (tables[1], i - 5)
        assert record.file == f"{table.name}#{row}"
        assert record.source == ParquetCell(str(table.absolute()), row // 2, row % 2, "image")
        assert record.captions == (Caption("0", caption),)
        assert (record.root, record.dataset, record.width, record.objects) == (
            None,
            "parquet",
            0,
            (),
        )
        assert read_source(record.source) == picture
    original = tmp_path / "original.jpg"
    original.write_bytes(demo[6][1])
    assert np.array_equal(decode_rgb(read_source(dataset.records[6].source)), load_rgb(original))


def test_parquet_and_csv_paths_round_trip(tmp_path: Path, demo: list[Sample]) -> None:
    images = tmp_path / "pictures"
    write_parquet(demo, tmp_path / "t.parquet", "paths", images_folder=images)
    write_csv(demo, tmp_path / "t.csv", images)
    for kind in ("parquet", "csv"):
        dataset = read_table(tmp_path / f"t.{kind}", kind, images=images)
        assert dataset.name == kind and dataset.failures == ()
        assert [r.image_id for r in dataset.records] == [s[0] for s in demo]
        for record, (key, picture, caption, _) in zip(dataset.records, demo, strict=True):
            assert (record.file, record.root, record.source) == (f"{key}.jpg", images, None)
            assert record.captions == (Caption("0", caption),) and record.dataset == kind
            assert (record.root / record.file).read_bytes() == picture


def test_table_paths_default_to_the_tables_folder(tmp_path: Path) -> None:
    samples = tiny(2)
    write_csv(samples, tmp_path / "data" / "t.csv", tmp_path / "data")
    dataset = read_table(tmp_path / "data" / "t.csv", "csv")
    assert [(r.file, r.root) for r in dataset.records] == [
        ("s000.jpg", tmp_path / "data"),
        ("s001.jpg", tmp_path / "data"),
    ]


def test_table_columns_by_name_and_id_fallback(tmp_path: Path) -> None:
    table = pa.table(
        {
            "TEXT": ["one", None, "  ", "four"],
            "filepath": ["a.jpg", "b.jpg", "c.jpg", "d.jpg"],
            "other": ["x", "y", "z", "w"],
        }
    )
    pq.write_table(table, tmp_path / "laion.parquet", row_group_size=3)
    dataset = read_table(tmp_path / "laion.parquet", "parquet")
    assert [r.image_id for r in dataset.records] == [f"laion-{i:08d}" for i in range(4)]
    assert [r.captions for r in dataset.records] == [
        (Caption("0", "one"),),
        (),
        (),
        (Caption("0", "four"),),
    ]
    assert [r.file for r in dataset.records] == ["a.jpg", "b.jpg", "c.jpg", "d.jpg"]
    named = read_table(
        tmp_path / "laion.parquet",
        "parquet",
        caption_column="other",
        image_column="filepath",
        id_column="TEXT",
    )
    # an empty id cell falls back to the row's own id
    assert [r.image_id for r in named.records] == ["one", "laion-00000001", "  ", "four"]
    assert [r.captions[0].text for r in named.records] == ["x", "y", "z", "w"]


def test_csv_columns_and_empty_cells(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        'id,text,file_name,extra\n1,"a, quoted ""caption""",a.jpg,x\n\n2,,b.jpg\n3,no image,,\n',
        encoding="utf-8",
    )
    rows = list(iter_table(path, "csv"))
    assert [(r.image_id, r.file, r.captions) for r in records(rows)] == [
        ("1", "a.jpg", (Caption("0", 'a, quoted "caption"'),)),
        ("2", "b.jpg", ()),
    ]
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [("3", "missing-image")]


def test_table_null_images_and_hf_structs(tmp_path: Path) -> None:
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = [
        {"bytes": b"JPEG", "path": "ignored.jpg"},  # bytes win
        {"bytes": None, "path": "sub/b.jpg"},  # a path only: a file
        None,  # no image
        {"bytes": None, "path": None},  # no image
        {"bytes": None, "path": "../escape.jpg"},
    ]
    table = pa.table(
        {"key": list("abcde"), "caption": list("ABCDE"), "image": pa.array(images, kind)}
    )
    pq.write_table(table, tmp_path / "hf.parquet", row_group_size=2)
    pq.write_table(
        pa.table(
            {
                "key": ["f", "g"],
                "caption": ["F", "G"],
                "jpg": pa.array([None, b"GG"], pa.binary()),
            }
        ),
        tmp_path / "img2dataset.parquet",
    )
    rows = list(iter_table(tmp_path / "{hf,img2dataset}.parquet", "parquet"))
    got = {r.image_id: r for r in records(rows)}
    assert list(got) == ["a", "b", "g"]
    assert got["a"].source == ParquetCell(str((tmp_path / "hf.parquet").absolute()), 0, 0, "image")
    assert read_source(got["a"].source) == b"JPEG"
    assert (got["b"].file, got["b"].root, got["b"].source) == ("sub/b.jpg", tmp_path, None)
    assert got["g"].source == ParquetCell(
        str((tmp_path / "img2dataset.parquet").absolute()), 0, 1, "jpg"
    )
    assert read_source(got["g"].source) == b"GG"
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [
        ("c", "missing-image"),
        ("d", "missing-image"),
        ("e", "unsafe-path"),
        ("f", "missing-image"),
    ]


def test_table_unsafe_and_absolute_paths(tmp_path: Path) -> None:
    images = tmp_path / "images"
    inside = images / "sub" / "x.jpg"
    cells = [
        str(inside),  # absolute inside the images folder: accepted, made relative
        str(images / "sub" / ".." / "y.jpg"),  # still inside once normalised
        str(tmp_path / "outside.jpg"),
        "/etc/passwd",
        "../images/x.jpg",
        "a/../../x.jpg",
        "C:\\pictures\\x.jpg",
        "http://example.com/x.jpg",
        "",
        str(images),
    ]
    keys = [f"k{i}" for i in range(len(cells))]
    pq.write_table(
        pa.table({"id": keys, "caption": ["c"] * len(cells), "path": cells}), tmp_path / "t.parquet"
    )
    rows = list(iter_table(tmp_path / "t.parquet", "parquet", images=images))
    assert [(r.image_id, r.file, r.root) for r in records(rows)] == [
        ("k0", "sub/x.jpg", images),
        ("k1", "y.jpg", images),
    ]
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [
        (k, "unsafe-path") for k in keys[2:]
    ]
    assert statuses(rows)[1].detail == repr("/etc/passwd")


def test_table_duplicate_ids_across_files(tmp_path: Path) -> None:
    samples = tiny(3)
    write_parquet(samples[:2], tmp_path / "a.parquet")
    write_parquet(samples[1:], tmp_path / "b.parquet")
    dataset = read_table(tmp_path / "*.parquet", "parquet")
    assert [r.image_id for r in dataset.records] == ["s000", "s001", "s002"]
    (dup,) = dataset.failures
    assert (dup.image_id, dup.reason) == ("s001", "duplicate-key")
    assert dup.detail == f"first at {tmp_path / 'a.parquet'}#1, again at {tmp_path / 'b.parquet'}#0"


def test_table_configuration_errors_are_raised_before_any_record(tmp_path: Path) -> None:
    samples = tiny(2)
    good = write_parquet(samples, tmp_path / "a.parquet")
    pq.write_table(pa.table({"caption": ["x"], "url": ["http://x"]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="no image column") as err:
        iter_table(tmp_path / "*.parquet", "parquet")  # b has none, a is never read
    assert "b.parquet" in str(err.value) and "'url'" in str(err.value)
    with pytest.raises(ValueError, match=r"no caption column 'TEXT'") as err:
        read_table(good, "parquet", caption_column="TEXT")
    assert "['key', 'caption', 'image']" in str(err.value) and str(good) in str(err.value)
    with pytest.raises(ValueError, match="no id column 'uid'"):
        read_table(good, "parquet", id_column="uid")
    pq.write_table(pa.table({"caption": ["x"], "image": [3]}), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match="has type int64"):
        read_table(tmp_path / "c.parquet", "parquet")
    pq.write_table(pa.table({"caption": [1], "image": ["a.jpg"]}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match="caption column 'caption' has type int64"):
        read_table(tmp_path / "d.parquet", "parquet")
    write_csv(samples, tmp_path / "t.csv", tmp_path)
    with pytest.raises(ValueError, match="no image column 'jpg'"):
        read_table(tmp_path / "t.csv", "csv", image_column="jpg")
    with pytest.raises(ValueError, match="table kind"):
        read_table(tmp_path / "t.csv", "tsv")


def test_unreadable_and_missing_tables(tmp_path: Path) -> None:
    samples = tiny(2)
    write_parquet(samples[:1], tmp_path / "0.parquet")
    (tmp_path / "1.parquet").write_bytes(b"PAR1 but not really parquet")
    write_parquet(samples[1:], tmp_path / "3.parquet")
    rows = list(iter_table(f"{tmp_path}/{{0,1,2,3}}.parquet", "parquet"))
    assert [r.image_id for r in records(rows)] == ["s000", "s001"]
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [
        (str(tmp_path / "1.parquet"), "bad-shard"),
        (str(tmp_path / "2.parquet"), "missing-file"),
    ]
    # a CSV that stops being UTF-8 part way: the rows decoded before are kept (text is decoded
    # in blocks, so how many depends on the block size; 1000 rows are more than one block)
    path = tmp_path / "t.csv"
    good = "".join(f"k{i:04d},ok,{i}.jpg\n" for i in range(1000)).encode()
    path.write_bytes(b"key,caption,image\n" + good + b"bad,\xff\xfe,b.jpg\n")
    rows = list(iter_table(path, "csv"))
    ids = [r.image_id for r in records(rows)]
    assert 0 < len(ids) < 1000 and ids == [f"k{i:04d}" for i in range(len(ids))]
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [(str(path), "bad-shard")]
    assert "UnicodeDecodeError" in rows[-1].detail  # type: ignore[union-attr]
    (tmp_path / "empty.csv").write_bytes(b"")
    assert [(s.image_id, s.reason) for s in iter_table(tmp_path / "empty.csv", "csv")] == [
        (str(tmp_path / "empty.csv"), "bad-shard")
    ]


def test_read_source_parquet_cell_errors_and_cache(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"image": pa.array([b"one", None], pa.binary())}), path)
    absolute = str(path.absolute())
    assert read_source(ParquetCell(absolute, 0, 0, "image")) == b"one"
    for cell in (
        ParquetCell(absolute, 0, 1, "image"),  # null
        ParquetCell(absolute, 0, 2, "image"),  # no such row
        ParquetCell(absolute, 1, 0, "image"),  # no such row group
        ParquetCell(absolute, 0, 0, "jpg"),  # no such column
    ):
        with pytest.raises(SampleError) as err:
            read_source(cell)
        assert err.value.reason == "read-error", cell
    # a rewritten file is read again, not served from the cache
    pq.write_table(pa.table({"image": pa.array([b"other bytes"], pa.binary())}), path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert read_source(ParquetCell(absolute, 0, 0, "image")) == b"other bytes"
    path.unlink()
    with pytest.raises(SampleError) as err:
        read_source(ParquetCell(absolute, 0, 0, "image"))
    assert err.value.reason == "missing-file"


def test_wds_json_extra_fields_are_written_like_img2dataset(tmp_path: Path) -> None:
    samples = tiny(1)
    shard = tmp_path / "0.tar"
    write_shard(samples, shard)
    with tarfile.open(shard) as tar:
        assert tar.getnames() == ["s000.jpg", "s000.json", "s000.txt"]
        meta = json.loads(tar.extractfile("s000.json").read())  # type: ignore[union-attr]
    assert meta == {"key": "s000", "caption": "caption 0", "i": 0}


def test_wds_oversized_text_member_is_not_read(tmp_path: Path) -> None:
    shard = write_members(
        tmp_path / "0.tar", [("a.jpg", b"x"), ("a.txt", b"w" * ((1 << 20) + 1)), ("b.jpg", b"y")]
    )
    rows = list(iter_wds(shard))
    assert [(s.image_id, s.reason) for s in statuses(rows)] == [("a", "bad-metadata")]
    assert "over the 1048576" in statuses(rows)[0].detail
    assert [r.image_id for r in records(rows)] == ["b"]


def test_parquet_reader_reads_picture_bytes_only_to_find_empty_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    samples = tiny(4)
    samples[3] = (samples[3][0], None, samples[3][2], {})
    write_parquet(samples, tmp_path / "t.parquet", "bytes", row_group_size=2)
    reads: list[tuple[int, list[str]]] = []
    original = pq.ParquetFile.read_row_group

    def spy(self: object, i: int, columns: list[str] | None = None, **kwargs: object) -> object:
        reads.append((i, list(columns or [])))
        return original(self, i, columns=columns, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    dataset = read_table(tmp_path / "t.parquet", "parquet")
    assert [r.image_id for r in dataset.records] == ["s000", "s001", "s002"]
    assert [(f.image_id, f.reason) for f in dataset.failures] == [("s003", "missing-image")]
    # row group 0 has no null picture (its statistics say so); row group 1 has one
    assert reads == [(0, ["key", "caption"]), (1, ["key", "caption", "image"])]
