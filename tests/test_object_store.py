"""``counterfactual synth`` with its input and its OUT on S3 (a moto server on 127.0.0.1), through
the command a user types: the same shards and status record as a run on local files, with
either runner; ``run.lock`` on the store; resume after a SIGKILL of a run that wrote to S3.

Ray's workers read S3 with the ``AWS_*`` variables of the process that started the local Ray:
the ``ray_s3`` fixture starts it after the ``s3`` fixture set them (a Ray already running in this
process is shut down first, since its workers would not see them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_coco import make_bad_coco, synth_args
from shard_files import run_outputs

from counterfactual.cli import main
from counterfactual.readers.generate import CocoFiles, generate_coco

pytestmark = pytest.mark.slow

KILLING_RUN = Path(__file__).with_name("killing_run.py")
BLUR = ("--image-method", "blur", "--policy", "all", "--max-pixels", "1000000")


def assert_same_outputs(ours: Path, theirs: Path) -> None:
    a, b = run_outputs(ours), run_outputs(theirs)
    assert sorted(a) == sorted(b) and len(a) > 4
    for name in a:
        assert a[name] == b[name], name


def on_s3(s3, files: CocoFiles, name: str) -> CocoFiles:
    """``files`` uploaded to a fresh bucket, as URLs (str in the Path fields)."""
    url = f"{s3.bucket()}/{name}"
    root = files.images.parent
    s3.upload(root, url)
    return CocoFiles(
        f"{url}/{files.instances.relative_to(root)}",  # type: ignore[arg-type]
        f"{url}/{files.captions.relative_to(root)}",  # type: ignore[arg-type]
        f"{url}/{files.images.relative_to(root)}",  # type: ignore[arg-type]
    )


def listing(s3, url: str) -> list[str]:
    fs = s3._fs()
    prefix = url.removeprefix("s3://")
    return sorted(k[len(prefix) + 1 :] for k in fs.find(prefix))


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"), n=14)


@pytest.fixture(scope="module")
def coco_s3(s3, coco):
    return on_s3(s3, coco, "coco")


@pytest.fixture(scope="module")
def local_run(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    assert (
        main(synth_args(coco, out, *BLUR, "--images-per-shard", "3", "--contact-sheet", "0")) == 0
    )
    return out


@pytest.fixture(scope="module")
def ray_s3(s3, module_ray):
    """The module's local Ray, started after ``s3`` set ``AWS_*``, so its workers inherit them."""
    return module_ray


def test_local_runner_reads_and_writes_s3_with_the_bytes_of_a_local_run(
    s3, coco_s3, local_run, tmp_path, capsys
):
    out = f"{s3.bucket()}/run"
    extra = (*BLUR, "--images-per-shard", "3", "--contact-sheet", "2")
    assert main(synth_args(coco_s3, out, *extra)) == 0
    names = listing(s3, out)
    assert "run.lock" not in names and not [n for n in names if n.endswith(".tmp")]
    assert {"run.json", "status.jsonl", "manifest.json", "contact_sheet.png"} <= set(names)
    shards = [n for n in names if n.startswith("shard-") and n.endswith(".tar")]
    assert len(shards) == 4 and len([n for n in names if n.endswith("_stats.json")]) == 4
    s3.download(out, tmp_path / "back")
    assert_same_outputs(tmp_path / "back", local_run)
    manifest = json.loads((tmp_path / "back" / "manifest.json").read_text())
    assert manifest["runner"] == "local" and manifest["shards"] == 4
    assert manifest["data"]["instances"] == coco_s3.instances
    assert [r["runner"] for r in manifest["runs"]] == ["local"]
    # a rerun resumes every shard from the store and rewrites nothing
    capsys.readouterr()
    assert (
        main(synth_args(coco_s3, out, *BLUR, "--images-per-shard", "3", "--contact-sheet", "0"))
        == 0
    )
    assert "4 shards (4 from an earlier run)" in capsys.readouterr().out
    # another config into the same OUT on S3 is refused
    assert main(synth_args(coco_s3, out, "--image-method", "zero", "--images-per-shard", "3")) == 2
    assert "different config" in capsys.readouterr().err


def test_ray_runner_reads_and_writes_s3_with_the_bytes_of_a_local_run(
    s3, ray_s3, coco_s3, local_run, tmp_path
):
    out = f"{s3.bucket()}/run"
    extra = (*BLUR, "--images-per-shard", "3", "--contact-sheet", "0", "--runner", "ray")
    assert main(synth_args(coco_s3, out, *extra)) == 0
    names = listing(s3, out)
    assert "run.lock" not in names and not [n for n in names if n.endswith(".tmp")]
    s3.download(out, tmp_path / "back")
    assert_same_outputs(tmp_path / "back", local_run)
    manifest = json.loads((tmp_path / "back" / "manifest.json").read_text())
    assert manifest["runner"] == "ray" and manifest["ray"]["cpus"] == 2
    assert sum(manifest["items_per_node"].values()) == manifest["items"]


def _kill_run(files: CocoFiles, out: str, n: int, log: Path) -> int:
    """The real command in another process, which SIGKILLs itself inside shard ``n + 1``."""
    cmd = [sys.executable, str(KILLING_RUN), "local", str(n), *synth_args(files, out, *KILL)]
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=240)
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]
    return proc.returncode


KILL = (
    "--image-method",
    "blur",
    "--images-per-shard",
    "4",
    "--batch-size",
    "2",
    "--contact-sheet",
    "0",
)


def test_resume_on_s3_after_sigkill(s3, tmp_path, capsys):
    files = generate_coco(tmp_path / "coco", 24, seed=3, size=(320, 240))
    remote = on_s3(s3, files, "coco")
    clean = tmp_path / "clean"
    assert main(synth_args(files, clean, *KILL)) == 0
    total = len(list(clean.glob("shard-*.tar")))
    assert total == 6
    out = f"{s3.bucket()}/run"
    _kill_run(remote, out, 2, tmp_path / "killed.log")
    fs = s3._fs()
    names = listing(s3, out)
    committed = sorted(n for n in names if n.endswith("_stats.json"))
    assert committed == ["shard-000000_stats.json", "shard-000001_stats.json"]
    assert "status.jsonl" not in names and "manifest.json" not in names
    lock = json.loads(fs.cat(f"{out.removeprefix('s3://')}/run.lock"))  # the dead run's
    assert lock["runner"] == "local" and lock["pid"] != os.getpid()
    before = {n: fs.info(f"{out.removeprefix('s3://')}/{n}")["LastModified"] for n in names}
    time.sleep(1.1)  # S3 times are to the second: a rewrite would show
    capsys.readouterr()
    assert main(synth_args(remote, out, *KILL)) == 0
    err = capsys.readouterr().err
    assert "took over the lock of a synth that is no longer running" in err
    assert f"pid {lock['pid']}" in err
    after = {
        n: fs.info(f"{out.removeprefix('s3://')}/{n}")["LastModified"] for n in listing(s3, out)
    }
    for name in ("shard-000000.tar", "shard-000001.tar", *committed):
        assert after[name] == before[name], name  # kept, not redone
    assert "run.lock" not in after and not [n for n in after if n.endswith(".tmp")]
    s3.download(out, tmp_path / "back")
    assert_same_outputs(tmp_path / "back", clean)
    manifest = json.loads((tmp_path / "back" / "manifest.json").read_text())
    assert manifest["shards_resumed"] == 2 and manifest["shards"] == total
    # a shard damaged on the store: check finds it, the rerun makes it again
    assert main(["check", out]) == 0
    inside = out.removeprefix("s3://")
    fs.pipe(f"{inside}/shard-000001.tar", fs.cat(f"{inside}/shard-000001.tar")[:5000])
    capsys.readouterr()
    assert main(["check", out]) == 1
    assert capsys.readouterr().out.startswith("shard-000001.tar: damaged: 5,000 bytes")
    assert main(synth_args(remote, out, *KILL)) == 0
    assert f"{out}/shard-000001.tar is damaged" in capsys.readouterr().err
    assert main(["check", out]) == 0
    s3.download(out, tmp_path / "again")
    assert_same_outputs(tmp_path / "again", clean)


def test_eval_reads_its_queries_from_s3(s3, tmp_path, capsys):
    """``eval --queries s3://.../run``: the shards of a synth run on S3 give the report of the
    same shards on local disk."""
    from tiny_clip import build_tiny_clip

    clip = build_tiny_clip(tmp_path / "clip")
    queries = tmp_path / "demo"
    synth = ["synth", "--dataset", "demo", "--out", str(queries), "--image-method", "blur"]
    assert main([*synth, "--contact-sheet", "0"]) == 0
    url = f"{s3.bucket()}/demo"
    s3.upload(queries, url)
    reports = {}
    for name, where in (("local", str(queries)), ("s3", url)):
        report = tmp_path / f"report-{name}"
        argv = ["eval", "--queries", where, "--root", str(queries / "demo-data")]
        argv += ["--out", str(report), "--grid", "0", "--model", f"hf-clip:{clip}"]
        assert main(argv) == 0, capsys.readouterr().err
        reports[name] = json.loads((report / "report.json").read_text())
    local, remote = reports["local"], reports["s3"]
    assert remote.pop("queries") == url and local.pop("queries") == str(queries)
    for model in (*local["models"], *remote["models"]):
        model.pop("seconds")  # how long: not the result
    assert remote["models"][0]["queries"] == 6
    assert remote == local


def test_an_input_object_is_stamped_by_its_etag_from_one_listing(s3, tmp_path):
    from counterfactual.readers.spec import InputStamps

    (tmp_path / "a.jpg").write_bytes(b"one")
    (tmp_path / "b.jpg").write_bytes(b"three")
    url = f"{s3.bucket()}/pics"
    s3.upload(tmp_path, url)
    fs = s3._fs()
    stamps = InputStamps()
    a, b = stamps.of(f"{url}/a.jpg"), stamps.of(f"{url}/b.jpg")
    assert (a.size, a.stamp) == (3, fs.info(f"{url.removeprefix('s3://')}/a.jpg")["ETag"])
    assert b.size == 5 and b.stamp != a.stamp and list(stamps._listings) == [url]
    assert stamps.of(f"{url}/gone.jpg").size == -1
    assert InputStamps(content=True).of(f"{url}/a.jpg").content == (
        "7692c3ad3540bb803c020b3aee66cd8887123234ea0c6e7143c0add73ff431ed"  # sha256("one")
    )
