"""The neighbouring papers' tools: grounding metrics and baselines (seeds 000, 001), dataset
audits (seed 004)."""
