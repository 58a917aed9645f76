"""Small box-less corpora for tests and benchmarks: WebDataset shards, Parquet and CSV tables
written from pictures and captions, and the demo's pictures as such samples.

A sample is ``(key, picture, caption, extra)``: ``picture`` is encoded bytes (``None``: the
sample has no picture member or an empty image cell), ``caption`` a string (``None``: no ``txt``
member, a null cell), ``extra`` more fields for the WebDataset ``json`` member.
"""

from __future__ import annotations

import csv
import io
import json
import tarfile
from collections.abc import Sequence
from pathlib import Path
from string import Formatter
from typing import Any

Sample = tuple[str, bytes | None, str | None, dict[str, Any]]

MTIME = 1_700_000_000
"""Fixed member time, so that the same samples give the same bytes."""


def demo_samples(tmp_path: Path, shrink: int = 1) -> list[Sample]:
    """The eight demo pictures (JPEG bytes as written) with their first caption, keyed by file
    stem (``astronaut``, ``coffee``, ...); ``extra`` holds the annotated size and id. With
    ``shrink`` > 1 each picture is that many times smaller (JPEG again, its mode kept) and
    ``extra`` holds its new size: a tiny detector sees 32 x 32 pixels either way, and its
    processor's anti-aliasing blur of a whole photo costs about a second a picture."""
    from counterfactual.readers.demo import read_demo

    dataset = read_demo(tmp_path / "demo-data")
    samples: list[Sample] = []
    for record in dataset.records:
        assert record.root is not None
        extra = {"width": record.width, "height": record.height, "image_id": record.image_id}
        picture = (record.root / record.file).read_bytes()
        if shrink > 1:
            picture, extra["width"], extra["height"] = _shrunk(picture, shrink)
        samples.append((Path(record.file).stem, picture, record.captions[0].text, extra))
    return samples


def _shrunk(picture: bytes, factor: int) -> tuple[bytes, int, int]:
    from PIL import Image

    image = Image.open(io.BytesIO(picture))
    image = image.resize((image.width // factor, image.height // factor), Image.Resampling.LANCZOS)
    data = io.BytesIO()
    image.save(data, "JPEG", quality=95)
    return data.getvalue(), image.width, image.height


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = MTIME
    info.mode = 0o644
    info.uname = info.gname = "bigdata"
    tar.addfile(info, io.BytesIO(data))


def write_shard(samples: Sequence[Sample], path: Path) -> None:
    """One tar with the members img2dataset writes per sample, in webdataset's ``TarWriter``
    order (fields sorted): ``<key>.jpg``, ``<key>.json`` (``key``, ``caption`` and ``extra``),
    ``<key>.txt``. A ``None`` picture or caption leaves its member out."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, picture, caption, extra in samples:
            if picture is not None:
                _add(tar, f"{key}.jpg", picture)
            meta = {"key": key, "caption": caption, **extra}
            _add(tar, f"{key}.json", json.dumps(meta).encode())
            if caption is not None:
                _add(tar, f"{key}.txt", caption.encode())


def write_wds(
    samples: Sequence[Sample], folder: Path, per_shard: int, name: str = "{:05d}.tar"
) -> str:
    """``samples`` as shards of ``per_shard`` samples in ``folder`` (``name`` formats the shard
    number); returns the brace pattern of the shards, e.g. ``f"{folder}/{{00000..00002}}.tar"``."""
    if per_shard < 1:
        raise ValueError(f"per_shard must be at least 1, not {per_shard}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    count = max(1, -(-len(samples) // per_shard))
    for shard in range(count):
        write_shard(
            samples[shard * per_shard : (shard + 1) * per_shard], folder / name.format(shard)
        )
    if count == 1:
        return str(folder / name.format(0))
    (prefix, _, spec, _), *rest = Formatter().parse(name)
    suffix = "".join(literal for literal, *_ in rest)
    span = f"{{{format(0, spec)}..{format(count - 1, spec)}}}"
    return str(folder / f"{prefix}{span}{suffix}")


def write_pictures(samples: Sequence[Sample], folder: Path) -> list[str | None]:
    """Each sample's picture as ``folder/<key>.jpg``; the paths relative to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    names: list[str | None] = []
    for key, picture, _, _ in samples:
        if picture is None:
            names.append(None)
            continue
        (folder / f"{key}.jpg").write_bytes(picture)
        names.append(f"{key}.jpg")
    return names


def write_parquet(
    samples: Sequence[Sample],
    path: Path,
    images_as: str = "bytes",
    images_folder: Path | None = None,
    row_group_size: int = 3,
) -> Path:
    """A Parquet table with columns ``key``, ``caption`` and ``image``.

    ``images_as``: ``"bytes"`` (a binary column), ``"struct"`` (Hugging Face datasets'
    ``{bytes, path}``, ``path`` the file name) or ``"paths"`` (the pictures written under
    ``images_folder``, default ``<table folder>/images``, the column their paths relative to
    it).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = [s[0] for s in samples]
    captions = pa.array([s[2] for s in samples], pa.string())
    pictures = [s[1] for s in samples]
    if images_as == "bytes":
        image = pa.array(pictures, pa.binary())
    elif images_as == "struct":
        kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        cells = [
            None if p is None else {"bytes": p, "path": f"{k}.jpg"}
            for k, p in zip(keys, pictures, strict=True)
        ]
        image = pa.array(cells, kind)
    elif images_as == "paths":
        folder = images_folder if images_folder is not None else path.parent / "images"
        image = pa.array(write_pictures(samples, Path(folder)), pa.string())
    else:
        raise ValueError(f"images_as must be bytes, struct or paths, not {images_as!r}")
    table = pa.table({"key": keys, "caption": captions, "image": image})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_csv(samples: Sequence[Sample], path: Path, images_folder: Path) -> Path:
    """A CSV table (``key,caption,image``) whose image column holds the pictures' paths relative
    to ``images_folder``, where they are written. ``None`` becomes an empty cell."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = write_pictures(samples, Path(images_folder))
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["key", "caption", "image"])
        for (key, _, caption, _), name in zip(samples, names, strict=True):
            writer.writerow([key, caption or "", name or ""])
    return path
