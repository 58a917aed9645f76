"""Memory of the run-wide key set a CSV corpus run keeps (``duplicate-key`` across pieces):
:class:`~counterfactual.readers.keyset.KeySet` against a Python ``set`` of the key strings, side
by side, each in a fresh process, fed the same keys in pieces of 10,000.

    python benchmarks/keyset_memory.py [N]        (default N = 10,000,000)

Prints, per variant, the peak resident memory the keys added over the process's baseline
(``ru_maxrss``), per key, and the CPU seconds taken (the machine may be shared).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

PIECE = 10_000


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(variant: str, n: int) -> None:
    from counterfactual.readers.keyset import KeySet

    base = _peak_mib()
    start = time.process_time()
    if variant == "keyset":
        keys = KeySet()
        for lo in range(0, n, PIECE):
            keys.add([f"img2dataset-{i:012d}" for i in range(lo, min(lo + PIECE, n))])
        count = len(keys)
    else:
        seen: set[str] = set()
        for lo in range(0, n, PIECE):
            seen.update(f"img2dataset-{i:012d}" for i in range(lo, min(lo + PIECE, n)))
        count = len(seen)
    seconds = time.process_time() - start
    extra = _peak_mib() - base
    print(
        json.dumps(
            {
                "variant": variant,
                "keys": count,
                "peak_mib": round(extra, 1),
                "bytes_per_key": round(extra * 2**20 / count, 1),
                "cpu_seconds": round(seconds, 1),
            }
        )
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
    rows = []
    for variant in ("keyset", "python-set"):
        done = subprocess.run(
            [sys.executable, __file__, "--child", variant, str(n)],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(done.stdout))
        print(done.stdout.strip(), flush=True)
    ratio = rows[1]["peak_mib"] / rows[0]["peak_mib"]
    print(f"python set / KeySet peak memory: {ratio:.1f}x")


if __name__ == "__main__":
    main()
