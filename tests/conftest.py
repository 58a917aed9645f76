"""Test-wide settings: nothing may reach the network, and Ray/HF stay offline and local."""

import json
import os
from collections import Counter
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tests.s3server import s3  # noqa: E402, F401  (the session-wide S3 server fixture)

FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Each test file's seconds in a ``make test`` on the 2-core machine (setup, call and teardown of
its tests): the order the workers take the files in. ``--write-file-seconds`` refreshes it."""


def pytest_addoption(parser):
    parser.addoption(
        "--write-file-seconds",
        action="store_true",
        help=f"write each test file's seconds in this run to {FILE_SECONDS.name} (files this run "
        "did not run keep theirs)",
    )


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test``), the costliest files first (:data:`FILE_SECONDS`; a
    file not listed counts 1 s), each file's tests in their own order: ``--dist loadfile`` hands
    out whole files in collection order (``--no-loadscope-reorder`` keeps xdist from putting
    the files with the most tests first), so a long file taken last would leave the other
    workers idle at the end. Every worker sorts the same collection the same way; a plain
    ``pytest`` run keeps the file order."""
    if not hasattr(config, "workerinput"):
        return
    seconds = json.loads(FILE_SECONDS.read_text())
    items.sort(key=lambda item: -seconds.get(item.path.name, 1.0))  # stable: ties keep order


_seconds_this_run: Counter = Counter()


def pytest_runtest_logreport(report):
    _seconds_this_run[Path(report.fspath).name] += report.duration


def pytest_sessionfinish(session):
    config = session.config
    if not config.getoption("write_file_seconds") or hasattr(config, "workerinput"):
        return
    seconds = json.loads(FILE_SECONDS.read_text()) | {
        name: round(value, 1) for name, value in _seconds_this_run.items()
    }
    ranked = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    FILE_SECONDS.write_text(json.dumps(dict(ranked), indent=0) + "\n")


@pytest.fixture(scope="module")
def module_ray(tmp_path_factory):
    """One local Ray (2 CPUs, no dashboard) for the tests of a module that ask for it: a run on
    Ray in this process joins it rather than starting its own (Ray starts in seconds, not
    milliseconds). Started when first asked for, so after the session's ``s3`` fixture has set
    ``AWS_*`` where a test asks for both, and its workers inherit them."""
    ray = pytest.importorskip("ray")
    from counterfactual.pipelines.options import RayOptions
    from counterfactual.pipelines.session import init_ray

    if ray.is_initialized():  # a Ray of another test module
        ray.shutdown()
    info = init_ray(tmp_path_factory.mktemp("ray"), RayOptions(num_cpus=2, dashboard=False))
    yield info
    ray.shutdown()
