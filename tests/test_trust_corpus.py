"""Issue 31, corpora: every file a corpus names (picture, caption, metadata, shard folder, tar,
table, image cell) resolves inside its root or its sample (or piece) fails ``unsafe-path``,
never read; a CSV cell of any size leaves the rows after it read; a repeated COCO annotation
id and a picture over ``--max-pixels`` say what they are. The readers in process (fast), then
each scenario through ``counterfactual synth --runner local`` as a user runs it (the four runs
share one process, ``main`` called once for each, each exit code checked)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import webdataset as wds
from one_child import main_in_one_child

from counterfactual.imageio import SampleError, load_rgb
from counterfactual.readers.coco import read_coco
from counterfactual.readers.coco_boxes import read_coco_boxes
from counterfactual.readers.corpus import MAX_TEXT_BYTES, iter_corpus, plan_pieces, read_piece
from counterfactual.readers.flickr30k import read_flickr30k
from counterfactual.readers.generate import generate_coco
from counterfactual.records import ImageRecord, Status
from counterfactual.testing import build_tiny_owlv2
from counterfactual.testing.corpora import (
    demo_samples,
    write_parquet,
    write_pictures,
    write_shard,
)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "SECRET-OUTSIDE"
SECRET_URL = "http://secret.example/leak.jpg"


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return demo_samples(tmp_path_factory.mktemp("demo"), shrink=4)


@pytest.fixture
def outside(tmp_path, samples) -> Path:
    return _outside(tmp_path / "outside", samples)


def _outside(out: Path, samples) -> Path:
    """A folder beside the corpus with what no corpus may read: a caption, a json with a url,
    a picture, a shard folder, a tar and a table."""
    out.mkdir()
    (out / "secret.txt").write_text(f"{SECRET} a dog and a person.")
    (out / "secret.json").write_text(json.dumps({"url": SECRET_URL, "caption": SECRET}))
    (out / "outside.jpg").write_bytes(samples[0][1])
    (out / "shard").mkdir()
    (out / "shard" / "z.jpg").write_bytes(samples[0][1])
    (out / "shard" / "z.txt").write_text(f"{SECRET} z")
    write_shard([("zz", samples[0][1], f"{SECRET} zz", {})], out / "evil.tar")
    with open(out / "evil.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["key", "caption", "image"], ["zz", SECRET, "x.jpg"]])
    return out


def _split(rows) -> tuple[dict[str, ImageRecord], dict[str, Status]]:
    rows = list(rows)
    records = {r.image_id: r for r in rows if isinstance(r, ImageRecord)}
    statuses = {s.image_id: s for s in rows if isinstance(s, Status)}
    assert len(records) + len(statuses) == len(rows)
    return records, statuses


def _files_corpus(root: Path, samples, outside: Path) -> Path:
    """img2dataset's files output: shard 00000 with the demo samples and four hostile ones,
    shard 00001 a link to a folder outside, metadata 00000.parquet a link out."""
    shard = root / "00000"
    shard.mkdir(parents=True)
    for key, picture, caption, _ in samples:
        (shard / f"{key}.jpg").write_bytes(picture)
        (shard / f"{key}.txt").write_text(caption)
    for key in ("txtout", "jsonout", "jpgout", "inlink"):
        (shard / f"{key}.jpg").write_bytes(samples[1][1])
    os.symlink(outside / "secret.txt", shard / "txtout.txt")
    os.symlink(outside / "secret.json", shard / "jsonout.json")
    (shard / "jpgout.jpg").unlink()
    os.symlink(outside / "outside.jpg", shard / "jpgout.jpg")
    (shard / "jpgout.txt").write_text(samples[0][2])
    os.symlink(shard / f"{samples[2][0]}.txt", shard / "inlink.txt")  # stays inside: fine
    os.symlink(outside / "shard", root / "00001")
    os.symlink(outside / "secret.json", root / "00000.parquet")
    return root


HOSTILE_FILES = {"txtout", "jsonout", "jpgout"}


def test_files_corpus_refuses_every_link_out(tmp_path, samples, outside):
    corpus = _files_corpus(tmp_path / "files", samples, outside)
    records, statuses = _split(iter_corpus(corpus, "files"))
    assert {k for k, s in statuses.items() if s.reason == "unsafe-path"} == HOSTILE_FILES | {
        str(corpus / "00001"),
        str(corpus / "00000.parquet"),
    }
    assert statuses["txtout"].detail.startswith("00000/txtout.txt: resolves outside")
    assert set(records) == {s[0] for s in samples} | {"inlink"}
    assert records["inlink"].captions[0].text == samples[2][2]
    assert SECRET not in repr((records, statuses)) and SECRET_URL not in repr(records)


def test_wds_folder_refuses_a_tar_linked_out(tmp_path, samples, outside):
    corpus = tmp_path / "wds"
    (corpus / "sub").mkdir(parents=True)
    write_shard(samples[:2], corpus / "00000.tar")
    write_shard(samples[2:4], corpus / "sub" / "real.tar")
    os.symlink(corpus / "sub" / "real.tar", corpus / "00001.tar")  # inside: read
    os.symlink(outside / "evil.tar", corpus / "00002.tar")
    records, statuses = _split(iter_corpus(corpus, "wds"))
    assert set(records) == {s[0] for s in samples[:4]}
    assert [(k, s.reason) for k, s in statuses.items()] == [
        (str(corpus / "00002.tar"), "unsafe-path")
    ]
    # the same through the pieces a run plans: the piece index keeps its place in the pattern
    plan = list(plan_pieces(corpus, "wds", 10))
    assert [p.index for p in plan if not isinstance(p, Status)] == [0, 1]
    assert [p.reason for p in plan if isinstance(p, Status)] == ["unsafe-path"]


def _table_rows(samples, images: Path, outside: Path) -> list[list[str]]:
    """The demo rows, then a ``../`` cell, an absolute cell and a cell naming a link out."""
    names = write_pictures(samples, images)
    os.symlink(outside / "outside.jpg", images / "linkout.jpg")
    rows = [[k, c, n] for (k, _, c, _), n in zip(samples, names, strict=True)]
    rows += [
        ["dotdot", samples[0][2], "../outside/outside.jpg"],
        ["absolute", samples[0][2], str(outside / "outside.jpg")],
        ["linkout", samples[0][2], "linkout.jpg"],
    ]
    return rows


TABLE_HOSTILE = {"dotdot", "absolute", "linkout"}


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_tables_refuse_image_cells_and_tables_out(tmp_path, samples, outside, kind):
    corpus = tmp_path / "tables"
    corpus.mkdir()
    rows = _table_rows(samples, corpus, outside)
    if kind == "csv":
        with open(corpus / "t.csv", "w", newline="") as fh:
            csv.writer(fh).writerows([["key", "caption", "image"], *rows])
        os.symlink(outside / "evil.csv", corpus / "u.csv")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = list(zip(*rows, strict=True))
        names = ("key", "caption", "image")
        pq.write_table(pa.table(dict(zip(names, columns, strict=True))), corpus / "t.parquet")
        write_parquet([("zz", None, SECRET, {})], outside / "evil.parquet")
        os.symlink(outside / "evil.parquet", corpus / "u.parquet")
    records, statuses = _split(iter_corpus(corpus, kind))
    assert set(records) == {s[0] for s in samples}
    unsafe = {k for k, s in statuses.items() if s.reason == "unsafe-path"}
    assert unsafe == TABLE_HOSTILE | {str(corpus / f"u.{kind}")}
    assert SECRET not in repr(statuses)


def _long_csv(path: Path, samples, images: Path, sizes: dict[str, int]) -> None:
    """A CSV of the demo rows, with a caption cell of ``sizes[key]`` bytes replacing the
    caption of those rows (a quoted cell with commas and newlines in it)."""
    names = write_pictures(samples, images)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["key", "caption", "image"])
        for (key, _, caption, _), name in zip(samples, names, strict=True):
            if key in sizes:
                chunk = "a dog, a cat\nand a person. "
                caption = (chunk * (sizes[key] // len(chunk) + 1))[: sizes[key]]
            writer.writerow([key, caption, name])


def test_csv_cell_over_pythons_field_limit_keeps_the_rows_after_it(tmp_path, samples):
    big = samples[1][0]
    _long_csv(tmp_path / "t.csv", samples, tmp_path, {big: 200_000})
    records, statuses = _split(iter_corpus(tmp_path / "t.csv", "csv"))
    assert set(records) == {s[0] for s in samples} and not statuses
    assert len(records[big].captions[0].text) > 131_072  # csv.field_size_limit() by default
    # the byte scan cuts where the reader reads: one row per piece, each row whole
    pieces = list(plan_pieces(tmp_path / "t.csv", "csv", 1))
    assert len(pieces) == len(samples)
    per_piece = [_split(read_piece(p))[0] for p in pieces]
    assert [list(r) for r in per_piece] == [[s[0]] for s in samples]
    assert per_piece[1][big] == records[big]


@pytest.mark.slow
def test_csv_cell_of_100_mb_fails_its_row_alone(tmp_path, samples):
    big = samples[2][0]
    _long_csv(tmp_path / "t.csv", samples, tmp_path, {big: 100_000_000})
    for pieces in (list(plan_pieces(tmp_path / "t.csv", "csv", 3)), None):
        rows = iter_corpus(tmp_path / "t.csv", "csv") if pieces is None else None
        if pieces is not None:
            rows = [row for p in pieces for row in read_piece(p)]
        records, statuses = _split(rows)
        assert set(records) == {s[0] for s in samples} - {big}
        assert [(k, s.reason) for k, s in statuses.items()] == [(big, "bad-metadata")]
        assert f"caption of 100000000 bytes, over the {MAX_TEXT_BYTES}" in statuses[big].detail


def test_coco_repeated_annotation_id_fails_the_later_image(tmp_path):
    files = generate_coco(tmp_path, 4, seed=1)
    inst = json.loads(files.instances.read_text())
    anns = inst["annotations"]
    later = next(a for a in anns if a["image_id"] != anns[0]["image_id"])
    later["id"] = anns[0]["id"]
    files.instances.write_text(json.dumps(inst))
    assert read_coco_boxes(files.instances) is None  # the fast path hands it to read_coco
    ds = read_coco(files.instances, files.captions, files.images)
    failed = {s.image_id: s for s in ds.failures}
    assert list(failed) == [str(later["image_id"])]
    first = anns.index(anns[0])
    detail = f"annotations[{anns.index(later)}]: id {anns[0]['id']} is already annotations[{first}]"
    assert failed[str(later["image_id"])].reason == "duplicate-id"
    assert failed[str(later["image_id"])].detail.endswith(detail)
    assert str(anns[0]["image_id"]) in {r.image_id for r in ds.records}


def test_flickr_annotation_linked_out_is_unsafe(tmp_path, outside):
    root = tmp_path / "flickr"
    for folder in ("Annotations", "Sentences"):
        (root / folder).mkdir(parents=True)
    xml = "<annotation><size><width>10</width><height>10</height></size></annotation>"
    (root / "Annotations" / "1.xml").write_text(xml)
    (root / "Sentences" / "1.txt").write_text("[/EN#1/people A child] plays .\n")
    (outside / "2.xml").write_text(xml)
    os.symlink(outside / "2.xml", root / "Annotations" / "2.xml")
    os.symlink(outside / "secret.txt", root / "Sentences" / "2.txt")
    (root / "train.txt").write_text("1\n2\n")
    ds = read_flickr30k(root, split="train")
    assert [r.image_id for r in ds.records] == ["1"]
    assert [(s.image_id, s.reason) for s in ds.failures] == [("2", "unsafe-path")]


def test_image_too_large_names_max_pixels_and_the_size(tmp_path, samples):
    (tmp_path / "p.jpg").write_bytes(samples[0][1])
    width, height = samples[0][3]["width"], samples[0][3]["height"]
    with pytest.raises(SampleError) as err:
        load_rgb(tmp_path / "p.jpg", max_pixels=width * height - 1)
    expected = f"{width}x{height} = {width * height} pixels, over --max-pixels {width * height - 1}"
    assert (err.value.reason, err.value.detail) == ("image-too-large", expected)


# --- each scenario as a user runs it -----------------------------------------------------------


@pytest.fixture(scope="module")
def owl(tmp_path_factory):
    return build_tiny_owlv2(tmp_path_factory.mktemp("owl") / "owlv2", grid_boxes=True)


def _args(owl: Path, kind: str, root: Path, out: Path) -> list[str]:
    return [
        "synth", "--dataset", kind, "--root", str(root), "--out", str(out),
        "--detector-model", str(owl), "--detect-threshold", "0", "--detect-queries", "caption",
        "--image-method", "blur", "--images-per-shard", "4", "--contact-sheet", "0",
        "--runner", "local",
    ]  # fmt: skip


def _synth_each(owl: Path, runs: list[tuple[str, Path, Path]]) -> tuple[list[int], str]:
    """Several runs ``(kind, root, out)``, one after the other in one process (one interpreter
    start): each run's exit code, and the process's stderr."""
    argvs = [_args(owl, kind, root, out) for kind, root, out in runs]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return main_in_one_child(argvs, env, runs[0][2].parent, timeout=300)


def _outcome(out: Path) -> tuple[dict[str, dict], list[dict]]:
    """status.jsonl by image id (one row each), and the samples of the shards, read back with
    webdataset; nothing from outside the corpus in either."""
    text = (out / "status.jsonl").read_text()
    assert SECRET not in text and SECRET_URL not in text
    rows = [json.loads(line) for line in text.splitlines()]
    by_id = {r["image_id"]: r for r in rows}
    assert len(by_id) == len(rows)
    shards = sorted(str(p) for p in out.glob("shard-*.tar"))
    loaded = list(wds.WebDataset(shards, shardshuffle=False)) if shards else []
    for sample in loaded:
        assert SECRET.encode() not in sample["json"] + sample["txt"]
        assert SECRET_URL.encode() not in sample["json"]
    written = {r["key"] for r in rows if r["status"] == "written"}
    assert {s["__key__"] for s in loaded} == written
    return by_id, loaded


def _csv_corpus(corpus: Path, samples, outside: Path) -> Path:
    """The table rows in a CSV with two long cells, and a CSV linked out."""
    corpus.mkdir()
    rows = _table_rows(samples, corpus, outside)
    # row 1: a 200 KB cell (over csv's default field limit) in a column the run does not use,
    # so that the tiny detector is not fed 200 KB of caption; row 2: a caption over 1 MiB
    for i, row in enumerate(rows):
        row.append("a dog next to a person. " * 9000 if i == 1 else "")
    rows[2][1] = "a dog next to a person on a bench. " * 32000  # 1.1 MB
    with open(corpus / "t.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["key", "caption", "image", "notes"], *rows])
    os.symlink(outside / "evil.csv", corpus / "u.csv")
    return corpus


def _parquet_corpus(table: Path, samples, outside: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table.mkdir()
    columns = list(zip(*_table_rows(samples, table, outside), strict=True))
    names = ("key", "caption", "image")
    pq.write_table(pa.table(dict(zip(names, columns, strict=True))), table / "t.parquet")
    return table


def _wds_corpus(shards: Path, samples, outside: Path) -> Path:
    shards.mkdir()
    write_shard(samples, shards / "00000.tar")
    os.symlink(outside / "evil.tar", shards / "00001.tar")
    return shards


@pytest.fixture(scope="module")
def runs(owl, samples, tmp_path_factory) -> dict[str, tuple[Path, Path, int, str]]:
    """Each kind's hostile corpus (files, csv, parquet, wds; beside one folder ``outside``)
    run by ``synth``, all four one after the other in one process (the process is a means:
    what the tests check is each run's exit code and what it wrote):
    kind -> ``(corpus, out, exit code, the process's stderr)``."""
    root = tmp_path_factory.mktemp("runs")
    outside = _outside(root / "outside", samples)
    corpora = {
        "files": _files_corpus(root / "files", samples, outside),
        "csv": _csv_corpus(root / "csv", samples, outside),
        "parquet": _parquet_corpus(root / "parquet", samples, outside),
        "wds": _wds_corpus(root / "wds", samples, outside),
    }
    done = [(kind, corpus, root / f"out-{kind}") for kind, corpus in corpora.items()]
    codes, stderr = _synth_each(owl, done)
    return {
        kind: (corpus, out, code, stderr)
        for (kind, corpus, out), code in zip(done, codes, strict=True)
    }


@pytest.mark.slow
def test_files_corpus_run_reads_nothing_outside(runs, samples):
    corpus, out, code, stderr = runs["files"]
    assert code == 0, stderr
    by_id, loaded = _outcome(out)
    hostile = HOSTILE_FILES | {str(corpus / "00001"), str(corpus / "00000.parquet")}
    assert {k for k, r in by_id.items() if r["reason"] == "unsafe-path"} == hostile
    assert set(by_id) == hostile | {s[0] for s in samples} | {"inlink"}
    assert loaded, "the demo samples give at least one written sample"


@pytest.mark.slow
def test_csv_run_keeps_every_row_of_a_table_with_a_long_cell(runs, samples):
    corpus, out, code, stderr = runs["csv"]
    assert code == 0, stderr
    by_id, _ = _outcome(out)
    unsafe = {k for k, r in by_id.items() if r["reason"] == "unsafe-path"}
    assert unsafe == TABLE_HOSTILE | {str(corpus / "u.csv")}
    assert set(by_id) == unsafe | {s[0] for s in samples}  # every row after the long cells too
    assert by_id[samples[2][0]]["reason"] == "bad-metadata"
    assert not {r["reason"] for r in by_id.values()} & {"bad-shard"}


@pytest.mark.slow
def test_parquet_and_wds_runs_read_nothing_outside(runs, samples):
    _, out, code, stderr = runs["parquet"]
    assert code == 0, stderr
    by_id, _ = _outcome(out)
    assert {k for k, r in by_id.items() if r["reason"] == "unsafe-path"} == TABLE_HOSTILE
    assert set(by_id) == TABLE_HOSTILE | {s[0] for s in samples}

    shards, out, code, stderr = runs["wds"]
    assert code == 0, stderr
    by_id, _ = _outcome(out)
    assert by_id[str(shards / "00001.tar")]["reason"] == "unsafe-path"
    assert set(by_id) == {str(shards / "00001.tar")} | {s[0] for s in samples}
