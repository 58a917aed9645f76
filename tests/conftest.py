"""Test-wide settings: nothing may reach the network, and Ray/HF stay offline and local."""

import os
import shutil
import sys

import pytest

sys.dont_write_bytecode = False
"""pytest keeps each test module's assertion-rewritten bytecode (``__pycache__/*-pytest-*.pyc``)
unless ``sys.dont_write_bytecode``. With ``PYTHONDONTWRITEBYTECODE`` set (CI, many images),
every xdist worker rewrote all ~130 test modules on every run: about 5 of a worker's 12 s of
collection. This process only (its children keep the variable); ``make test`` compiles the
project's own bytecode anyway (the Makefile's ``BYTECODE``)."""

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tests.s3server import s3  # noqa: E402, F401  (the session-wide S3 server fixture)

_OWN_RAY_TMPDIR = "COUNTERFACTUAL_TEST_RAY_TMPDIR"
"""Set (to the folder) where a test process made ``RAY_TMPDIR`` its own; an xdist worker that
inherits it makes one of its own too."""


def pytest_configure(config: pytest.Config) -> None:
    """Ray's default temp root (``RAY_TMPDIR``: what ``ray.cluster_utils.Cluster``, a bare
    ``ray.init()`` and ``address="local"`` keep their sessions under, ``/tmp/ray`` otherwise)
    is a folder of this test process's own, made as a run makes its Ray folder (short enough
    for Ray's sockets; a killed process's is removed by the next run), removed at its end: the
    suite leaves no Ray sessions behind in ``/tmp/ray`` (it left about a dozen, 1.2 MB each, per
    run), and a Ray one xdist worker starts is never another's latest. A ``RAY_TMPDIR`` the
    user set stays."""
    if "RAY_TMPDIR" in os.environ and _OWN_RAY_TMPDIR not in os.environ:
        return
    from counterfactual.pipelines.session import ray_temp_dir

    root = str(ray_temp_dir())
    os.environ["RAY_TMPDIR"] = os.environ[_OWN_RAY_TMPDIR] = root
    config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))


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
