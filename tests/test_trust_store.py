"""An object store that starts refusing or throttling in the middle of a run, against moto's
real S3 server behind a fault-injecting HTTP proxy (:class:`s3server.FaultProxy`: after N
requests it answers ``403 AccessDenied`` or ``503 SlowDown`` to every further one), tried as
processes through ``counterfactual synth``: the run ends with one line that names the
endpoint, the request refused (what and which ``s3://bucket/key``), the HTTP status and S3's
code, the cause and the rerun, exit 2; once the fault is gone the same command resumes and
completes (the slow tests, a run each way). Retries are cut to two tries through ``COUNTERFACTUAL_S3_ATTEMPTS``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bad_coco import synth_args
from s3server import FaultProxy, S3Server

from counterfactual.readers.generate import CocoFiles, generate_coco

pytest.importorskip("s3fs")
pytest.importorskip("moto")

ROOT = Path(__file__).resolve().parents[1]
EXTRA = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0")
IMAGES = 12
SHARDS = IMAGES // 3
LIMITS = {
    "COUNTERFACTUAL_S3_CONNECT_TIMEOUT": "2",
    "COUNTERFACTUAL_S3_READ_TIMEOUT": "10",
    "COUNTERFACTUAL_S3_ATTEMPTS": "2",
}
KEYS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
DENIED = "access denied: the credentials may not do this"
THROTTLED = "throttled: the store asks for fewer requests per second, still after 2 tries"
RERUN = "rerun the same command to resume"


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> CocoFiles:
    return generate_coco(tmp_path_factory.mktemp("coco"), IMAGES, seed=4, size=(160, 120))


@pytest.fixture
def faults(s3: S3Server) -> Iterator[Callable[..., FaultProxy]]:
    """Start :class:`FaultProxy` objects in front of the session's moto server; each is
    stopped at the end of the test."""
    started: list[FaultProxy] = []

    def start(status: int, code: str, after: int, matches: Callable[[str, str], bool]):
        proxy = FaultProxy(s3.endpoint, status, code, after, matches).start()
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def writes_under(prefix: str) -> Callable[[str, str], bool]:
    """Requests that write or delete objects under ``/bucket/prefix`` (path-style)."""
    return lambda method, path: method in ("PUT", "POST", "DELETE") and path.startswith(prefix)


def reads_under(prefix: str) -> Callable[[str, str], bool]:
    """``GET`` requests of objects under ``/bucket/prefix`` (path-style)."""
    return lambda method, path: method == "GET" and path.startswith(prefix)


def _env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {
        **env,
        **KEYS,
        **LIMITS,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "PYTHONPATH": pythonpath,
    }


def synth(args: list[str], endpoint: str) -> tuple[int, str, float]:
    """``counterfactual synth ARGS`` as a process: exit code, stdout + stderr, seconds."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        env=_env(endpoint),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def one_error_line(text: str, *parts: str) -> str:
    """The run's last line is its one error line, holding ``parts``; nothing else is wrong."""
    assert "Traceback" not in text, text
    line = text.rstrip().splitlines()[-1]
    assert line.startswith("counterfactual synth: error: object store "), text
    assert sum("error:" in x for x in text.splitlines()) == 1, text
    assert len(line) <= 400 + len("counterfactual synth: error: "), line
    for part in parts:
        assert part in line, line
    return line


def committed(s3: S3Server, out: str) -> list[str]:
    """The shards committed in an S3 OUT (their stats files)."""
    store = s3._fs()
    store.invalidate_cache()
    try:
        names = [k.rsplit("/", 1)[-1] for k in store.ls(out.removeprefix("s3://"), refresh=True)]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith("_stats.json"))


def assert_complete(manifest: dict, resumed: int) -> None:
    """Every sample of the corpus ended in a shard or the status record; ``resumed`` shards
    committed before the fault were kept."""
    assert manifest["shards"] == SHARDS, manifest
    assert manifest["shards_resumed"] >= resumed, manifest
    assert manifest["samples"] == manifest["counts"]["written"], manifest


def _fault_on_writes(s3, faults, coco, status: int, code: str, *parts: str) -> None:
    """A run with OUT on S3 whose writes are refused from the 7th on (``run.lock``,
    ``run.json`` and two shards' tar and stats file go through): one line naming the
    endpoint, the refused write of ``s3://bucket/out/...``, ``parts``; two shards committed;
    with the fault gone the same command resumes them and completes."""
    bucket = s3.bucket()
    out = f"{bucket}/out"
    proxy = faults(status, code, 6, writes_under(f"/{bucket.removeprefix('s3://')}/out/"))
    args = synth_args(coco, out, *EXTRA)  # type: ignore[arg-type]
    code_, text, seconds = synth(args, proxy.endpoint)
    assert code_ == 2, (text, proxy.seen)
    line = one_error_line(text, proxy.endpoint, f"HTTP {status} {code} writing {out}/", *parts)
    print(f"{seconds:.1f} s: {line}")
    before = committed(s3, out)
    assert len(before) == 2, (before, proxy.seen)  # the fault came in the middle of the run
    proxy.heal()
    code_, text, _ = synth(args, proxy.endpoint)
    assert code_ == 0, text
    manifest = json.loads(s3._fs().cat(f"{out.removeprefix('s3://')}/manifest.json"))
    assert_complete(manifest, len(before))


@pytest.mark.slow
def test_403_on_writes_after_n_requests_names_the_object_and_the_rerun_resumes(s3, faults, coco):
    _fault_on_writes(s3, faults, coco, 403, "AccessDenied", DENIED, RERUN)


@pytest.mark.slow
def test_persistent_503_slowdown_on_writes_names_throttling_and_the_rerun_resumes(s3, faults, coco):
    _fault_on_writes(s3, faults, coco, 503, "SlowDown", THROTTLED, RERUN, "COUNTERFACTUAL_S3")


@pytest.mark.slow
def test_403_on_reads_after_n_requests_names_the_object_and_the_rerun_resumes(
    s3, faults, coco, tmp_path
):
    """COCO's pictures on S3, OUT local: the 7th picture's read is refused. The run stops
    (no picture is marked unreadable for a refusal that is the store's); the rerun resumes."""
    bucket = s3.bucket()
    s3.upload(coco.images.parent, f"{bucket}/coco")
    on_s3 = CocoFiles(
        f"{bucket}/coco/instances.json",  # type: ignore[arg-type]
        f"{bucket}/coco/captions.json",  # type: ignore[arg-type]
        f"{bucket}/coco/images",  # type: ignore[arg-type]
    )
    out = tmp_path / "out"
    images = f"/{bucket.removeprefix('s3://')}/coco/images/"
    proxy = faults(403, "AccessDenied", 6, reads_under(images))
    args = synth_args(on_s3, out, *EXTRA)
    code, text, seconds = synth(args, proxy.endpoint)
    assert code == 2, (text, proxy.seen)
    where = f"HTTP 403 AccessDenied reading {bucket}/coco/images/0000"
    line = one_error_line(text, proxy.endpoint, where, ".jpg", DENIED, RERUN)
    print(f"{seconds:.1f} s: {line}")
    before = sorted(p.name for p in out.glob("*_stats.json"))
    # the refused read may come before any shard commits (pictures are read ahead): none, or
    # some, but never all
    assert len(before) < SHARDS, (before, proxy.seen)
    assert not (out / "status.jsonl").exists()  # nothing recorded as the pictures' fault
    proxy.heal()
    code, text, _ = synth(args, proxy.endpoint)
    assert code == 0, text
    manifest = json.loads((out / "manifest.json").read_text())
    assert_complete(manifest, len(before))
    rows = [json.loads(x) for x in (out / "status.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r.get("reason") == "unreadable"], rows


@pytest.fixture
def through(s3, monkeypatch):
    """Point this process's S3 at a proxy's endpoint (fresh s3fs instances)."""
    import s3fs

    def use(proxy: FaultProxy) -> None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        for name, value in LIMITS.items():
            monkeypatch.setenv(name, value)
        s3fs.S3FileSystem.clear_instance_cache()

    yield use
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.parametrize(
    ("status", "code", "cause"), [(403, "AccessDenied", DENIED), (503, "SlowDown", THROTTLED)]
)
def test_a_webdataset_read_the_store_refuses_is_the_store_error_not_a_bad_shard(
    s3, faults, through, tmp_path, status, code, cause
):
    """A tar on S3 read as a worker reads it (headers, then each picture by a ranged read):
    a refused or throttled read raises the store's error, whose line names the tar, rather
    than becoming a ``bad-shard`` or ``read-error`` row."""
    from counterfactual import fs
    from counterfactual.imageio import SampleError
    from counterfactual.readers.corpus import InputPiece, read_piece, read_source
    from counterfactual.testing.corpora import write_shard

    picture = b"\xff\xd8 the bytes of a picture member"
    write_shard([("a", picture, "a cat", {}), ("b", picture, "a dog", {})], tmp_path / "0.tar")
    bucket = s3.bucket()
    url = f"{bucket}/corpus/00000.tar"
    s3.upload(tmp_path / "0.tar", url)
    proxy = faults(status, code, 10_000, reads_under(f"/{bucket.removeprefix('s3://')}/corpus/"))
    through(proxy)
    piece = InputPiece("wds", url, 0)
    records = list(read_piece(piece))
    assert [getattr(r, "image_id", None) for r in records] == ["a", "b"], records
    proxy.after = len(proxy.seen)  # every read from now on is refused
    with pytest.raises(OSError) as member:
        read_source(records[0].source)
    assert not isinstance(member.value, SampleError)
    with pytest.raises(OSError) as headers:
        list(read_piece(piece))
    for err in (member.value, headers.value):
        line = str(fs.store_error(err))
        assert line.startswith(f"object store {proxy.endpoint}: HTTP {status} {code}"), line
        assert f"reading {url}:" in line and cause in line and RERUN in line, line


def test_a_head_the_store_refuses_names_the_status_it_got(s3, faults, through):
    """S3 answers a refused ``HEAD`` with no body: s3fs's ``PermissionError('Forbidden')``
    becomes the line with status 403 and the object looked up."""
    from counterfactual import fs

    bucket = s3.bucket()
    name = bucket.removeprefix("s3://")
    proxy = faults(403, "AccessDenied", 0, lambda method, path: method == "HEAD")
    through(proxy)
    with pytest.raises(PermissionError) as err:
        fs.size(f"{bucket}/some/key.json")
    line = str(fs.store_error(err.value))
    assert line.startswith(f"object store {proxy.endpoint}: HTTP 403 403 looking up "), line
    assert f"s3://{name}/some/key.json: {DENIED}" in line, line
