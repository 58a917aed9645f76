"""Which keys a run has seen, in about 8 bytes a key: :class:`KeySet`.

The driver of a corpus run plans its pieces one after another and asks, for each piece, which
of its ids an earlier row of the run already had (``duplicate-key``). Python's ``set`` of the
strings would take ~100 bytes a key (a gigabyte at 10 M); this keeps a 64-bit hash of each key
(BLAKE2b) in sorted NumPy runs that merge as they grow (an LSM tree: at most log2(n) runs, each
membership test a binary search in each). Two different keys have the same hash with
probability about n^2 / 2^65 over a run of n keys (3e-6 at 10 M): a unique key would then be
reported as a repeat.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def key_hash(key: str) -> int:
    """The 64-bit hash a :class:`KeySet` keeps of ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "little")


def key_hashes(keys: Sequence[str]) -> np.ndarray:
    """:func:`key_hash` of each key, as ``uint64`` in the keys' order."""
    return np.fromiter((key_hash(k) for k in keys), dtype=np.uint64, count=len(keys))


class KeySet:
    """Keys seen so far, added a batch at a time (:meth:`add`)."""

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []  # sorted uint64 hashes, sizes decreasing
        self.count = 0
        """Distinct keys added (as hashes)."""

    @property
    def nbytes(self) -> int:
        """Bytes held by the hashes."""
        return sum(run.nbytes for run in self._runs)

    def add(self, keys: Sequence[str]) -> list[bool]:
        """Add ``keys``; for each, whether it was seen before: in an earlier batch, or earlier
        in this one (the first occurrence is new, later ones are repeats)."""
        if not keys:
            return []
        return self.add_hashes(key_hashes(keys)).tolist()

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """For each ``uint64`` hash (:func:`key_hashes`), whether an earlier batch added it."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        seen = np.zeros(len(hashes), dtype=bool)
        for run in self._runs:
            at = np.searchsorted(run, hashes)
            inside = at < len(run)
            seen[inside] |= run[at[inside]] == hashes[inside]
        return seen

    def add_hashes(self, hashes: np.ndarray) -> np.ndarray:
        """:meth:`add` for keys already hashed (:func:`key_hashes`): a ``bool`` array."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        seen = self.contains(hashes)
        if not len(hashes):
            return seen
        fresh, first = np.unique(hashes, return_index=True)
        repeat = np.ones(len(hashes), dtype=bool)
        repeat[first] = False  # later occurrences within the batch repeat the first
        seen |= repeat
        new = fresh[~seen[first]]
        if len(new):
            self._push(new)
        return seen

    def _push(self, run: np.ndarray) -> None:
        """Add a sorted run, merging runs while the newest is at least half the one before."""
        self.count += len(run)
        self._runs.append(run)
        while len(self._runs) > 1 and 2 * len(self._runs[-1]) >= len(self._runs[-2]):
            top = self._runs.pop()
            below = self._runs.pop()
            merged = np.concatenate((below, top))
            merged.sort(kind="stable")
            self._runs.append(merged)

    def __len__(self) -> int:
        return self.count
