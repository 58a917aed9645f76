"""Test-wide settings: nothing may reach the network, and Ray/HF stay offline and local."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tests.s3server import s3  # noqa: E402, F401  (the session-wide S3 server fixture)


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
