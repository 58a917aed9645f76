"""``sizes.json`` (open_clip's) and ``shardindex.json`` (wids') beside the shards of a real run
(issue 22, point 8): read as open_clip reads sizes (``get_dataset_size``, what
``--train-num-samples`` would otherwise be counted for) and loaded with
``wids.ShardListDataset``; rewritten when a rerun remakes a shard; ``check`` catches a stale
one. A generated COCO-format set whose first shard holds no sample (images 1-3 are broken)."""

import json
import shutil

import pytest
from bad_coco import make_bad_coco, synth_args

from counterfactual.cli import main
from counterfactual.shards.check import check_run
from counterfactual.shards.indexes import SIZES_FILE, WIDS_FILE, WIDS_KIND
from counterfactual.shards.shards import read_stats
from counterfactual.synth.run import read_status

ARGS = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"), n=16, size=(96, 72))


@pytest.fixture(scope="module")
def out(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "out"
    assert main(synth_args(coco, out, *ARGS)) == 0
    return out


def _written(out):
    return [s.key for s in read_status(out) if s.status == "written"]


def test_sizes_json_lists_every_shard_as_open_clip_reads_it(out):
    stats = read_stats(out)
    sizes = json.loads((out / SIZES_FILE).read_text())
    assert sizes == {s.shard: s.count for s in stats.values()}
    assert sizes["shard-000000.tar"] == 0 and len(sizes) == 5
    data = pytest.importorskip("open_clip_train.data")
    pattern = str(out / "shard-{000000..000004}.tar")
    total, shards = data.get_dataset_size(pattern)
    assert (total, shards) == (len(_written(out)), 5)
    assert total == 10


def test_wids_loads_every_sample_by_index(out, tmp_path):
    wids = pytest.importorskip("wids")
    index = json.loads((out / WIDS_FILE).read_text())
    assert index["__kind__"] == WIDS_KIND and index["wids_version"] == 1
    assert [s["url"] for s in index["shardlist"]] == [f"shard-00000{i}.tar" for i in range(1, 5)]
    ds = wids.ShardListDataset(str(out / WIDS_FILE), cache_dir=str(tmp_path / "cache"))
    keys = _written(out)
    assert len(ds) == len(keys) == 10
    for i in (0, 5, len(ds) - 1):
        sample = ds[i]
        assert sample["__key__"] == keys[i]
        meta = sample[".json"]
        assert meta["key"] == keys[i]
        assert sample[".txt"] == meta["caption"]
        assert sample[".jpg"].size == (meta["width"], meta["height"])
    ds.close()


def test_a_rerun_rewrites_them_and_check_sees_a_stale_one(coco, out, tmp_path, capsys):
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    before = {f: (copy / f).read_text() for f in (SIZES_FILE, WIDS_FILE)}
    assert check_run(copy).ok
    (copy / SIZES_FILE).write_text(json.dumps({"shard-000001.tar": 99}))
    problems = check_run(copy).problems
    assert problems == [f"{SIZES_FILE} does not list the committed shards and their samples"]
    (copy / "shard-000002_stats.json").unlink()  # uncommitted: the rerun makes it again
    (copy / WIDS_FILE).unlink()
    assert main(synth_args(coco, copy, *ARGS)) == 0
    capsys.readouterr()
    assert {f: (copy / f).read_text() for f in (SIZES_FILE, WIDS_FILE)} == before
    assert check_run(copy).ok
