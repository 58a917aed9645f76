"""What the driver pays to find the keys a WebDataset corpus repeats across tars
(``duplicate-key``): planning the pieces with their keys (every tar's headers read, the data
between them skipped by seeking) against planning without (the tars listed, not opened), the
worker's own read of the same tars' samples (headers, and the small ``txt``/``json`` members)
and a full read of every byte, side by side on one generated corpus of 4 img2dataset-like
tars, in one run.

    python benchmarks/tar_keys.py [SAMPLES_PER_TAR] [PICTURE_KIB]   (default 2500 and 40)

Each variant runs twice: with the tars in the page cache ("warm"), and after asking the kernel
to drop their pages (``posix_fadvise(DONTNEED)``, "cold"; a hint, not a guarantee, and a shared
disk's own cache stays). Prints one JSON line per variant and the ratios to a full read.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

TARS = 4


def _corpus(folder: Path, per_tar: int, picture_kib: int) -> str:
    import random

    from counterfactual.testing.corpora import write_shard

    rng = random.Random(0)
    for t in range(TARS):
        samples = []
        for i in range(per_tar):
            size = rng.randint(picture_kib * 512, picture_kib * 1536)
            caption = f"a photo of sample {i} of tar {t}"
            samples.append((f"{t:05d}{i:04d}", rng.randbytes(size), caption, {"url": "u"}))
        write_shard(samples, folder / f"{t:05d}.tar")
    return str(folder / f"{{00000..{TARS - 1:05d}}}.tar")


def _drop_cache(folder: Path) -> None:
    for path in folder.glob("*.tar"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    from counterfactual.readers import corpus
    from counterfactual.readers.corpus import pieces
    from counterfactual.readers.keyset import KeySet

    per_tar = int(sys.argv[1]) if len(sys.argv) > 1 else 2500
    picture_kib = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pattern = _corpus(folder, per_tar, picture_kib)
        total = sum(p.stat().st_size for p in folder.glob("*.tar"))

        def plan_without_keys() -> int:
            files = pieces._plan_files(pattern, "wds", None, None, None, None)
            return len(list(pieces._pieces(files, 1, None)))

        def plan_with_keys() -> int:
            files = pieces._plan_files(pattern, "wds", None, None, None, None)
            return len(list(pieces._pieces(files, 1, KeySet())))

        def worker_reads() -> int:
            return sum(
                1 for p in corpus.plan_pieces(pattern, "wds", 1) for _ in corpus.read_piece(p)
            )

        def full_read() -> int:
            n = 0
            for path in sorted(folder.glob("*.tar")):
                with open(path, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        n += len(chunk)
            return n

        variants = {
            "plan (tars listed)": plan_without_keys,
            "plan + keys (headers)": plan_with_keys,
            "worker read (headers, txt, json)": worker_reads,
            "full read (every byte)": full_read,
        }
        rows: dict[str, dict[str, float]] = {}
        for cache in ("warm", "cold"):
            for name, run in variants.items():
                if cache == "warm":
                    run()  # into the page cache
                else:
                    _drop_cache(folder)
                start, cpu = time.perf_counter(), time.process_time()
                run()
                seconds = time.perf_counter() - start
                row = {
                    "seconds": round(seconds, 4),
                    "cpu_seconds": round(time.process_time() - cpu, 4),
                }
                rows[f"{name}, {cache}"] = row
                print(json.dumps({"variant": name, "cache": cache, **row}), flush=True)
        print(
            json.dumps(
                {"tars": TARS, "samples": TARS * per_tar, "bytes": total, "mib": total >> 20}
            )
        )
        for cache in ("warm", "cold"):
            full = rows[f"full read (every byte), {cache}"]["seconds"]
            keys = rows[f"plan + keys (headers), {cache}"]["seconds"]
            plain = rows[f"plan (tars listed), {cache}"]["seconds"]
            worker = rows[f"worker read (headers, txt, json), {cache}"]["seconds"]
            print(
                f"{cache}: key scan {keys:.3f} s ({keys / full:.2f}x a full read, "
                f"{(keys - plain) / (TARS * per_tar) * 1e6:.1f} us a sample over planning "
                f"without); the worker's own read {worker:.3f} s ({worker / full:.2f}x)"
            )


if __name__ == "__main__":
    main()
