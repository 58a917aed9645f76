"""The same key in two pieces of a WebDataset, Parquet or ``files`` corpus (img2dataset's
re-downloaded shards) is written once: the driver's planner reads each piece's keys (tar
headers, a Parquet file's id column, a folder's names) into the run's
:class:`~counterfactual.readers.keyset.KeySet` in piece order, so the later occurrences become
``duplicate-key`` rows whichever worker reads which piece, on either runner, and on resume."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from shard_files import run_outputs
from test_corpus_synth import _args

from counterfactual.cli import main
from counterfactual.readers.corpus import (
    iter_files,
    iter_table,
    iter_wds,
    plan_pieces,
    read_piece,
)
from counterfactual.records import ImageRecord, Status
from counterfactual.synth.run import read_status
from counterfactual.testing import build_tiny_owlv2
from counterfactual.testing.corpora import (
    demo_samples,
    write_parquet,
    write_pictures,
    write_shard,
)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    return demo_samples(tmp_path_factory.mktemp("demo"), shrink=4)


def _rows(pieces):
    out = []
    for piece in pieces:
        out.extend([piece] if isinstance(piece, Status) else read_piece(piece))
    return out


def _outcome(rows):
    return [(r.image_id, getattr(r, "reason", None)) for r in rows]


def _redownloaded_wds(samples, folder):
    """Three tars; ``00002.tar`` re-downloads ``00001.tar``'s keys and adds one new sample; the
    first tar repeats a key of its own (checked within the tar, as always)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_shard([samples[0], samples[1], samples[0]], folder / "00000.tar")
    write_shard(samples[2:5], folder / "00001.tar")
    write_shard([samples[3], samples[5], samples[2], samples[4]], folder / "00002.tar")
    return str(folder / "{00000..00002}.tar")


def test_a_redownloaded_tar_gives_duplicate_key_rows(samples, tmp_path):
    pattern = _redownloaded_wds(samples, tmp_path / "wds")
    pieces = list(plan_pieces(pattern, "wds", 100))
    assert [len(p.repeated_keys) for p in pieces] == [0, 0, 3 * 8]  # 8 bytes a repeated key
    rows = _rows(pieces)
    keys = [s[0] for s in samples]
    assert _outcome(rows) == [
        (keys[0], None),
        (keys[1], None),
        (keys[0], "duplicate-key"),  # within the tar: names both places
        (keys[2], None),
        (keys[3], None),
        (keys[4], None),
        (keys[3], "duplicate-key"),
        (keys[5], None),
        (keys[2], "duplicate-key"),
        (keys[4], "duplicate-key"),
    ]
    assert rows[6].detail.endswith("00002.tar: an earlier piece of this run has the same key")
    records = [r.image_id for r in rows if isinstance(r, ImageRecord)]
    assert len(records) == len(set(records)) == 6
    # the whole stream read at once agrees on which rows are kept
    assert _outcome(iter_wds(pattern)) == _outcome(rows)


def test_the_planner_reads_tar_headers_not_pictures(samples, tmp_path, monkeypatch):
    """A tar's keys come from its headers: the pictures between them are skipped by seeking."""
    import random

    from counterfactual import fs

    rng = random.Random(0)
    big = [(f"k{i:03d}", rng.randbytes(200_000), "a dog", {}) for i in range(20)]
    write_shard(big, tmp_path / "00000.tar")
    write_shard(big[10:], tmp_path / "00001.tar")
    read = []
    real = fs.open_file

    class Counted:
        def __init__(self, fh):
            self._fh = fh

        def read(self, *args):
            data = self._fh.read(*args)
            read.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self._fh, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._fh.close()

    monkeypatch.setattr("counterfactual.fs.open_file", lambda *a, **k: Counted(real(*a, **k)))
    pieces = list(plan_pieces(str(tmp_path / "{00000..00001}.tar"), "wds", 1))
    assert [len(p.repeated_keys) // 8 for p in pieces] == [0, 10]
    total = sum(p.stat().st_size for p in tmp_path.glob("*.tar"))
    assert 0 < sum(read) < total / 100  # 512-byte headers, not 200 kB pictures


def test_a_truncated_tar_keeps_the_keys_its_reader_reads(samples, tmp_path):
    pattern = _redownloaded_wds(samples, tmp_path / "wds")
    tar = tmp_path / "wds" / "00001.tar"
    data = tar.read_bytes()
    tar.write_bytes(data[: len(data) // 2])  # its last samples are cut off
    rows = _rows(plan_pieces(pattern, "wds", 100))
    assert _outcome(rows) == _outcome(iter_wds(pattern))
    assert sum(isinstance(r, Status) and r.reason == "bad-shard" for r in rows) == 1
    kept = [r.image_id for r in rows if isinstance(r, ImageRecord)]
    assert len(kept) == len(set(kept))


def test_parquet_ids_repeated_across_files_and_pieces(samples, tmp_path):
    write_parquet(samples[:5], tmp_path / "pq" / "part-0.parquet", row_group_size=2)
    again = [samples[1], samples[5], samples[3], samples[6], samples[5], samples[7]]
    write_parquet(again, tmp_path / "pq" / "part-1.parquet", row_group_size=4)
    pieces = list(plan_pieces(str(tmp_path / "pq" / "*.parquet"), "parquet", 2))
    assert [sorted(p.repeated) for p in pieces] == [[], [], [], [0], [2], [4]]
    rows = _rows(pieces)
    assert len(rows) == 11  # every input row ends as a record or a status row
    records = [r.image_id for r in rows if isinstance(r, ImageRecord)]
    assert len(records) == len(set(records)) == 8
    failed = [(r.image_id, r.reason) for r in rows if isinstance(r, Status)]
    assert failed == [(samples[i][0], "duplicate-key") for i in (1, 3, 5)]
    streamed = iter_table(str(tmp_path / "pq" / "*.parquet"), "parquet")
    assert _outcome(streamed) == _outcome(rows)


def test_parquet_without_an_id_column_repeats_file_stem_row_ids(samples, tmp_path):
    import pyarrow.parquet as pq

    for folder in ("x", "y"):
        table = write_parquet(samples[:3], tmp_path / folder / "pairs.parquet")
        pq.write_table(pq.read_table(table).drop(["key"]), table)
    rows = _rows(plan_pieces(str(tmp_path / "*" / "pairs.parquet"), "parquet", 2))
    assert [r.image_id for r in rows] == [f"pairs-{i:08d}" for i in (0, 1, 2, 0, 1, 2)]
    assert [getattr(r, "reason", None) for r in rows] == [None] * 3 + ["duplicate-key"] * 3


def test_files_shard_folders_repeating_keys(samples, tmp_path):
    root = tmp_path / "files"
    for shard, part in (("00000", samples[:3]), ("00001", [samples[1], samples[3]])):
        folder = root / shard
        write_pictures(part, folder)
        for key, _, caption, _ in part:
            (folder / f"{key}.txt").write_text(caption)
    rows = _rows(plan_pieces(str(root), "files", 100))
    assert _outcome(rows) == _outcome(iter_files(str(root)))
    assert [r.image_id for r in rows if isinstance(r, Status)] == [samples[1][0]]


# --------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def owl(tmp_path_factory):
    return build_tiny_owlv2(tmp_path_factory.mktemp("owl") / "owlv2", grid_boxes=True)


def _check_run(out, keys):
    """Every input sample once among written/skipped/failed rows of its first occurrence, each
    later one a ``duplicate-key`` row, and no key twice in the shards."""
    statuses = list(read_status(out))
    repeats = Counter(s.image_id for s in statuses if s.reason == "duplicate-key")
    firsts = {s.image_id for s in statuses if s.reason != "duplicate-key"}
    assert firsts == set(keys)
    assert repeats == Counter(keys) - Counter(set(keys))
    written = [json.loads(p.read_text()) for p in out.glob("shard-*_stats.json")]
    names = [row["image_id"] for stats in written for row in stats["status"]]
    assert Counter(names) == Counter(keys)  # the status rows are the stats files' rows
    from shard_files import shard_members

    members = [name for name in shard_members(out) if name.endswith(".json")]
    assert len(members) == len(set(members))
    return statuses


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wds", "parquet"])
def test_runs_on_both_runners_write_each_key_once_and_resume(
    owl, samples, module_ray, tmp_path, capsys, kind
):
    if kind == "wds":
        pattern = _redownloaded_wds(samples, tmp_path / "in")
        keys = [samples[i][0] for i in (0, 1, 0, 2, 3, 4, 3, 5, 2, 4)]
    else:
        write_parquet(samples[:5], tmp_path / "in" / "part-0.parquet")
        again = [samples[1], samples[5], samples[3], samples[6]]
        write_parquet(again, tmp_path / "in" / "part-1.parquet")
        pattern = str(tmp_path / "in")
        keys = [samples[i][0] for i in (0, 1, 2, 3, 4, 1, 5, 3, 6)]
    local, ray = tmp_path / "local", tmp_path / "ray"
    assert main(_args(owl, kind, pattern, local)) == 0
    statuses = _check_run(local, keys)
    assert any(s.status == "written" for s in statuses)
    ray_args = ("--runner", "ray", "--num-cpus", "2", "--no-dashboard")
    assert main(_args(owl, kind, pattern, ray, *ray_args)) == 0
    assert run_outputs(ray) == run_outputs(local)
    # resume: a lost shard (one with repeats) is made again, the same bytes
    before = run_outputs(local)
    (local / "shard-000002.tar").unlink()
    (local / "shard-000002_stats.json").unlink()
    assert main(_args(owl, kind, pattern, local)) == 0
    assert run_outputs(local) == before
    manifest = json.loads((local / "manifest.json").read_text())
    assert manifest["shards_resumed"] == manifest["shards"] - 1
    # an earlier input file changed while its shards are not made yet: the later piece whose
    # repeats it decided is refused, naming what changed
    for index in (0, 1):
        for name in (f"shard-{index:06d}.tar", f"shard-{index:06d}_stats.json"):
            (local / name).unlink()
    if kind == "wds":
        write_shard(samples[6:8], tmp_path / "in" / "00001.tar")
    else:
        others = [samples[i] for i in (0, 2, 4, 6, 7)]
        write_parquet(others, tmp_path / "in" / "part-0.parquet")
    capsys.readouterr()
    assert main(_args(owl, kind, pattern, local)) == 2
    err = capsys.readouterr().err
    assert "shard-000002.tar was made from other input" in err
    assert "other of its keys repeat an earlier piece's" in err
