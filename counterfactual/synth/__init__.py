"""The synthesis job: its config and plan, the steps an item goes through, the shards it
writes, the run folder (status, manifest, lock, card) and the in-process runner."""
