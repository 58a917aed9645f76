"""A run that cannot be fooled by the world around it (issue 24, points 1-3 and the temp-file half
of 5): damaged shards are found and made again, changed input is refused naming the shard and
what changed, OUT stays self-consistent after any sequence of runs, and a run removes only its
own temporary files. Every scenario runs the real CLI on small generated COCO-format data (and
one a generated WebDataset corpus with a tiny detector), damages or changes something, reruns
and checks the outcome, and ``counterfactual check`` agrees."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

import pytest
from bad_coco import synth_args

from counterfactual.cli import main
from counterfactual.readers.generate import generate_coco

RUN = ("--images-per-shard", "4", "--image-method", "blur", "--policy", "all")
RUN += ("--contact-sheet", "0")


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 20, seed=1, size=(160, 120))


@pytest.fixture(scope="module")
def clean(coco, tmp_path_factory):
    """An untouched run of ``coco``: what every repaired OUT must equal."""
    out = tmp_path_factory.mktemp("clean") / "out"
    assert main(synth_args(coco, out, *RUN)) == 0
    return out


def _copy(clean: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(clean, out)
    return out


def _synth(coco, out, capsys, *extra) -> tuple[int, str, str]:
    code = main(synth_args(coco, out, *RUN, *extra))
    got = capsys.readouterr()
    return code, got.out, got.err


def _check(out, capsys) -> tuple[int, list[str]]:
    code = main(["check", str(out)])
    return code, capsys.readouterr().out.strip().splitlines()


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.tar"))}


def _agrees(out: Path, clean: Path) -> None:
    """OUT holds the clean run's shards and records."""
    assert _shards(out) == _shards(clean)
    assert (out / "status.jsonl").read_bytes() == (clean / "status.jsonl").read_bytes()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["shards"] == len(_shards(clean))


def _flip(path: Path, at: int = 2000) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


# -- 1. verified shards --------------------------------------------------------------------


def test_a_stats_file_records_size_and_sha256(clean):
    import hashlib

    for tar in sorted(clean.glob("shard-*.tar")):
        stats = json.loads(tar.with_name(tar.stem + "_stats.json").read_text())
        assert stats["size"] == tar.stat().st_size
        assert stats["sha256"] == hashlib.sha256(tar.read_bytes()).hexdigest()
        assert len(stats["status"]) >= stats["count"] and stats["config"]
        assert set(stats["inputs"]) == {"ids", "annotations", "sizes", "stamps"}


@pytest.mark.parametrize("damage", ["truncated", "emptied"])
def test_a_damaged_shard_is_found_by_size_and_made_again(coco, clean, tmp_path, capsys, damage):
    out = _copy(clean, tmp_path)
    tar = out / "shard-000001.tar"
    if damage == "truncated":
        tar.write_bytes(tar.read_bytes()[:10000])
    else:
        tar.write_bytes(b"")
    code, lines = _check(out, capsys)
    assert code == 1 and lines[0].startswith("shard-000001.tar: damaged: "), lines
    assert "1 problem(s)" in lines[-1]
    code, stdout, err = _synth(coco, out, capsys)
    assert code == 0
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning == [
        f"warning: {tar} is damaged ({0 if damage == 'emptied' else 10000:,} bytes, its stats "
        f"file says {(clean / tar.name).stat().st_size:,} (truncated or damaged)); making it again"
    ]
    assert "(4 from an earlier run)" in stdout
    _agrees(out, clean)
    assert _check(out, capsys)[0] == 0


def test_a_flipped_byte_is_found_by_hash(coco, clean, tmp_path, capsys):
    """Same size, other bytes: ``check`` finds it, a plain resume (sizes only) keeps it, a
    resume with ``--verify-shards`` makes it again."""
    out = _copy(clean, tmp_path)
    _flip(out / "shard-000002.tar")
    code, lines = _check(out, capsys)
    assert code == 1
    assert lines[0] == (
        "shard-000002.tar: damaged: its SHA-256 is not the one its stats file records "
        "(bytes changed)"
    )
    assert main(["check", str(out), "--sizes-only"]) == 0  # what a plain resume sees
    capsys.readouterr()
    code, stdout, err = _synth(coco, out, capsys)
    assert code == 0 and "(5 from an earlier run)" in stdout and "warning" not in err
    code, stdout, err = _synth(coco, out, capsys, "--verify-shards")
    assert code == 0 and "(4 from an earlier run)" in stdout
    assert "shard-000002.tar is damaged (its SHA-256" in err
    _agrees(out, clean)
    assert _check(out, capsys)[0] == 0


def test_an_old_stats_file_without_size_and_hash_still_reads(coco, clean, tmp_path, capsys):
    out = _copy(clean, tmp_path)
    for stats_file in out.glob("shard-*_stats.json"):
        stats = json.loads(stats_file.read_text())
        for key in ("size", "sha256", "config", "inputs"):
            del stats[key]
        stats_file.write_text(json.dumps(stats))
    assert _check(out, capsys)[0] == 0  # its tar read, its keys compared
    code, stdout, _ = _synth(coco, out, capsys)
    assert code == 0 and "(5 from an earlier run)" in stdout
    (out / "shard-000003.tar").write_bytes(b"")  # emptied: too short for a tar
    code, lines = _check(out, capsys)
    assert code == 1 and lines[0].startswith("shard-000003.tar: damaged: 0 bytes, too short")
    code, stdout, err = _synth(coco, out, capsys)
    assert (
        code == 0 and "(4 from an earlier run)" in stdout and "shard-000003.tar is damaged" in err
    )
    _agrees(out, clean)


# -- 2. true input fingerprints ------------------------------------------------------------


def test_another_coco_set_with_the_same_ids_is_refused(coco, clean, tmp_path, capsys):
    other = generate_coco(tmp_path / "other", 20, seed=2, size=(160, 120))
    ids = {im["id"] for im in json.loads(coco.instances.read_text())["images"]}
    assert ids == {im["id"] for im in json.loads(other.instances.read_text())["images"]}
    out = _copy(clean, tmp_path)
    code, _, err = _synth(other, out, capsys)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"counterfactual synth: error: {out / 'shard-000000.tar'} was made from other input "
        "than this run reads: the annotations of its images changed (boxes, classes or "
        "captions); use another --out, or delete the folder to start over"
    )
    _agrees(out, clean)  # nothing changed


def _pictures_copy(coco, tmp_path: Path):
    """The dataset copied with its modification times (``cp -p``)."""
    root = tmp_path / "coco"
    shutil.copytree(coco.instances.parent, root, copy_function=shutil.copy2)
    return type(coco)(root / coco.instances.name, root / coco.captions.name, root / "images")


def test_a_changed_picture_is_refused(coco, clean, tmp_path, capsys):
    data = _pictures_copy(coco, tmp_path)
    out = _copy(clean, tmp_path)
    code, stdout, _ = _synth(data, out, capsys)  # the same pictures elsewhere: resumed
    assert code == 0 and "(5 from an earlier run)" in stdout
    picture = data.images / "000000000006.jpg"  # in shard 1
    picture.write_bytes(picture.read_bytes() + b"\0")
    code, _, err = _synth(data, out, capsys)
    assert code == 2
    assert f"{out / 'shard-000001.tar'} was made from other input than this run reads: its " in err
    assert "input files changed (their sizes differ)" in err


def test_changed_input_is_refused_before_any_shard_is_made(coco, clean, tmp_path, capsys):
    """Shard 1 unfinished, shard 3's picture changed: the refusal comes first, so no shard is
    made from the new input beside the old ones."""
    data = _pictures_copy(coco, tmp_path)
    out = _copy(clean, tmp_path)
    for name in ("shard-000001.tar", "shard-000001_stats.json"):
        (out / name).unlink()
    picture = data.images / "000000000014.jpg"  # in shard 3
    picture.write_bytes(picture.read_bytes() + b"\0")
    code, _, err = _synth(data, out, capsys)
    assert code == 2 and f"{out / 'shard-000003.tar'} was made from other input" in err
    assert not (out / "shard-000001.tar").exists()
    assert not (out / "shard-000001_stats.json").exists()


def test_a_touched_picture_is_refused_unless_contents_are_compared(coco, tmp_path, capsys):
    data = _pictures_copy(coco, tmp_path)
    out = tmp_path / "hashed"
    assert _synth(data, out, capsys, "--hash-inputs")[0] == 0
    plain = tmp_path / "plain"
    assert _synth(data, plain, capsys)[0] == 0
    picture = data.images / "000000000010.jpg"  # in shard 2
    os.utime(picture, (1, 1))  # the same bytes, another mtime (a copy without -p)
    code, _, err = _synth(data, plain, capsys)
    assert code == 2 and f"{plain / 'shard-000002.tar'} was made from other input" in err
    assert "modification times or ETags differ; --hash-inputs compares contents instead" in err
    code, stdout, _ = _synth(data, out, capsys, "--hash-inputs")
    assert code == 0 and "(5 from an earlier run)" in stdout
    stats = json.loads((out / "shard-000002_stats.json").read_text())
    assert "content" in stats["inputs"]
    data_bytes = bytearray(picture.read_bytes())
    data_bytes[-3] ^= 0x01  # same size, other contents
    picture.write_bytes(bytes(data_bytes))
    code, _, err = _synth(data, out, capsys, "--hash-inputs")
    assert code == 2 and "its input files' contents changed" in err


@pytest.mark.slow
def test_another_webdataset_corpus_with_the_same_tar_names_is_refused(tmp_path, capsys):
    from counterfactual.testing import build_tiny_owlv2
    from counterfactual.testing.corpora import demo_samples, write_wds

    owl = build_tiny_owlv2(tmp_path / "owl", grid_boxes=True)
    samples = demo_samples(tmp_path / "demo", shrink=4)
    corpus = tmp_path / "corpus"
    pattern = write_wds(samples[:6], corpus, per_shard=3)
    args = ["synth", "--dataset", "wds", "--root", str(corpus), "--out", str(tmp_path / "out")]
    args += ["--detector-model", str(owl), "--detect-threshold", "0", "--image-method", "blur"]
    args += ["--contact-sheet", "0"]
    assert main(args) == 0
    capsys.readouterr()
    shutil.rmtree(corpus)
    assert write_wds(samples[2:], corpus, per_shard=3) == pattern  # the same names
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'out' / 'shard-000000.tar'} was made from other input than this" in err
    assert "its input files changed (their sizes differ)" in err


# -- 3. OUT self-consistent after any sequence of runs -------------------------------------


def test_a_smaller_limit_rerun_is_refused_and_changes_nothing(coco, clean, tmp_path, capsys):
    out = _copy(clean, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, _, err = _synth(coco, out, capsys, "--limit", "8")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"counterfactual synth: error: {out} holds 3 shard(s) beyond the 2 this run makes "
        "(shard-000002.tar, ...), made by an earlier run over more input (another --limit or "
        "input): status.jsonl, manifest.json and README.md would list them nowhere. Rerun with "
        "that input, use another --out, or delete the folder to start over"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _check(out, capsys)[0] == 0


def test_a_larger_limit_rerun_grows_the_run(coco, clean, tmp_path, capsys):
    out = tmp_path / "out"
    assert _synth(coco, out, capsys, "--limit", "8")[0] == 0
    code, stdout, _ = _synth(coco, out, capsys)
    assert code == 0 and "5 shards (2 from an earlier run)" in stdout
    _agrees(out, clean)
    assert _check(out, capsys)[0] == 0


def test_a_missing_run_file_is_rebuilt_from_the_shards_or_refused(coco, clean, tmp_path, capsys):
    out = _copy(clean, tmp_path)
    (out / "run.json").unlink()
    code, stdout, err = _synth(coco, out, capsys, "--image-method", "zero")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"counterfactual synth: error: {out} holds committed shards but no run.json (the config "
        "they were made with), and they do not record this config; use another --out, or "
        "delete the folder to start over"
    )
    assert not (out / "run.json").exists() and _shards(out) == _shards(clean)
    code, stdout, err = _synth(coco, out, capsys)
    assert code == 0 and "(5 from an earlier run)" in stdout
    assert f"{out / 'run.json'} was missing: rebuilt from the shards" in err
    assert (out / "run.json").read_bytes() == (clean / "run.json").read_bytes()
    _agrees(out, clean)


def test_a_check_finds_records_that_disagree_with_the_shards(clean, tmp_path, capsys):
    out = _copy(clean, tmp_path)
    (out / "shard-000005.tar").write_bytes((out / "shard-000000.tar").read_bytes())
    stats = json.loads((out / "shard-000000_stats.json").read_text())
    (out / "shard-000005_stats.json").write_text(json.dumps({**stats, "shard": "shard-000005.tar"}))
    code, lines = _check(out, capsys)
    assert code == 1
    assert any(line.startswith("status.jsonl: ") for line in lines), lines
    assert "manifest.json: shards is 5, the folder holds 6" in lines
    assert any(line.startswith("README.md: lists 5 shards") for line in lines), lines


# -- 5. temporary files: the project's own, and a run's by its token -----------------------


def test_only_the_projects_own_temporary_files_are_removed(coco, clean, tmp_path, capsys):
    out = _copy(clean, tmp_path)
    (out / "shard-000004_stats.json").unlink()  # as if killed before the commit
    notes = {"notes.tmp": b"mine", "shard-000004.tar.tmp": b"not our name either"}
    for name, data in notes.items():
        (out / name).write_bytes(data)
    leftovers = ["shard-000004.tar.0123456789ab.tmp", "status.jsonl.0123456789ab-01234567.tmp"]
    for name in leftovers:  # a dead run's (no lock: nobody holds OUT)
        (out / name).write_bytes(b"half")
    code, stdout, _ = _synth(coco, out, capsys)
    assert code == 0 and "(4 from an earlier run)" in stdout
    for name, data in notes.items():
        assert (out / name).read_bytes() == data
    assert not [name for name in leftovers if (out / name).exists()]
    _agrees(out, clean)


def test_a_takeover_leaves_the_old_holders_temporary_files_alone(coco, clean, tmp_path, capsys):
    """A holder on another host whose heartbeat went stale may still live: the run that takes
    its lock over removes no file carrying its token (its own cleanup removes only its own)."""
    out = _copy(clean, tmp_path)
    (out / "shard-000004_stats.json").unlink()
    token = "feedfacecafe" + "0" * 20
    lock = {
        "host": socket.gethostname() + "-other",
        "pid": 12345,
        "pid_start": None,
        "runner": "ray",
        "started": "2020-01-01T00:00:00Z",
        "heartbeat": "2020-01-01T00:00:00Z",
        "token": token,
        "command": "counterfactual synth",
    }
    (out / "run.lock").write_text(json.dumps(lock))
    theirs = out / f"shard-000004.tar.{token[:12]}-89abcdef.tmp"
    theirs.write_bytes(b"being written by the other driver")
    code, stdout, err = _synth(coco, out, capsys)
    assert code == 0 and "(4 from an earlier run)" in stdout
    assert "took over" in err or "stale" in err, err
    assert theirs.read_bytes() == b"being written by the other driver"
    assert not (out / "run.lock").exists()
    _agrees(out, clean)


def test_a_run_cleans_up_only_its_own_temporary_files(tmp_path):
    """A retried worker's leftover carries this run's token and goes at the end; a temporary
    file of another driver (one that took this run's lock over, say) stays."""
    from test_stages import records

    from counterfactual.image import ImageConfig
    from counterfactual.synth.plan import SynthConfig
    from counterfactual.synth.runner import run_local

    out = tmp_path / "out"
    made: dict[str, Path] = {}

    def on_shard(done) -> None:
        if made:
            return
        token = json.loads((out / "run.lock").read_text())["token"]
        made["ours"] = out / f"shard-000001.tar.{token[:12]}-0badc0de.tmp"
        made["theirs"] = out / "shard-000001.tar.0123456789ab-0badc0de.tmp"
        for path in made.values():
            path.write_bytes(b"half a shard")

    config = SynthConfig(image=ImageConfig(method="zero"), images_per_shard=2)
    result = run_local(records(tmp_path, 4), out, config, on_shard=on_shard)
    assert len(result.shards) == 2 and made
    assert not made["ours"].exists()
    assert made["theirs"].read_bytes() == b"half a shard"


def test_a_local_commit_is_fsynced_tar_and_folder_before_the_stats_file(tmp_path, monkeypatch):
    from counterfactual import fs
    from counterfactual.records import Status
    from counterfactual.shards.shards import Sample, ShardWriter

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(fs.os, "fsync", fsync)
    writer = ShardWriter(tmp_path, 0, run="ab" * 16)
    writer.add(Sample("k", b"jpeg", "a caption", {}), Status("k", "written", key="k"))
    writer.commit()
    names = [Path(p).name if Path(p) != tmp_path else "OUT" for p in synced]
    assert [n.split(".", 2)[:2] for n in names[::2]] == [
        ["shard-000000", "tar"],
        ["shard-000000_stats", "json"],
    ]
    assert names[0].startswith(f"shard-000000.tar.{'ab' * 6}-")  # its run token
    assert names[1::2] == ["OUT", "OUT"]  # the renames made durable
