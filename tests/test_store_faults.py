"""An object store that fails under a run, against moto's real S3 server, tried as processes:
unreachable at the start or in the middle of a run (a forwarder in front of the server is
stopped: the endpoint refuses connections while the server keeps its objects), stalled (the
server paused with SIGSTOP: connections open, no answer), no credentials, no bucket. Each ends
the run within its stated time with one line naming the endpoint and the cause, exit 2; once
the store is back the same command resumes. Timeouts are cut to a few seconds through the
``COUNTERFACTUAL_S3_*`` variables, so the budget is seconds, not minutes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bad_coco import synth_args
from s3server import S3Server, TcpProxy, start_moto

from counterfactual import fs
from counterfactual.readers.generate import generate_coco

pytestmark = pytest.mark.slow

pytest.importorskip("s3fs")
pytest.importorskip("moto")

KILLING_RUN = Path(__file__).with_name("killing_run.py")
ROOT = Path(__file__).resolve().parents[1]
EXTRA = ("--image-method", "blur", "--images-per-shard", "3", "--contact-sheet", "0")
LIMITS = {
    "COUNTERFACTUAL_S3_CONNECT_TIMEOUT": "1",
    "COUNTERFACTUAL_S3_READ_TIMEOUT": "3",
    "COUNTERFACTUAL_S3_ATTEMPTS": "2",
}
BUDGET = fs.StoreLimits(1.0, 3.0, 2).budget  # 9 s: what one request may take at most
KEYS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco"), 12, seed=4, size=(320, 240))


@pytest.fixture(scope="module")
def moto_behind_proxy():
    """A moto server of the module's own behind a forwarder: ``(server, its process,
    forwarder)``; each test makes its own buckets."""
    proc, endpoint = start_moto()
    proxy = TcpProxy(int(endpoint.rsplit(":", 1)[1]))
    proxy.start()
    try:
        yield S3Server(endpoint), proc, proxy
    finally:
        proxy.stop()
        with_signal(proc, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture
def store(moto_behind_proxy):
    """The module's moto server and forwarder, both up (a test that paused the server or stopped
    the forwarder healed them; a failed one may not have): ``(server, its process, forwarder)``."""
    _, proc, proxy = moto_behind_proxy
    with_signal(proc, signal.SIGCONT)
    proxy.start()
    return moto_behind_proxy


def with_signal(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, sig)


def _env(endpoint: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {
        **env,
        **KEYS,
        **LIMITS,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_EC2_METADATA_DISABLED": "true",
        "PYTHONPATH": pythonpath,
        **extra,
    }


def _run(cmd: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, str, float]:
    start = time.monotonic()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "counterfactual", *args]


def _one_error_line(text: str, *parts: str) -> str:
    """The run's last line is its one error line, holding ``parts``; nothing else is wrong."""
    assert "Traceback" not in text, text
    line = text.rstrip().splitlines()[-1]
    assert line.startswith("counterfactual synth: error: object store "), text
    assert sum("error:" in x for x in text.splitlines()) == 1, text
    for part in parts:
        assert part in line, line
    return line


def test_an_unreachable_endpoint_is_named_in_one_line(coco, tmp_path):
    from s3server import _free_port

    endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    code, text, seconds = _run(_cli(*synth_args(coco, "s3://anywhere/out", *EXTRA)), _env(endpoint))
    assert code == 2
    _one_error_line(text, endpoint, "unreachable")
    assert seconds < 30 + BUDGET


def test_missing_credentials_are_named_in_one_line(coco, store):
    server, _, proxy = store
    out = f"{server.bucket()}/out"
    env = _env(proxy.endpoint, AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(key)
    env["AWS_CONFIG_FILE"] = "/nonexistent"
    code, text, _ = _run(_cli(*synth_args(coco, out, *EXTRA)), env)
    assert code == 2
    _one_error_line(text, proxy.endpoint, "no credentials")


def test_a_bucket_that_does_not_exist_is_named_in_one_line(coco, store):
    _, _, proxy = store
    out = "s3://no-such-bucket-here/out"
    code, text, _ = _run(_cli(*synth_args(coco, out, *EXTRA)), _env(proxy.endpoint))
    assert code == 2
    _one_error_line(text, proxy.endpoint, "bucket no-such-bucket-here does not exist")


def _committed(server: S3Server, out: str) -> list[str]:
    store = server._fs()
    store.invalidate_cache()
    prefix = out.removeprefix("s3://")
    try:
        names = [k.rsplit("/", 1)[-1] for k in store.ls(prefix, refresh=True)]
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.endswith("_stats.json"))


def _fault_mid_run(
    coco, store, tmp_path, fault, heal, *parts: str, ray: bool = False, shards: int = 4
) -> None:
    """Start a run whose shards take seconds, let it commit one, ``fault()`` the store: the run
    ends with one line within the budget; ``heal()`` it: the same command resumes. ``ray``:
    on Ray (the fault reaches a worker, its error the driver), a shard at a time."""
    server, _, proxy = store
    out = f"{server.bucket()}/out"
    args = synth_args(coco, out, *EXTRA, "--batch-size", "1")
    if ray:
        cmd = _cli(*args, "--runner", "ray", "--num-cpus", "1", "--no-dashboard")
    else:
        cmd = [sys.executable, str(KILLING_RUN), "slow", "1", *args]
    log = tmp_path / "run.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=_env(proxy.endpoint))
    try:
        deadline = time.monotonic() + 120
        under_way = "" if ray else "inside shard"
        while not (_committed(server, out) and under_way in log.read_text()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        before = _committed(server, out)
        fault()
        start = time.monotonic()
        code = proc.wait(timeout=120)
        seconds = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        heal()
    text = log.read_text()
    assert code == 2, text
    line = _one_error_line(text, proxy.endpoint, *parts)
    print(f"ended {seconds:.1f} s after the fault: {line}")
    # a shard's upload and the lock's release each give up within the budget
    assert seconds < 2 * BUDGET + 15, f"the run ended {seconds:.1f} s after the fault"
    code, again, _ = _run(_cli(*args), _env(proxy.endpoint))
    assert code == 0, again
    manifest = json.loads(server._fs().cat(f"{out.removeprefix('s3://')}/manifest.json"))
    assert manifest["shards_resumed"] >= len(before)
    assert manifest["shards"] == shards and manifest["samples"] == manifest["counts"]["written"]
    assert not server._fs().exists(f"{out.removeprefix('s3://')}/run.lock")


def test_an_outage_mid_run_ends_it_in_one_line_and_the_rerun_resumes(coco, store, tmp_path):
    _, _, proxy = store
    _fault_mid_run(coco, store, tmp_path, proxy.stop, proxy.start, "unreachable")


def test_a_stalled_store_ends_the_run_in_one_line_and_the_rerun_resumes(coco, store, tmp_path):
    _, proc, _ = store

    def pause() -> None:
        os.kill(proc.pid, signal.SIGSTOP)

    def resume() -> None:
        os.kill(proc.pid, signal.SIGCONT)

    _fault_mid_run(coco, store, tmp_path, pause, resume, "timed out after 3 s")


@pytest.fixture(scope="module")
def coco_60(tmp_path_factory):
    return generate_coco(tmp_path_factory.mktemp("coco60"), 60, seed=4, size=(320, 240))


def test_an_outage_mid_run_on_ray_ends_it_in_one_line_and_the_rerun_resumes(
    coco_60, store, tmp_path
):
    pytest.importorskip("ray")
    _, _, proxy = store
    fault, heal = proxy.stop, proxy.start
    _fault_mid_run(coco_60, store, tmp_path, fault, heal, "unreachable", ray=True, shards=20)
