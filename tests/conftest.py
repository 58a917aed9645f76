"""Test-wide settings: nothing may reach the network, and Ray/HF stay offline and local."""

import os
from collections import Counter

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from tests.s3server import s3  # noqa: E402, F401  (the session-wide S3 server fixture)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``make test``), the files with the most ``slow`` tests first, each
    file's tests in their own order: ``--dist loadfile`` hands out whole files in collection
    order, so a long file started last would leave the other workers idle at the end. Every
    worker sorts the same collection the same way; a plain ``pytest`` run keeps the file order."""
    if not hasattr(config, "workerinput"):
        return
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path])  # stable: ties keep the file order
