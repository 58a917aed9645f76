"""`counterfactual mix`: shard expansion, sample counts, weights for a ratio, the mixed stream."""

import collections
import hashlib
import inspect
import io
import itertools
import json
import os
import random
import subprocess
import sys
import tarfile

import pytest
import webdataset as wds
from braceexpand import braceexpand
from PIL import Image

from counterfactual.cli import main
from counterfactual.records import Status
from counterfactual.shards.shards import Sample, ShardWriter
from counterfactual.train.mix import (
    PLAN_VERSION,
    MixPlan,
    SeededShards,
    count_samples,
    expand_shards,
    mixed_dataset,
    plan_mix,
    shard_pattern,
    stats_path,
)
from counterfactual.train.pairs import Unpaired, even_split, write_originals


def _jpeg(shade: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (shade, 100, 200)).save(buf, format="JPEG")
    return buf.getvalue()


JPEG = _jpeg(10)


def write_shard(path, keys, stats=None):
    """A real WebDataset shard with `jpg`, `txt` and `json` per key; `stats` (a dict) is written
    beside it as `<stem>_stats.json`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with wds.TarWriter(str(path)) as sink:
        for key in keys:
            sink.write({"__key__": key, "jpg": JPEG, "txt": f"caption {key}", "json": {"key": key}})
    if stats is not None:
        (path.parent / (path.name[: -len(".tar")] + "_stats.json")).write_text(json.dumps(stats))
    return path


def ours(directory, counts, prefix="s"):
    """Shards as `counterfactual synth` writes them: shard-000000.tar + {"count": N}."""
    paths = []
    for i, n in enumerate(counts):
        name = f"shard-{i:06d}.tar"
        keys = [f"{prefix}{i}_{j}" for j in range(n)]
        paths.append(write_shard(directory / name, keys, {"shard": name, "count": n, "keys": keys}))
    return paths


def img2dataset(directory, successes, failed=7):
    """Shards as img2dataset writes them: 00000.tar + {"count": tried, "successes": N}; its
    `count` includes failed downloads."""
    paths = []
    for i, n in enumerate(successes):
        keys = [f"{i:05d}{j:04d}" for j in range(n)]
        stats = {"count": n + failed, "successes": n, "failed_to_download": failed}
        paths.append(write_shard(directory / f"{i:05d}.tar", keys, stats))
    return paths


# --- counting -------------------------------------------------------------------------------


def test_counts_prefer_img2dataset_successes_and_agree_with_the_tar(tmp_path):
    shard = img2dataset(tmp_path, [12])[0]
    assert stats_path(str(shard)) == str(tmp_path / "00000_stats.json")
    assert count_samples(str(shard)) == 12  # successes, not count (19)
    (tmp_path / "00000_stats.json").unlink()
    assert count_samples(str(shard)) == 12  # read from the tar


def test_counts_use_our_stats_file_without_reading_the_tar(tmp_path):
    shard = ours(tmp_path, [5])[0]
    stats = tmp_path / "shard-000000_stats.json"
    stats.write_text(json.dumps({"shard": shard.name, "count": 9}))
    assert count_samples(str(shard)) == 9  # the stats file is trusted
    stats.write_text(json.dumps({"shard": shard.name, "other": 1}))
    assert count_samples(str(shard)) == 5  # no count in it: the tar is read
    stats.write_text("{not json")
    with pytest.raises(ValueError, match="shard-000000_stats.json"):
        count_samples(str(shard))


def _raw_tar(path, names):
    with tarfile.open(path, "w") as tar:
        for name in names:
            if name.endswith("/"):
                info = tarfile.TarInfo(name.rstrip("/"))
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                continue
            data = JPEG if name.endswith(".jpg") else name.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_tar_count_groups_members_like_webdataset(tmp_path):
    names = [
        "__meta__",  # webdataset skips it
        "a.jpg",
        "a.txt",
        "x/",  # a directory entry: skipped
        "x/k.jpg",
        "x/k.meta.json",  # same key x/k: the key ends at the first dot of the base name
        "y/k.jpg",  # same base name, other directory: another sample
        "README",  # no extension: no key
        "b.jpg",
    ]
    shard = _raw_tar(tmp_path / "raw.tar", names)
    assert count_samples(str(shard)) == 4
    keys = [s["__key__"] for s in wds.WebDataset(str(shard), shardshuffle=False)]
    assert keys == ["a", "x/k", "y/k", "b"]


def test_unreadable_shards_raise_naming_the_file(tmp_path):
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(b"this is not a tar file" * 40)
    with pytest.raises(ValueError, match="corrupt.tar"):
        count_samples(str(corrupt))
    whole = write_shard(tmp_path / "whole.tar", [f"k{i}" for i in range(4)]).read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[:1800])  # ends inside a member
    with pytest.raises(ValueError, match="truncated shard .*cut.tar"):
        count_samples(str(cut))
    with pytest.raises(ValueError, match="missing.tar"):
        count_samples(str(tmp_path / "missing.tar"))


# --- expansion ------------------------------------------------------------------------------


def test_expand_brace_glob_directory_and_double_colon(tmp_path):
    syn = ours(tmp_path / "syn", [2, 2, 2])
    orig = img2dataset(tmp_path / "orig", [3, 3])
    brace = str(tmp_path / "syn" / "shard-{000000..000002}.tar")
    assert expand_shards(brace) == [str(p) for p in syn]
    assert expand_shards(str(tmp_path / "syn" / "*.tar")) == [str(p) for p in syn]
    assert expand_shards(tmp_path / "orig") == [str(p) for p in orig]  # *.tar, not the json
    both = f"{tmp_path / 'orig'}::{brace}"
    assert expand_shards(both) == [str(p) for p in orig + syn]
    assert expand_shards([str(orig[1]), str(orig[0])]) == [str(orig[1]), str(orig[0])]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("syn/shard-{000000..000003}.tar", "no such file .*shard-000003.tar"),
        ("syn/*.tgz", "nothing matches"),
        ("empty", "no \\*.tar in directory"),
        ("syn/shard-000000.tar::syn/shard-000000.tar", "listed twice"),
        ("syn/shard-000000.tar::", "empty part"),
        ("nowhere.tar", "no such file"),
    ],
)
def test_expand_errors_name_the_spec(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    ours(tmp_path / "syn", [1, 1, 1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=message) as err:
        expand_shards(spec)
    assert repr(spec) in str(err.value)


def test_expand_needs_a_spec():
    with pytest.raises(ValueError, match="no shard spec"):
        expand_shards([])


# --- one pattern per side ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paths", "pattern"),
    [
        (["o/shard-000000.tar"], "o/shard-000000.tar"),
        ([f"o/{i:05d}.tar" for i in range(100)], "o/{00000..00099}.tar"),
        (["o/00000.tar", "o/00001.tar", "o/00003.tar"], "o/{{00000..00001},00003}.tar"),
        (["o/8.tar", "o/9.tar", "o/10.tar"], "o/{8..10}.tar"),  # no padding: one range
        (["o/09.tar", "o/10.tar", "o/011.tar"], "o/{{09..10},011}.tar"),  # widths differ
        (["o/2.tar", "o/1.tar"], "o/{2,1}.tar"),  # the order is kept
        (["a/x.tar", "b/x.tar"], "{a/x.tar,b/x.tar}"),  # no number in the name
        (["d7/x.tar", "d8/x.tar"], "{d7/x.tar,d8/x.tar}"),  # the number is in the folder
        (["a/p-1.tar", "b/p-2.tar"], "{a/p-1.tar,b/p-2.tar}"),  # consecutive, two folders
        (["o/a,{b}.tar"], "o/a\\,\\{b\\}.tar"),  # escaped for braceexpand
        (["o/a\\1.tar", "o/a\\2.tar"], "o/a\\\\{1..2}.tar"),
        (["s3://b/p/0007.tar", "s3://b/p/0008.tar"], "s3://b/p/{0007..0008}.tar"),
    ],
)
def test_shard_pattern_expands_back_to_the_shards(paths, pattern):
    assert shard_pattern(paths) == pattern
    assert list(braceexpand(pattern)) == paths


def test_shard_pattern_refuses_what_open_clip_cannot_name():
    with pytest.raises(ValueError, match="no shards"):
        shard_pattern([])
    with pytest.raises(ValueError, match="'o/a::b.tar' holds '::'"):
        shard_pattern(["o/a::b.tar"])


def test_open_clip_reads_the_flags_as_one_weight_per_shard(tmp_path):
    """open_clip 3.x's own parser turns the two patterns and two factors back into every shard
    with its side's weight: what the per-shard flags said, in two short strings."""
    data = pytest.importorskip("open_clip_train.data")
    orig = img2dataset(tmp_path / "orig", [5] * 40)
    del orig[17]  # a gap, as after a failed img2dataset shard
    (tmp_path / "orig" / "00017.tar").unlink()
    other = ours(tmp_path / "more,{odd}", [5, 5], prefix="m")  # a second folder, odd name
    syn = ours(tmp_path / "syn", [4, 3, 3])
    plan = plan_mix([str(tmp_path / "orig"), str(tmp_path / "more,{odd}")], tmp_path / "syn", 0.1)
    assert plan.upsampling_factors == "1::2.05"  # one per side: 0.1 * 205 / 10
    urls, weights = data.expand_urls(plan.train_data, plan.upsampling_factors)
    assert urls == plan.shards == [str(p) for p in orig + other + syn]
    assert weights == plan.shard_weights
    t = tmp_path
    assert plan.train_data == (  # 39 + 2 original shards, 3 synthetic: two patterns
        f"{{{t}/orig/{{{{00000..00016}},{{00018..00039}}}}.tar,"
        f"{t}/more\\,\\{{odd\\}}/shard-{{000000..000001}}.tar}}::{t}/syn/shard-{{000000..000002}}.tar"
    )


# --- the plan -------------------------------------------------------------------------------


def test_weights_give_the_ratio_exactly(tmp_path):
    orig = img2dataset(tmp_path / "orig", [600, 400])  # 1000 original
    syn = ours(tmp_path / "syn", [30, 20])  # 50 synthetic
    plan = plan_mix(str(tmp_path / "orig"), str(tmp_path / "syn" / "*.tar"), 0.1)
    assert isinstance(plan, MixPlan)
    assert plan.original.counts == (600, 400) and plan.original.samples == 1000
    assert plan.synthetic.counts == (30, 20) and plan.synthetic.samples == 50
    assert plan.original.weight == 1.0
    assert plan.synthetic.weight == 2.0  # 0.1 * 1000 / 50
    weighted = plan.synthetic.weight * 50 / (plan.original.weight * 1000)
    assert weighted == 0.1 == plan.expected_ratio
    assert plan.concat_ratio == 0.05
    assert plan.synthetic_repeats == 2.0
    assert plan.samples_per_epoch == 1100
    assert plan.shards == [str(p) for p in orig + syn]
    assert plan.shard_weights == [1.0, 1.0, 2.0, 2.0]
    assert plan.upsampling_factors == "1::2"  # one per side, not one per shard
    args = plan.open_clip_args()
    patterns = f"{tmp_path}/orig/{{00000..00001}}.tar::{tmp_path}/syn/shard-{{000000..000001}}.tar"
    assert args[args.index("--train-data") + 1] == patterns == plan.train_data
    assert args[args.index("--train-data-upsampling-factors") + 1] == "1::2"
    assert "--dataset-resampled" in args
    assert args[args.index("--train-num-samples") + 1] == "1100"

    d = plan.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["version"] == PLAN_VERSION == 2
    assert d["synthetic"] == {
        "shards": [str(p) for p in syn],
        "counts": [30, 20],
        "samples": 50,
        "weight": 2.0,
        "pattern": f"{tmp_path}/syn/shard-{{000000..000001}}.tar",
    }
    assert d["shards"] == plan.shards and d["weights"] == [1.0, 1.0, 2.0, 2.0]
    assert d["open_clip"] == {
        "train_data": patterns,
        "train_data_upsampling_factors": "1::2",
        "train_num_samples": 1100,
        "args": args,
    }


def test_open_clip_resampling_with_the_weights_reaches_the_ratio(tmp_path):
    """open_clip draws one shard at a time, with probability proportional to its weight, and
    reads it whole. Simulate that with the plan's weights and the real (uneven) shard sizes."""
    img2dataset(tmp_path / "orig", [700, 200, 100])
    ours(tmp_path / "syn", [40, 10])
    plan = plan_mix(tmp_path / "orig", tmp_path / "syn", 0.15)
    counts = dict(zip(plan.shards, plan.original.counts + plan.synthetic.counts, strict=True))
    synthetic = set(plan.synthetic.shards)
    rng = random.Random(0)
    drawn = {True: 0, False: 0}
    for shard in rng.choices(plan.shards, weights=plan.shard_weights, k=40_000):
        drawn[shard in synthetic] += counts[shard]
    assert drawn[True] / drawn[False] == pytest.approx(0.15, rel=0.05)
    # concatenating without weights would give 50 / 1000
    assert plan.concat_ratio == 0.05


def test_few_weights_below_one_when_synthetic_is_plentiful(tmp_path):
    ours(tmp_path / "orig", [100], prefix="o")
    ours(tmp_path / "syn", [40])
    plan = plan_mix(tmp_path / "orig", tmp_path / "syn", 0.1)
    assert plan.synthetic.weight == pytest.approx(0.25)  # 0.1 * 100 / 40
    assert plan.synthetic_repeats == pytest.approx(0.25)
    assert plan.expected_ratio == pytest.approx(0.1)


@pytest.mark.parametrize("ratio", [0, -0.1, float("nan"), float("inf")])
def test_ratio_must_be_positive(tmp_path, ratio):
    ours(tmp_path / "orig", [3], prefix="o")
    ours(tmp_path / "syn", [3])
    with pytest.raises(ValueError, match="ratio must be"):
        plan_mix(tmp_path / "orig", tmp_path / "syn", ratio)


def test_plan_refuses_empty_sides_and_shared_shards(tmp_path):
    ours(tmp_path / "orig", [3], prefix="o")
    empty = ours(tmp_path / "syn", [0])
    with pytest.raises(ValueError, match="synthetic shards hold no samples"):
        plan_mix(tmp_path / "orig", empty, 0.1)
    with pytest.raises(ValueError, match="both sides"):
        plan_mix(tmp_path / "orig", tmp_path / "orig" / "shard-000000.tar", 0.1)


# --- the command ----------------------------------------------------------------------------


def test_cli_prints_the_table_and_writes_the_json(tmp_path, capsys):
    img2dataset(tmp_path / "orig", [600, 400])
    ours(tmp_path / "syn", [30, 20])
    out = tmp_path / "plans" / "mix.json"
    argv = ["mix", "--original", str(tmp_path / "orig" / "0000{0,1}.tar")]
    argv += ["--synthetic", str(tmp_path / "syn" / "shard-000000.tar")]
    argv += [str(tmp_path / "syn" / "shard-000001.tar"), "--ratio", "0.1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = printed.splitlines()
    assert table[1].split() == ["original", "2", "1000", "1", "1000.0"]
    assert table[2].split() == ["synthetic", "2", "50", "2", "100.0"]
    assert "expected synthetic per original: 0.1 " in printed
    assert "without weights: 0.05" in printed
    assert "each repeats 2x" in printed and "1100 samples" in printed
    assert "--train-data-upsampling-factors 1::2 --dataset-resampled" in printed
    assert f"{tmp_path}/orig/{{00000..00001}}.tar::" in printed
    data = json.loads(out.read_text())
    assert data["weights"] == [1.0, 1.0, 2.0, 2.0]
    assert data["synthetic"]["samples"] == 50 and data["original"]["samples"] == 1000
    assert data["open_clip"]["train_num_samples"] == 1100


def test_cli_flags_stay_short_for_many_shards_unless_names_are_not_numbered(tmp_path, capsys):
    img2dataset(tmp_path / "orig", [1] * 100, failed=0)  # 100 numbered shards: one range
    ours(tmp_path / "syn", [1])
    argv = ["mix", "--original", str(tmp_path / "orig"), "--synthetic", str(tmp_path / "syn")]
    out = tmp_path / "mix.json"
    assert main([*argv, "--ratio", "0.1", "--out", str(out)]) == 0
    flags = capsys.readouterr().out.split("open_clip flags:\n  ")[1]
    assert flags.startswith(f"--train-data '{tmp_path}/orig/{{00000..00099}}.tar::")
    for i in range(80):  # names without a number: listed, then left to the JSON with --out
        write_shard(
            tmp_path / "words" / f"part-{chr(97 + i % 26)}{chr(97 + i // 26)}.tar", [f"w{i}"]
        )
    argv[2] = str(tmp_path / "words")
    assert main([*argv, "--ratio", "0.1", "--out", str(out)]) == 0
    assert f"characters): see open_clip.args in {out}" in capsys.readouterr().out
    assert len(json.loads(out.read_text())["open_clip"]["args"][1]) > 4000
    assert main([*argv, "--ratio", "0.1"]) == 0  # without --out they are printed
    assert "part-aa.tar," in capsys.readouterr().out


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    ours(tmp_path / "orig", [3], prefix="o")
    ours(tmp_path / "syn", [3])
    base = ["mix", "--original", str(tmp_path / "orig"), "--synthetic", str(tmp_path / "syn")]
    assert main([*base, "--ratio", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("counterfactual mix: error: ratio must be") and err.count("\n") == 1
    missing = str(tmp_path / "nowhere" / "{0..1}.tar")
    assert (
        main(
            ["mix", "--original", missing, "--synthetic", str(tmp_path / "syn")]
            + ["--ratio", "0.1"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "no such file" in err and err.count("\n") == 1


# --- the mixed stream -----------------------------------------------------------------------


def test_mixed_dataset_draws_at_the_ratio_and_passes_samples_through(tmp_path):
    ours(tmp_path / "orig", [120, 80], prefix="o")
    ours(tmp_path / "syn", [25, 25], prefix="s")
    ratio = 0.1

    def keys(seed):
        stream = mixed_dataset(tmp_path / "orig", str(tmp_path / "syn" / "*.tar"), ratio, seed)
        return [s["__key__"] for s in itertools.islice(stream, 4000)]

    drawn = keys(0)
    share = sum(k.startswith("s") for k in drawn) / len(drawn)
    assert share == pytest.approx(ratio / (1 + ratio), abs=0.02)  # 0.0909; binomial sd 0.0045
    assert drawn == keys(0)  # seeded: the same stream again
    assert drawn != keys(1)
    assert {k for k in drawn if k.startswith("s")} == {
        f"s{i}_{j}" for i in (0, 1) for j in range(25)
    }

    raw = next(iter(mixed_dataset(tmp_path / "orig", tmp_path / "syn", ratio)))
    assert {"__key__", "jpg", "txt", "json"} <= raw.keys()
    assert raw["jpg"] == JPEG and raw["txt"] == f"caption {raw['__key__']}".encode()

    pipeline = mixed_dataset(tmp_path / "orig", tmp_path / "syn", ratio).decode("pil")
    for image, text in itertools.islice(pipeline.to_tuple("jpg", "txt"), 20):
        assert isinstance(image, Image.Image) and image.size == (8, 8)
        assert text.startswith("caption ")


def _draws(sampler, n=300):
    return [d["url"] for d in itertools.islice(sampler(), n)]


def test_seeded_shards_are_uniform_and_depend_only_on_seed_epoch_and_worker(monkeypatch):
    shards = [f"s-{i}.tar" for i in range(5)]
    first, second = SeededShards(shards, seed=3), SeededShards(shards, seed=3)
    epoch0 = _draws(first)
    assert epoch0 == _draws(second)  # same seed, same epoch
    assert _draws(first) != epoch0  # the next call is the next epoch
    assert _draws(SeededShards(shards, seed=4)) != epoch0
    counts = collections.Counter(_draws(SeededShards(shards), 5000))
    assert set(counts) == set(shards) and min(counts.values()) > 900  # 1000 each expected
    monkeypatch.setenv("WORKER", "1")  # webdataset's worker info, as a DataLoader worker sets it
    monkeypatch.setenv("NUM_WORKERS", "2")
    assert _draws(SeededShards(shards, seed=3)) != epoch0
    with pytest.raises(ValueError, match="no shards"):
        SeededShards([])


def test_seeded_shards_draw_as_webdataset_resampled_shards_with_a_seed():
    """webdataset >= 0.2.90 takes ``seed=``; where it is installed the draws are the same."""
    if "seed" not in inspect.signature(wds.ResampledShards).parameters:
        pytest.skip(f"webdataset {wds.__version__} has no ResampledShards(seed=)")
    shards = [f"s-{i}.tar" for i in range(7)]
    ours_, theirs = (
        SeededShards(shards, seed=11),
        wds.ResampledShards(shards, seed=11, deterministic=True),
    )
    for _ in range(2):  # two epochs
        assert _draws(ours_, 50) == [d["url"] for d in itertools.islice(iter(theirs), 50)]


def test_mixed_dataset_checks_its_inputs(tmp_path):
    ours(tmp_path / "syn", [3])
    with pytest.raises(ValueError, match="ratio must be"):
        mixed_dataset(tmp_path / "syn", tmp_path / "syn", -1.0)
    with pytest.raises(ValueError, match="no such file"):
        mixed_dataset(tmp_path / "missing.tar", tmp_path / "syn", 0.1)


# --- mix --unpair: enough originals shards --------------------------------------------------


def write_pairs(directory, images_per_shard):
    """Pair shards as ``synth --pairs`` writes them: one shard per list of image ids, one
    sample per id (an id twice: two targets of one picture, one original)."""
    directory.mkdir(parents=True)
    n = 0
    for index, images in enumerate(images_per_shard):
        writer = ShardWriter(directory, index)
        for image in images:
            n += 1
            key = f"{image:04d}_0_t{n}"
            meta = {"image_id": image, "caption_id": 0, "original_caption": f"cap {image}"}
            orig = (("orig.jpg", _jpeg(image)),)
            writer.add(Sample(key, _jpeg(n), f"edited {n}", meta, orig), Status(str(image),
                       "written", None, "", key))  # fmt: skip
        writer.commit()
    return directory


def _digests(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).digest() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(
    ("total", "parts", "sizes"),
    [
        (10, 8, [2, 2, 1, 1, 1, 1, 1, 1]),
        (16, 8, [2] * 8),
        (7, 7, [1] * 7),
        (0, 3, [0, 0, 0]),
        (5, 1, [5]),
    ],
)
def test_even_split(total, parts, sizes):
    assert even_split(total, parts) == sizes


@pytest.mark.parametrize(
    ("pairs", "min_shards", "counts"),
    [
        # fewer pair shards than min_shards: the originals, in order, split evenly
        ([[1, 2, 2, 3, 4], [4, 5, 6, 7, 8, 9, 10]], 8, (2, 2, 1, 1, 1, 1, 1, 1)),
        ([[1, 2], [3]], 8, (1, 1, 1)),  # fewer originals than min_shards: one each
        ([[1], [1], [1]], 8, (1, 0, 0)),  # never fewer shards than pair shards
        # at least min_shards pair shards: one originals shard per pair shard, as before
        ([[1, 2, 2], [3], [], [3, 4, 5]], 4, (2, 1, 0, 2)),
        ([[1, 2, 2], [3], [], [3, 4, 5]], 1, (2, 1, 0, 2)),
    ],
)
def test_unpair_writes_at_least_min_shards(tmp_path, pairs, min_shards, counts):
    source = write_pairs(tmp_path / "pairs", pairs)
    out = tmp_path / "orig"
    written = write_originals(str(source), out, min_shards)
    assert written.counts == counts and written.pairs == sum(map(len, pairs))
    names = [f"orig-{i:06d}.tar" for i in range(len(counts))]
    assert [os.path.basename(s) for s in written.shards] == names
    assert json.loads((out / "sizes.json").read_text()) == dict(zip(names, counts, strict=True))
    assert [count_samples(str(out / n)) for n in names] == list(counts)  # stats files agree
    keys = [s["__key__"] for s in wds.WebDataset([str(out / n) for n in names], shardshuffle=False)]
    first_seen = list(dict.fromkeys(i for shard in pairs for i in shard))
    assert keys == [f"{i}_0" for i in first_seen]  # each original once, in order
    again = write_originals(str(source), tmp_path / "again", min_shards)
    assert again == Unpaired(tuple(s.replace("/orig/", "/again/") for s in written.shards),
                             counts, written.pairs)  # fmt: skip
    assert _digests(tmp_path / "again") == _digests(out)  # deterministic, byte for byte


def test_unpair_from_enough_pair_shards_is_the_same_bytes_whatever_min_shards(tmp_path):
    source = write_pairs(tmp_path / "pairs", [[1, 2], [2, 3], [4]])
    write_originals(str(source), tmp_path / "a", 3)
    write_originals(str(source), tmp_path / "b", 1)
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_unpair_min_shards_must_be_a_whole_number_from_1(tmp_path, bad):
    source = write_pairs(tmp_path / "pairs", [[1]])
    with pytest.raises(ValueError, match="min_shards must be an integer >= 1"):
        write_originals(str(source), tmp_path / "o", bad)


def test_cli_unpair_writes_eight_shards_by_default_and_min_shards_says_otherwise(tmp_path, capsys):
    source = write_pairs(tmp_path / "pairs", [list(range(1, 11)), list(range(11, 21))])
    argv = ["mix", "--synthetic", str(source), "--ratio", "1"]
    done = subprocess.run(  # as a user types it
        [sys.executable, "-m", "counterfactual", *argv, "--unpair", str(tmp_path / "o8")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"20 originals of 20 pair samples written to {tmp_path}/o8 "
                                  "in 8 shards")  # fmt: skip
    sizes = json.loads((tmp_path / "o8" / "sizes.json").read_text())
    assert list(sizes.values()) == [3, 3, 3, 3, 2, 2, 2, 2]
    assert main([*argv, "--unpair", str(tmp_path / "o2"), "--min-shards", "2"]) == 0
    assert " in 2 shards" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--unpair", str(tmp_path / "o0"), "--min-shards", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "counterfactual mix: error: argument --min-shards: 0 is not a whole number > 0"
    )
    assert not (tmp_path / "o0").exists()
