"""Reproducible draws keyed by a seed and a name: the same draw for the same image or sample in
any order, process or machine (blake2b of ``"{seed}:{key}"``)."""

from __future__ import annotations

import hashlib


def keyed_int(seed: int, key: str, nbytes: int = 8) -> int:
    """An integer of ``nbytes`` bytes from ``seed`` and ``key``."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=nbytes).digest()
    return int.from_bytes(digest, "little")


def draw_index(seed: int, key: str, n: int) -> int:
    """A uniform draw in ``range(n)`` (a record's target, a caption)."""
    return keyed_int(seed, key) % n


def item_seed(seed: int, key: str) -> int:
    """A sample's own seed, a non-negative 31-bit int (what its random choices start from)."""
    return keyed_int(seed, key, 4) & 0x7FFFFFFF


__all__ = ["draw_index", "item_seed", "keyed_int"]
