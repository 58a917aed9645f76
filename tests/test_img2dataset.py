"""img2dataset's three output formats, written by img2dataset itself from pictures served on
127.0.0.1 (one url answers 404), read as they are: ``--root DIR`` for its folder (its
``.parquet`` and ``_stats.json`` beside the tars are not shards), every url accounted for (a
record, or a status row: the 404 as ``download-failed`` with img2dataset's error_message and
url), and its ``url``, ``key``, ``status`` and ``sha256`` carried into each sample's json (the
``url`` into each status row too)."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from counterfactual.cli import main
from counterfactual.readers.corpus import (
    expand_pattern,
    files_root,
    iter_files,
    iter_table,
    iter_wds,
    plan_pieces,
    read_piece,
)
from counterfactual.readers.spec import DataSpec
from counterfactual.records import ImageRecord, Origin, Status
from counterfactual.shards.samples import SampleMeta, read_samples
from counterfactual.testing import build_tiny_owlv2
from counterfactual.testing.corpora import demo_samples

if importlib.util.find_spec("img2dataset") is None:  # imported where it runs, not at collection
    pytest.skip("img2dataset is not installed", allow_module_level=True)

pytestmark = pytest.mark.slow

FORMATS = {"webdataset": "wds", "parquet": "parquet", "files": "files"}
"""img2dataset's output_format -> our --dataset."""


class _Pictures(http.server.BaseHTTPRequestHandler):
    pictures: dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        data = self.pictures.get(self.path)
        if data is None:
            self.send_error(404, "File not found")
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, list[tuple[str, bytes, str]]]]:
    """The demo's eight pictures (and one missing) served on 127.0.0.1: the url list's path
    and ``(url, picture or b"", caption)`` per row, in order."""
    samples = demo_samples(tmp_path_factory.mktemp("demo"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Pictures)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    rows = [(f"{base}/{key}.jpg", picture, caption) for key, picture, caption, _ in samples]
    rows.insert(3, (f"{base}/gone.jpg", b"", "A cat that is not there."))
    _Pictures.pictures = {url[len(base) :]: data for url, data, _ in rows if data}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    folder = tmp_path_factory.mktemp("urls")
    urls = folder / "urls.parquet"
    pq.write_table(pa.table({"url": [r[0] for r in rows], "caption": [r[2] for r in rows]}), urls)
    yield str(urls), rows
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def downloads(served, tmp_path_factory) -> dict[str, Path]:
    """img2dataset's output folder per output format: 9 urls, 4 per shard (3 shards)."""
    urls, _ = served
    import img2dataset

    out = {}
    for output_format in FORMATS:
        folder = tmp_path_factory.mktemp("i2d") / output_format
        img2dataset.download(
            url_list=urls,
            input_format="parquet",
            url_col="url",
            caption_col="caption",
            output_folder=str(folder),
            output_format=output_format,
            processes_count=1,
            thread_count=2,
            image_size=96,
            number_sample_per_shard=4,
            compute_hash="sha256",
            enable_wandb=False,
            timeout=10,
            retries=0,
        )
        out[output_format] = folder
    return out


@pytest.fixture(scope="module")
def owl(tmp_path_factory):
    return build_tiny_owlv2(tmp_path_factory.mktemp("owl") / "owlv2", grid_boxes=True)


def _truth(folder: Path) -> dict[str, dict[str, Any]]:
    """img2dataset's own record of every url, by its key: the rows of its Parquet files."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.parquet")):
        table = pq.read_table(path)
        table = table.drop_columns([c for c in ("jpg",) if c in table.column_names])
        rows.update({r["key"]: r for r in table.to_pylist()})
    return rows


def _split(rows: list[ImageRecord | Status]) -> tuple[list[ImageRecord], list[Status]]:
    return [r for r in rows if isinstance(r, ImageRecord)], [
        r for r in rows if isinstance(r, Status)
    ]


def test_img2dataset_wrote_what_its_documentation_says(served, downloads) -> None:
    _, rows = served
    names = {f: sorted(p.name for p in d.iterdir()) for f, d in downloads.items()}
    shards = ("00000", "00001", "00002")
    assert names["webdataset"] == sorted(
        n for s in shards for n in (f"{s}.tar", f"{s}.parquet", f"{s}_stats.json")
    )
    assert names["parquet"] == sorted(
        n for s in shards for n in (f"{s}.parquet", f"{s}_stats.json")
    )
    assert names["files"] == sorted(
        n for s in shards for n in (s, f"{s}.parquet", f"{s}_stats.json")
    )
    for folder in downloads.values():
        truth = _truth(folder)
        assert len(truth) == len(rows)
        failed = [r for r in truth.values() if r["status"] != "success"]
        assert [(r["url"].rsplit("/", 1)[1], r["status"]) for r in failed] == [
            ("gone.jpg", "failed_to_download")
        ]
        assert "404" in failed[0]["error_message"]
        pictures = {url: data for url, data, _ in rows}
        for row in truth.values():
            if row["status"] == "success":
                assert row["sha256"] == hashlib.sha256(pictures[row["url"]]).hexdigest()


@pytest.mark.parametrize("output_format", list(FORMATS))
def test_each_format_read_from_its_folder_every_url_accounted_for(
    downloads, output_format: str
) -> None:
    folder = downloads[output_format]
    kind = FORMATS[output_format]
    if kind == "wds":
        rows = list(iter_wds(folder))
    elif kind == "files":
        rows = list(iter_files(folder))
    else:
        rows = list(iter_table(folder, "parquet"))
    records, statuses = _split(rows)
    truth = _truth(folder)
    # one row per url, none for img2dataset's other files
    assert sorted([r.image_id for r in records] + [s.image_id for s in statuses]) == sorted(truth)
    (failed,) = statuses
    row = truth[failed.image_id]
    assert (failed.status, failed.reason) == ("failed", "download-failed")
    assert failed.detail == f"failed_to_download: {row['error_message']} ({row['url']})"
    for record in records:
        row = truth[record.image_id]
        assert record.origin == Origin(
            url=row["url"], key=row["key"], status="success", sha256=row["sha256"]
        )
        assert record.dataset == kind and record.captions[0].text == row["caption"]
    if kind == "files":  # a picture file of its own, under the output folder
        assert {r.root for r in records} == {folder}
        assert all((folder / r.file).is_file() for r in records)
        assert files_root(folder) == str(folder)


def test_pieces_give_the_same_rows_as_the_whole_stream(downloads) -> None:
    for output_format, kind in FORMATS.items():
        folder = downloads[output_format]
        whole = list(
            iter_wds(folder)
            if kind == "wds"
            else iter_files(folder)
            if kind == "files"
            else iter_table(folder, kind)
        )
        pieces = [p for p in plan_pieces(folder, kind, 2)]
        assert all(not isinstance(p, Status) for p in pieces)
        assert len(pieces) == (5 if kind == "parquet" else 3)  # 4, 4 and 1 rows
        by_piece = [row for piece in pieces for row in read_piece(piece)]  # type: ignore[arg-type]
        assert by_piece == whole


def test_a_glob_or_folder_reads_the_kind_files_only(downloads, tmp_path: Path) -> None:
    wds = downloads["webdataset"]
    assert expand_pattern(wds, "wds") == [wds / f"0000{i}.tar" for i in range(3)]
    assert expand_pattern(f"{wds}/*", "wds") == expand_pattern(wds, "wds")
    assert list(iter_wds(f"{wds}/*")) == list(iter_wds(wds))
    assert expand_pattern(downloads["files"], "files") == [
        downloads["files"] / f"0000{i}" for i in range(3)
    ]
    # a shard folder by itself is one shard
    assert expand_pattern(downloads["files"] / "00001", "files") == [downloads["files"] / "00001"]
    # the tars' metadata Parquet files have no picture column: a configuration error
    with pytest.raises(ValueError, match="no image column"):
        iter_table(wds, "parquet")
    # a folder or glob with none of the kind's files names the pattern and what was passed over
    with pytest.raises(ValueError, match=r"no file matches .*\*\.csv files; 6 other files"):
        expand_pattern(f"{downloads['parquet']}/*", "csv")
    with pytest.raises(ValueError, match=r"no file matches .*\*\.tar files\)"):
        expand_pattern(downloads["parquet"], "wds")
    with pytest.raises(ValueError, match="no shard folder matches"):
        expand_pattern(tmp_path, "files")
    with pytest.raises(ValueError, match="--dataset files needs --root"):
        DataSpec("files").resolved()
    assert DataSpec("files", str(downloads["files"])).resolved().images == str(downloads["files"])


def test_lost_samples_and_a_broken_metadata_file_are_reported(downloads, tmp_path: Path) -> None:
    """A sample img2dataset lists as downloaded but the tar lacks (cut off) is
    ``missing-image``; metadata that cannot be read is a ``bad-shard`` row, not a crash."""
    source = downloads["webdataset"]
    shard = tmp_path / "00000.tar"
    data = (source / "00000.tar").read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    (tmp_path / "00000.parquet").write_bytes((source / "00000.parquet").read_bytes())
    rows = list(iter_wds(tmp_path))
    records, statuses = _split(rows)
    truth = {k: v for k, v in _truth(source).items() if k[:5] == "00000"}  # shard 0's
    reasons = {s.image_id: s.reason for s in statuses}
    assert reasons.pop(str(shard)) == "bad-shard"
    assert sorted([r.image_id for r in records] + list(reasons)) == sorted(truth)
    assert set(reasons.values()) <= {"missing-image", "download-failed"}
    assert "missing-image" in reasons.values()
    (tmp_path / "00000.parquet").write_bytes(b"PAR1 not parquet")
    statuses = _split(list(iter_wds(tmp_path)))[1]
    assert [s.reason for s in statuses if s.image_id == str(tmp_path / "00000.parquet")] == [
        "bad-shard"
    ]


def _synth(owl, kind: str, root: Path, out: Path) -> list[str]:
    return [
        "synth",
        "--dataset",
        kind,
        "--root",
        str(root),
        "--out",
        str(out),
        "--detector-model",
        str(owl),
        "--detect-threshold",
        "0",
        "--detect-queries",
        "caption",
        "--image-method",
        "blur",
        "--images-per-shard",
        "3",
    ]


@pytest.mark.parametrize("output_format", list(FORMATS))
def test_synth_on_img2dataset_output_carries_its_origin(
    owl, downloads, output_format: str, tmp_path: Path
) -> None:
    folder = downloads[output_format]
    kind = FORMATS[output_format]
    out = tmp_path / "out"
    assert main(_synth(owl, kind, folder, out)) == 0
    truth = _truth(folder)
    status = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    # every url img2dataset was given has exactly one row (a picture may give several items)
    assert {r["image_id"] for r in status} == set(truth)
    assert all(r["reason"] != "bad-shard" for r in status)
    (failed,) = [r for r in status if r["reason"] == "download-failed"]
    row = truth[failed["image_id"]]
    assert row["status"] == "failed_to_download"
    assert row["error_message"] in failed["detail"] and row["url"] in failed["detail"]
    # every row carries the url img2dataset fetched (or tried to), so it joins with its records
    assert all(r["url"] == truth[r["image_id"]]["url"] for r in status)
    written = [r for r in status if r["status"] == "written"]
    assert written, "the tiny detector makes plans at threshold 0"
    samples = [s for s in read_samples(out, images=False) if not isinstance(s, Status)]
    assert sorted(s.meta.key for s in samples) == sorted(r["key"] for r in written)
    for sample in samples:
        meta = sample.meta
        row = truth[meta.image_id]
        assert meta.origin == Origin(
            url=row["url"], key=row["key"], status="success", sha256=row["sha256"]
        )
        shown = json.loads(json.dumps(meta.to_dict()))["origin"]
        assert shown == {k: row[k] for k in ("url", "key", "status", "sha256")}
        assert SampleMeta.from_dict(meta.to_dict()) == meta
    if kind == "wds":  # img2dataset's own json member is what the sample json carries
        import tarfile

        with tarfile.open(folder / "00000.tar") as tar:
            theirs = {
                m.name[: -len(".json")]: json.load(tar.extractfile(m))  # type: ignore[arg-type]
                for m in tar.getmembers()
                if m.name.endswith(".json")
            }
        compared = [s.meta for s in samples if s.meta.image_id in theirs]
        assert compared, "shard 0 has written samples"
        for meta in compared:
            mine = meta.origin.to_dict()  # type: ignore[union-attr]
            assert mine == {k: theirs[meta.image_id][k] for k in mine}
    if kind == "files":  # the audit finds each original from the recorded data spec
        assert main(["report", str(out)]) == 0
        page = (out / "report" / "index.html").read_text()
        assert "original not found" not in page and "original not loaded" not in page


def test_shipped_files_config_is_valid() -> None:
    """``make synth DATASET=files`` reads counterfactual/pipelines/configs/files.yaml."""
    from counterfactual.cli import build_parser
    from counterfactual.cli.config import load_config
    from counterfactual.cli.synth import build_config

    path = Path(__file__).parent.parent / "counterfactual" / "pipelines" / "configs" / "files.yaml"
    sub = build_parser().parse_args(["synth"]).__dict__["_subcommands"]["synth"]
    values = load_config(path, sub)
    assert values["dataset"] == "files" and values["runner"] == "ray"
    sub.set_defaults(**values)
    config = build_config(sub.parse_args(["--out", "x"]))
    assert config.detect is not None and config.text.skip_unchanged
