"""Reading a run's shards back in tests: every member's bytes, by member name."""

from __future__ import annotations

import tarfile
from pathlib import Path


def shard_members(out: Path) -> dict[str, bytes]:
    """Every member of the run's shards (``shard-*.tar`` in ``out``), in shard order."""
    members: dict[str, bytes] = {}
    for shard in sorted(Path(out).glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    return members
