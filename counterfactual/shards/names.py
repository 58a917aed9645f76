"""The files of a run folder beside its shards that the readers of a run open by name (the
shards, their stats files, the card and the indexes are named in their own modules)."""

from __future__ import annotations

RUN_FILE = "run.json"
"""The run's config and input fingerprint, written when the first shard starts."""
STATUS_FILE = "status.jsonl"
"""One status row per input sample, streamed from the stats files at the end of a run."""
MANIFEST_FILE = "manifest.json"
"""The run history, counts, models and the verify summary."""
