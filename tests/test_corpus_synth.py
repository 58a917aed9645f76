"""``counterfactual synth`` on corpora without boxes (WebDataset, Parquet, CSV) with a tiny
random OWLv2 saved to disk and loaded by path, as a user's detector is: detect -> select ->
erase -> rewrite -> shard, the same shard contract, status record and resume as COCO, in
process and on Ray."""

from __future__ import annotations

import json

import pytest
import webdataset as wds
from shard_files import shard_members

from counterfactual.cli import main
from counterfactual.testing import build_tiny_owlv2
from counterfactual.testing.corpora import demo_samples, write_csv, write_parquet, write_wds

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def owl(tmp_path_factory):
    return build_tiny_owlv2(tmp_path_factory.mktemp("owl") / "owlv2", grid_boxes=True)


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    good = demo_samples(tmp_path_factory.mktemp("demo"), shrink=4)
    broken = [
        ("garbage", b"not a picture", "A dog on a bench next to a person.", {}),
        ("nocaption", good[0][1], None, {}),
        ("nopicture", None, "A cat on a couch.", {}),
    ]
    return good[:4] + broken + good[4:]


def _args(owl, dataset, root, out, *extra):
    return [
        "synth",
        "--dataset",
        dataset,
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
        "--contact-sheet",
        "2",
        *extra,
    ]


def _status(out):
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def local_run(owl, samples, tmp_path_factory):
    """The samples as WebDataset tars of 4 (``corpus/{00000..00002}.tar``) and their run on the
    local runner, which the runs on Ray and on S3 are compared with (the tests only read it)."""
    where = tmp_path_factory.mktemp("wds")
    pattern = write_wds(samples, where / "corpus", per_shard=4)
    out = where / "local"
    assert main(_args(owl, "wds", pattern, out)) == 0
    return pattern, out


def test_webdataset_corpus_end_to_end_and_resume(owl, samples, tmp_path):
    pattern = write_wds(samples, tmp_path / "corpus", per_shard=4)
    assert pattern.endswith("{00000..00002}.tar")
    out = tmp_path / "out"
    assert main(_args(owl, "wds", pattern, out)) == 0
    rows = _status(out)
    by_id = {r["image_id"]: r for r in rows}
    # every input sample has exactly one row, with its reason when nothing was written
    assert sorted(by_id) == sorted(s[0] for s in samples) and len(rows) == len(samples)
    assert (by_id["garbage"]["status"], by_id["garbage"]["reason"]) == ("failed", "decode-error")
    assert by_id["nocaption"]["reason"] == "no-caption"
    assert by_id["nopicture"]["reason"] == "missing-image"
    written = [r for r in rows if r["status"] == "written"]
    assert written, "the tiny detector should make at least one plan at threshold 0"
    assert {r["reason"] for r in rows if r["status"] == "skipped"} <= {
        "caption-unchanged",
        "fewer-than-two-classes",
        "no-removable-class",
    }
    # the shards are WebDataset shards: the loader reads back every written sample
    shards = sorted(str(p) for p in out.glob("shard-*.tar"))
    loaded = list(wds.WebDataset(shards, shardshuffle=False).decode("rgb"))
    assert sorted(s["__key__"] for s in loaded) == sorted(r["key"] for r in written)
    for sample in loaded:
        meta = sample["json"]
        assert meta["dataset"] == "wds" and meta["file"].endswith(f"{meta['image_id']}.jpg")
        assert meta["detector"]["model"] == str(owl)
        assert meta["detector"]["queries"] == "caption"
        assert meta["objects"] and all(0 <= o["score"] <= 1 for o in meta["objects"])
        categories = {o["category"] for o in meta["objects"]}
        assert set(meta["plan"]["removed"]) | set(meta["plan"]["kept"]) <= categories
        assert sample["jpg"].shape[:2] == (meta["height"], meta["width"])
        assert sample["txt"] == meta["caption"] != meta["original_caption"]
        assert meta["source"]["kind"] == "tar" and meta["source"]["size"] > 0
    # the audit finds each original inside its tar from the sample's json, without --root
    assert main(["report", str(out)]) == 0
    page = (out / "report" / "index.html").read_text()
    assert "original not found" not in page and "original not loaded" not in page
    assert page.count("-original.jpg") >= len(written)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["detect"]["model"] == str(owl)
    assert manifest["config"]["text"]["skip_unchanged"] is True  # on by default here
    assert (out / "contact_sheet.png").exists()
    before = shard_members(out)
    # a rerun resumes every shard and changes nothing
    assert main(_args(owl, "wds", pattern, out)) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards_resumed"] == manifest["shards"] == 3
    assert shard_members(out) == before
    # another detector setting into the same folder is refused
    assert main(_args(owl, "wds", pattern, out, "--detect-nms-iou", "0.3")) == 2


def test_parquet_and_csv_give_the_samples_of_the_webdataset_run(owl, samples, tmp_path):
    """Same pictures and captions under the same ids: the same statuses and pixels, whichever
    container they come in."""
    good = [s for s in samples if s[1] is not None and s[2] is not None and s[0] != "garbage"]
    runs = {}
    pattern = write_wds(good, tmp_path / "wds", per_shard=3)
    assert main(_args(owl, "wds", pattern, tmp_path / "o-wds")) == 0
    runs["wds"] = tmp_path / "o-wds"
    for images_as in ("bytes", "struct", "paths"):
        table = write_parquet(good, tmp_path / f"pq-{images_as}" / "part-0.parquet", images_as)
        out = tmp_path / f"o-pq-{images_as}"
        images = ("--images", str(table.parent / "images")) if images_as == "paths" else ()
        assert main(_args(owl, "parquet", table, out, *images)) == 0
        runs[f"parquet-{images_as}"] = out
    table = write_csv(good, tmp_path / "csv" / "pairs.csv", tmp_path / "pictures")
    out = tmp_path / "o-csv"
    assert main(_args(owl, "csv", table, out, "--images", str(tmp_path / "pictures"))) == 0
    runs["csv"] = out

    def rows(out):
        return [(r["image_id"], r["status"], r["reason"], r["key"]) for r in _status(out)]

    def pixels(out):
        return {k: v for k, v in shard_members(out).items() if k.endswith((".jpg", ".txt"))}

    reference = runs.pop("wds")
    assert any(r[1] == "written" for r in rows(reference))
    for name, out in runs.items():
        assert rows(out) == rows(reference), name
        assert pixels(out) == pixels(reference), name


def test_ray_runner_matches_the_local_run(owl, local_run, tmp_path):
    pattern, local = local_run
    ray = tmp_path / "ray"
    extra = ("--runner", "ray", "--num-cpus", "2", "--no-dashboard")
    assert main(_args(owl, "wds", pattern, ray, *extra)) == 0
    assert _status(ray) == _status(local)
    manifest = json.loads((ray / "manifest.json").read_text())
    assert manifest["ray"]["stages"] == [
        ["decode"],
        ["detect"],
        ["select", "rewrite", "edit", "encode"],
    ]
    a, b = shard_members(local), shard_members(ray)
    assert a.keys() == b.keys()
    assert {k: v for k, v in a.items() if k.endswith(".txt")} == {
        k: v for k, v in b.items() if k.endswith(".txt")
    }


def test_corpus_needs_root_and_has_no_dataset_boxes(owl, samples, tmp_path, capsys):
    owl_args = ["--detector-model", str(owl)]  # a local model: the missing root answers first
    assert main(["synth", "--dataset", "wds", *owl_args, "--out", str(tmp_path / "o")]) == 2
    assert "needs --root" in capsys.readouterr().err
    args = ["synth", "--dataset", "csv", "--root", str(tmp_path / "x.csv"), "--boxes", "dataset"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "has no boxes" in capsys.readouterr().err
    assert main(_args(owl, "wds", tmp_path / "none-{0..3}.tar", tmp_path / "o2")) == 2
    assert "none-{0..3}.tar" in capsys.readouterr().err  # matches nothing: a config error
    write_wds(samples[:2], tmp_path / "some", per_shard=2)  # some/00000.tar only
    pattern = tmp_path / "some" / "{00000..00003}.tar"
    assert main(_args(owl, "wds", pattern, tmp_path / "o3")) == 0  # each missing tar: a row
    rows = _status(tmp_path / "o3")  # the missing tars' rows come from their workers
    missing = [r for r in rows if r["reason"] == "missing-file"]
    assert sorted(r["image_id"] for r in missing) == [
        str(tmp_path / "some" / f"{i:05d}.tar") for i in (1, 2, 3)
    ]
    assert {r["image_id"] for r in rows if r not in missing} == {samples[0][0], samples[1][0]}


def test_webdataset_corpus_read_from_s3_equals_the_local_run(owl, local_run, s3, tmp_path):
    """The corpus's tars on S3 (listed by the driver, read with ranged reads by the worker),
    OUT on S3: the samples of the run on local files; only the source path in the json differs."""
    _, local = local_run
    corpus = local.parent / "corpus"
    bucket = s3.bucket()
    s3.upload(corpus, f"{bucket}/corpus")
    url_pattern = f"{bucket}/corpus/{{00000..00002}}.tar"
    assert main(_args(owl, "wds", url_pattern, f"{bucket}/out")) == 0
    back = tmp_path / "back"
    s3.download(f"{bucket}/out", back)
    assert not (back / "run.lock").exists() and (back / "contact_sheet.png").exists()
    assert _status(back) == _status(local)
    assert any(r["status"] == "written" for r in _status(back))
    ours, theirs = shard_members(back), shard_members(local)
    assert ours.keys() == theirs.keys()
    for name, data in ours.items():
        if not name.endswith(".json"):
            assert data == theirs[name], name
            continue
        a, b = json.loads(data), json.loads(theirs[name])
        tar = a["source"].pop("path").removeprefix(f"{bucket}/corpus/")  # the tar's URL
        assert tar == b["source"].pop("path").removeprefix(f"{corpus}/")
        assert tar.endswith(".tar") and "/" not in tar
        assert a == b, name
    manifest = json.loads((back / "manifest.json").read_text())
    assert manifest["data"]["root"] == url_pattern and manifest["shards"] == 3
