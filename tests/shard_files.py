"""Reading a run's shards back in tests: every member's bytes, by member name; what a run's
output is, less where and how long it ran."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path


def shard_members(out: Path) -> dict[str, bytes]:
    """Every member of the run's shards (``shard-*.tar`` in ``out``), in shard order."""
    members: dict[str, bytes] = {}
    for shard in sorted(Path(out).glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    return members


def run_outputs(out: Path) -> dict[str, object]:
    """What must not depend on the runner, the workers or the storage: shard bytes, the stats
    files less ``seconds`` and ``node`` (how long, and where) and the input files' ``stamps``
    (their modification times, or ETags on an object store), the status record."""
    files: dict[str, object] = {p.name: p.read_bytes() for p in Path(out).glob("shard-*.tar")}
    for p in Path(out).glob("shard-*_stats.json"):
        stats = json.loads(p.read_text())
        stats.pop("seconds"), stats.pop("node")
        stats.get("inputs", {}).pop("stamps", None)
        files[p.name] = stats
    files["status.jsonl"] = (Path(out) / "status.jsonl").read_text()
    return files
