"""The official files behind our readers: where each comes from, its published checksum (and
where that checksum was published), and a verified, resumable download.

Layout under ``root``::

    downloads/<name>.part   a download in progress (resumed with an HTTP Range request)
    downloads/<name>        the same file once its size and digest matched; nothing else ever
                            gets the final name
    downloads/<name>.done   written last, after the file was unpacked into ``extract_to``: a
                            rerun skips that file
    CHECKSUMS.txt           ``<sha256>  <bytes>  <name>`` for files without a published checksum,
                            recorded on their first download and checked on every later one

The archives unpack into the layout :mod:`counterfactual.readers.coco` and
:mod:`counterfactual.readers.flickr30k` read (``annotations/instances_train2017.json``,
``train2017/*.jpg``, ``Annotations/*.xml``, ``Sentences/*.txt``, ...). Nothing here touches the
network until :func:`fetch` is called.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import tarfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from counterfactual.fs import safe_relative_path

DOWNLOADS = "downloads"
CHECKSUMS_FILE = "CHECKSUMS.txt"
CHUNK_BYTES = 1 << 20
USER_AGENT = "counterfactual-data/1 (+python urllib)"

Progress = Callable[[int, int | None], None]
"""Called with (bytes of the file so far, its expected size or ``None``) after every chunk."""

_HEX = re.compile(r"[0-9a-f]+")
_ARCHIVES = {".zip": "zip", ".tar": "tar", ".tar.gz": "tar", ".tgz": "tar"}
_NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError)


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> None: ...


class DownloadError(ValueError):
    """A download or unpacking that failed; the message names the file and what went wrong."""


class UnsafeArchiveError(DownloadError):
    """An archive member that would land outside its target folder (zip-slip) or is a link."""


@dataclass(frozen=True, slots=True)
class RemoteFile:
    """One official file.

    ``name`` is its file name under ``ROOT/downloads``; ``size`` is in bytes. ``sha256`` and
    ``md5`` are lowercase hex as published (``None`` where nothing is published: then the digest
    of the first download is recorded in ``ROOT/CHECKSUMS.txt``); ``source_note`` says where
    the checksum was found, or that none was. An archive is unpacked into ``ROOT/extract_to``; a
    plain file is copied there. ``provides`` are paths under ``ROOT`` that exist once it is
    in place (files, or folders that must not be empty). ``part`` is what ``--parts`` selects;
    ``default`` files are fetched when no part is named.
    """

    name: str
    url: str
    size: int | None
    sha256: str | None
    md5: str | None
    extract_to: str
    source_note: str
    part: str
    provides: tuple[str, ...] = ()
    default: bool = True

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or "\\" in self.name or self.name.startswith("."):
            raise ValueError(f"file name {self.name!r} must be a plain file name")
        if urlsplit(self.url).scheme not in ("http", "https", "file"):
            raise ValueError(f"{self.name}: url {self.url!r} is not http(s) or file")
        if self.size is not None and (not isinstance(self.size, int) or self.size < 0):
            raise ValueError(f"{self.name}: size {self.size!r} is not a byte count")
        for algo, digest, length in (("sha256", self.sha256, 64), ("md5", self.md5, 32)):
            if digest is not None and (len(digest) != length or not _HEX.fullmatch(digest)):
                raise ValueError(f"{self.name}: {algo} {digest!r} is not {length} lowercase hex")
        if self.extract_to != "." and safe_relative_path(self.extract_to) is None:
            raise ValueError(f"{self.name}: extract_to {self.extract_to!r} leaves the root")
        if any(safe_relative_path(p) is None for p in self.provides):
            raise ValueError(f"{self.name}: provides {self.provides!r} must stay under the root")
        if not self.source_note.strip() or not self.part:
            raise ValueError(f"{self.name}: source_note and part must not be empty")

    @property
    def archive(self) -> str | None:
        """``"zip"``, ``"tar"`` (plain or gzip) or ``None`` for a file used as it is."""
        for suffix, kind in sorted(_ARCHIVES.items(), key=lambda kv: -len(kv[0])):
            if self.name.endswith(suffix):
                return kind
        return None

    @property
    def published(self) -> bool:
        return self.sha256 is not None or self.md5 is not None


@dataclass(frozen=True, slots=True)
class ManualStep:
    """Something a person has to do (e.g. fill in a request form); ``provides`` shows it done."""

    what: str
    url: str
    instructions: str
    provides: tuple[str, ...] = ()


# COCO: sha256 and sizes as published in tensorflow/datasets
# tensorflow_datasets/url_checksums/coco.txt (commit 333639b37af6c6fedf3610a4a2d42f1c6ef6f7d5);
# the same sha256 values appear in pytorch/vision torchvision/prototype/datasets/_builtin/coco.py
# (_IMAGES_CHECKSUMS, _META_CHECKSUMS).
_COCO_SOURCE = (
    "sha256+size: tensorflow/datasets tensorflow_datasets/url_checksums/coco.txt; same sha256 in "
    "pytorch/vision torchvision/prototype/datasets/_builtin/coco.py"
)
_COCO_ANNOTATIONS_2017 = tuple(
    f"annotations/{kind}_{s}2017.json"
    for kind in ("instances", "captions")
    for s in ("train", "val")
)
_COCO_ANNOTATIONS_2014 = tuple(p.replace("2017", "2014") for p in _COCO_ANNOTATIONS_2017)
_NO_CHECKSUM = (
    "no published checksum; the sha256 of the first download is recorded in ROOT/CHECKSUMS.txt"
)
_F30K_REPO = "https://github.com/BryanPlummer/flickr30k_entities"
_F30K_RAW = "https://raw.githubusercontent.com/BryanPlummer/flickr30k_entities/master"


def _coco(
    name: str, size: int, sha256: str, part: str, provides: tuple[str, ...], default: bool = True
) -> RemoteFile:
    """An official COCO zip; size and sha256 as published in tensorflow/datasets
    tensorflow_datasets/url_checksums/coco.txt (same sha256 in torchvision)."""
    folder = "annotations" if name.startswith("annotations") else "zips"
    return RemoteFile(
        name=name,
        url=f"http://images.cocodataset.org/{folder}/{name}",
        size=size,
        sha256=sha256,
        md5=None,
        extract_to=".",
        source_note=_COCO_SOURCE,
        part=part,
        provides=provides,
        default=default,
    )


DATASET_FILES: dict[str, tuple[RemoteFile, ...]] = {
    "coco": (
        _coco(
            "annotations_trainval2017.zip",
            252_907_541,
            "113a836d90195ee1f884e704da6304dfaaecff1f023f49b6ca93c4aaae470268",
            "annotations",
            _COCO_ANNOTATIONS_2017,
        ),
        _coco(
            "val2017.zip",
            815_585_330,
            "4f7e2ccb2866ec5041993c9cf2a952bbed69647b115d0f74da7ce8f4bef82f05",
            "val2017",
            ("val2017",),
        ),
        _coco(
            "train2017.zip",
            19_336_861_798,
            "69a8bb58ea5f8f99d24875f21416de2e9ded3178e903f1f7603e283b9e06d929",
            "train2017",
            ("train2017",),
        ),
        RemoteFile(
            name="caption_datasets.zip",
            url="https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",
            size=None,  # no published size
            # md5 as checked on download by mlverse/torchvision R/dataset-flickr.R
            # (flickr30k_dataset resources, commit 021680577e3b596c276c8bb1655145a6a7d96272)
            sha256=None,
            md5="4fa8c08369d22fe16e41dc124bd1adc2",
            extract_to=".",
            source_note="md5: mlverse/torchvision R/dataset-flickr.R (flickr30k_dataset "
            "resources); no published sha256 or size",
            part="karpathy",
            provides=("dataset_coco.json",),
        ),
        # COCO 2014, the file set Karpathy's split names (--coco-set train2014 / val2014).
        _coco(
            "annotations_trainval2014.zip",
            252_872_794,
            "031296bbc80c45a1d1f76bf9a90ead27e94e99ec629208449507a4917a3bf009",
            "annotations2014",
            _COCO_ANNOTATIONS_2014,
            default=False,
        ),
        _coco(
            "val2014.zip",
            6_645_013_297,
            "fe9be816052049c34717e077d9e34aa60814a55679f804cd043e3cbee3b9fde0",
            "val2014",
            ("val2014",),
            default=False,
        ),
        _coco(
            "train2014.zip",
            13_510_573_713,
            "ede4087e640bddba550e090eae701092534b554b42b05ac33f0300b984b31775",
            "train2014",
            ("train2014",),
            default=False,
        ),
    ),
    "flickr30k": (
        RemoteFile(
            name="annotations.zip",
            url=f"{_F30K_REPO}/raw/master/annotations.zip",
            size=None,
            sha256=None,  # none published (searched tfds, torchvision, HF scripts, repo README)
            md5=None,
            extract_to=".",
            source_note=_NO_CHECKSUM,
            part="annotations",
            provides=("Annotations", "Sentences"),
        ),
        *(
            RemoteFile(
                name=f"{split}.txt",
                url=f"{_F30K_RAW}/{split}.txt",
                size=None,
                sha256=None,  # none published
                md5=None,
                extract_to=".",
                source_note=_NO_CHECKSUM,
                part="splits",
                provides=(f"{split}.txt",),
            )
            for split in ("train", "val", "test")
        ),
    ),
}

MANUAL_STEPS: dict[str, tuple[ManualStep, ...]] = {
    "coco": (),
    "flickr30k": (
        ManualStep(
            what="Flickr30k images (flickr30k-images/<id>.jpg)",
            url="https://shannon.cs.illinois.edu/DenotationGraph/",
            instructions="fill in the request form there; unpack the flickr30k-images archive "
            "you are sent into ROOT so that ROOT/flickr30k-images/<id>.jpg exist",
            provides=("flickr30k-images",),
        ),
    ),
}


# ---------------------------------------------------------------------------- what is present


@dataclass(frozen=True, slots=True)
class FileStatus:
    """Where one file stands under a root.

    ``state``: ``installed`` (downloaded, digest verified, unpacked: its ``.done`` marker and
    every ``provides`` path exist), ``present`` (every ``provides`` path exists but this tool
    did not put it there: not verified), ``downloaded`` (verified download, not unpacked yet),
    ``partial`` (``partial_bytes`` of an interrupted download) or ``missing``.
    """

    file: RemoteFile
    state: str
    partial_bytes: int = 0

    @property
    def done(self) -> bool:
        return self.state in ("installed", "present")


@dataclass(frozen=True, slots=True)
class ManualStatus:
    step: ManualStep
    done: bool


@dataclass(frozen=True, slots=True)
class DatasetPlan:
    dataset: str
    root: Path
    files: tuple[FileStatus, ...]
    manual: tuple[ManualStatus, ...]

    @property
    def missing(self) -> tuple[FileStatus, ...]:
        return tuple(f for f in self.files if not f.done)


def dataset_files(dataset: str) -> tuple[RemoteFile, ...]:
    if dataset not in DATASET_FILES:
        raise ValueError(f"dataset {dataset!r} is not one of {tuple(DATASET_FILES)}")
    return DATASET_FILES[dataset]


def select_parts(
    files: Sequence[RemoteFile], parts: Sequence[str] | None
) -> tuple[RemoteFile, ...]:
    """The files of the named parts, or every ``default`` file when ``parts`` is empty/None."""
    if not parts:
        return tuple(f for f in files if f.default)
    known = list(dict.fromkeys(f.part for f in files))
    unknown = [p for p in parts if p not in known]
    if unknown:
        raise ValueError(f"unknown part {unknown[0]!r}; choose from {', '.join(known)}")
    return tuple(f for f in files if f.part in parts)


def _exists(path: Path) -> bool:
    if path.is_dir():
        return any(path.iterdir())
    return path.is_file()


def downloads_dir(root: Path) -> Path:
    return Path(root) / DOWNLOADS


def marker_path(file: RemoteFile, root: Path) -> Path:
    return downloads_dir(root) / f"{file.name}.done"


def file_status(file: RemoteFile, root: Path) -> FileStatus:
    root = Path(root)
    provided = bool(file.provides) and all(_exists(root / p) for p in file.provides)
    if marker_path(file, root).is_file() and (provided or not file.provides):
        return FileStatus(file, "installed")
    if provided:
        return FileStatus(file, "present")
    if (downloads_dir(root) / file.name).is_file():
        return FileStatus(file, "downloaded")
    part = downloads_dir(root) / f"{file.name}.part"
    if part.is_file():
        return FileStatus(file, "partial", part.stat().st_size)
    return FileStatus(file, "missing")


def plan(dataset: str, root: Path, files: Sequence[RemoteFile] | None = None) -> DatasetPlan:
    """What of ``dataset`` is under ``root`` and what is missing; reads no file contents and
    opens no connection. ``files`` defaults to every file of the dataset."""
    files = tuple(files) if files is not None else dataset_files(dataset)
    root = Path(root)
    manual = tuple(
        ManualStatus(s, bool(s.provides) and all(_exists(root / p) for p in s.provides))
        for s in MANUAL_STEPS.get(dataset, ())
    )
    return DatasetPlan(dataset, root, tuple(file_status(f, root) for f in files), manual)


# ------------------------------------------------------------------------------- checksums


def read_recorded(root: Path) -> dict[str, tuple[str, int]]:
    """``name -> (sha256, bytes)`` from ``ROOT/CHECKSUMS.txt`` (empty when there is none)."""
    path = Path(root) / CHECKSUMS_FILE
    if not path.is_file():
        return {}
    out = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3 or not _HEX.fullmatch(fields[0]) or not fields[1].isdigit():
            raise ValueError(f"{path}:{n}: expected '<sha256>  <bytes>  <name>', got {line!r}")
        out[fields[2]] = (fields[0], int(fields[1]))
    return out


def record_checksum(root: Path, name: str, sha256: str, size: int) -> None:
    recorded = read_recorded(root)
    recorded[name] = (sha256, size)
    lines = ["# sha256  bytes  name: digests of first downloads that had no published checksum"]
    lines += [f"{d}  {s}  {n}" for n, (d, s) in sorted(recorded.items())]
    path = Path(root) / CHECKSUMS_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class Expected:
    """The size and digests a download must have, and where they come from."""

    size: int | None
    sha256: str | None
    md5: str | None
    source: str


def expected(file: RemoteFile, root: Path) -> Expected:
    if file.published:
        return Expected(file.size, file.sha256, file.md5, f"published: {file.source_note}")
    recorded = read_recorded(root).get(file.name)
    if recorded is not None:
        return Expected(recorded[1], recorded[0], None, f"recorded in ROOT/{CHECKSUMS_FILE}")
    return Expected(file.size, None, None, "none")


# -------------------------------------------------------------------------------- download


@dataclass(frozen=True, slots=True)
class FetchResult:
    """``fetched_bytes`` came over the wire in this call (0 when the file was already there);
    ``resumed_from`` bytes of an earlier partial download were kept. ``note`` says how it was
    verified."""

    path: Path
    fetched_bytes: int
    resumed_from: int
    skipped: bool
    note: str


def _range_start(content_range: str | None) -> int | None:
    match = re.fullmatch(r"\s*bytes\s+(\d+)-\d+/(\d+|\*)\s*", content_range or "")
    return int(match.group(1)) if match else None


def _hash_prefix(path: Path, nbytes: int, hashers: Sequence[_Hasher]) -> None:
    with open(path, "rb") as fh:
        left = nbytes
        while left > 0:
            chunk = fh.read(min(CHUNK_BYTES, left))
            if not chunk:
                break
            left -= len(chunk)
            for h in hashers:
                h.update(chunk)


def _download(
    file: RemoteFile,
    part: Path,
    want: Expected,
    progress: Progress | None,
    timeout: float,
    hashers: Sequence[_Hasher],
) -> tuple[int, int, int | None]:
    """Append to or restart ``part``; returns the bytes kept from before, the bytes fetched and
    the file size the server announced (``None`` when it announced none)."""
    have = part.stat().st_size if part.is_file() else 0
    if want.size is not None and have > want.size:
        have = 0
    if want.size is not None and have == want.size:  # complete already: only verify it
        _hash_prefix(part, have, hashers)
        return have, 0, have
    ranged = have > 0 and urlsplit(file.url).scheme in ("http", "https")
    request = urllib.request.Request(file.url, headers={"User-Agent": USER_AGENT})
    if ranged:
        request.add_header("Range", f"bytes={have}-")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status = getattr(response, "status", None)
            keep = have if ranged and status == 206 else 0
            if keep and _range_start(response.headers.get("Content-Range")) != have:
                raise DownloadError(
                    f"{file.name}: the server answered a resume at byte {have} with "
                    f"{response.headers.get('Content-Range')!r}; delete {part} and rerun"
                )
            length = response.headers.get("Content-Length")
            announced = keep + int(length) if length is not None and length.isdigit() else None
            total = want.size if want.size is not None else announced
            if keep:
                _hash_prefix(part, keep, hashers)
            fetched = 0
            with open(part, "ab" if keep else "wb") as out:
                while chunk := response.read(CHUNK_BYTES):
                    out.write(chunk)
                    for h in hashers:
                        h.update(chunk)
                    fetched += len(chunk)
                    if progress is not None:
                        progress(keep + fetched, total)
            return keep, fetched, announced
    except urllib.error.HTTPError as err:
        if err.code == 416 and ranged:  # the partial file is no prefix of what is there now
            part.unlink()
            return _download(file, part, want, progress, timeout, hashers)
        raise DownloadError(
            f"{file.name}: {file.url} answered HTTP {err.code} {err.reason}"
        ) from err
    except _NETWORK_ERRORS as err:
        reason = getattr(err, "reason", err)
        raise DownloadError(
            f"{file.name}: could not download {file.url} ({reason}); the partial download "
            f"{part} is kept and a rerun resumes it"
        ) from err


def fetch(
    file: RemoteFile,
    root: Path,
    progress: Progress | None = None,
    timeout: float = 60.0,
) -> FetchResult:
    """Download ``file`` to ``ROOT/downloads/<name>``, verifying size and digest on the fly.

    The bytes go to ``<name>.part`` first; a partial file left by an interrupted run is resumed
    with an HTTP Range request where the server honours it (``file://`` URLs and servers that
    ignore the range start over). Only a file whose size and digests match is renamed to its
    final name; a mismatch deletes the part file and raises :class:`DownloadError` naming the
    file, the expected and the computed digest. A file without a published checksum gets the
    sha256 of its first download recorded in ``ROOT/CHECKSUMS.txt``, and later downloads must
    match that. Returns at once when the final file exists.
    """
    root = Path(root)
    final = downloads_dir(root) / file.name
    if final.is_file():
        return FetchResult(final, 0, 0, True, "already downloaded and verified")
    want = expected(file, root)
    downloads_dir(root).mkdir(parents=True, exist_ok=True)
    part = final.with_name(file.name + ".part")
    if want.size is not None:
        have = part.stat().st_size if part.is_file() else 0
        free = shutil.disk_usage(final.parent).free
        if want.size - have > free:
            raise DownloadError(
                f"{file.name}: needs {want.size - have:,} more bytes, {free:,} free in {final.parent}"
            )
    sha256, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    kept, fetched, announced = _download(file, part, want, progress, timeout, (sha256, md5))
    size = kept + fetched
    if want.size is not None and announced is not None and size < min(want.size, announced):
        raise DownloadError(
            f"{file.name}: the transfer ended at {size:,} of {want.size:,} bytes; the partial "
            f"download {part} is kept and a rerun resumes it"
        )
    got = {"sha256": sha256.hexdigest(), "md5": md5.hexdigest()}
    checks = [("size", want.size, size)]
    checks += [(algo, getattr(want, algo), got[algo]) for algo in ("sha256", "md5")]
    for what, exp, actual in checks:
        if exp is not None and exp != actual:
            part.unlink()
            raise DownloadError(
                f"{file.name}: {what} mismatch: expected {exp}, got {actual} "
                f"(expected value {want.source}); the download was deleted"
            )
    if want.source == "none":
        record_checksum(root, file.name, got["sha256"], size)
        note = f"no published checksum; recorded {got['sha256']} of what was downloaded"
    else:
        algos = [a for a in ("sha256", "md5") if getattr(want, a) is not None]
        note = f"{'+'.join(algos)} verified ({want.source})"
    os.replace(part, final)
    return FetchResult(final, fetched, kept, False, note)


# --------------------------------------------------------------------------------- extract


@dataclass(frozen=True, slots=True)
class ExtractResult:
    target: Path
    members: int
    skipped: bool


def _inside(base: Path, name: str) -> bool:
    relative = safe_relative_path(name)
    if relative is None:
        return False
    path = (base / relative).resolve()
    return path == base or base in path.parents


def _check_zip(zf: zipfile.ZipFile, base: Path, archive: str) -> None:
    for info in zf.infolist():
        mode = info.external_attr >> 16
        if not _inside(base, info.filename):
            raise UnsafeArchiveError(
                f"{archive}: member {info.filename!r} would land outside {base}"
            )
        if stat.S_ISLNK(mode):
            raise UnsafeArchiveError(f"{archive}: member {info.filename!r} is a symbolic link")


def _check_tar(tf: tarfile.TarFile, base: Path, archive: str) -> None:
    for member in tf.getmembers():
        if not _inside(base, member.name):
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} would land outside {base}")
        if member.issym() or member.islnk():
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is a link")
        if not (member.isfile() or member.isdir()):
            raise UnsafeArchiveError(f"{archive}: member {member.name!r} is not a file or folder")


def extract(file: RemoteFile, root: Path) -> ExtractResult:
    """Unpack ``ROOT/downloads/<name>`` into ``ROOT/<extract_to>`` (a plain file is copied
    there), then write the ``.done`` marker. Every member is checked before anything is
    written: one that would land outside the target (absolute, ``..``, through a symlink) or
    is a link raises :class:`UnsafeArchiveError` and nothing is unpacked. Skips when the marker
    exists and everything in ``provides`` is there."""
    root = Path(root)
    target = root if file.extract_to == "." else root / file.extract_to
    marker = marker_path(file, root)
    if file_status(file, root).state == "installed":
        return ExtractResult(target, 0, True)
    archive = downloads_dir(root) / file.name
    if not archive.is_file():
        raise DownloadError(f"{file.name}: nothing to unpack, {archive} does not exist")
    target.mkdir(parents=True, exist_ok=True)
    base = target.resolve()
    try:
        if file.archive == "zip":
            with zipfile.ZipFile(archive) as zf:
                _check_zip(zf, base, file.name)
                members = zf.infolist()
                for info in members:
                    zf.extract(info, base)
        elif file.archive == "tar":
            with tarfile.open(archive, "r:*") as tf:
                _check_tar(tf, base, file.name)
                members = tf.getmembers()
                # every member was checked above; the "data" filter (Python >= 3.11.4) also
                # drops permission bits and device files
                safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
                tf.extractall(base, members=members, **safe)  # type: ignore[arg-type]
        else:
            tmp = base / f".{file.name}.tmp"
            shutil.copyfile(archive, tmp)
            os.replace(tmp, base / file.name)
            members = [file.name]
    except (zipfile.BadZipFile, tarfile.TarError) as err:
        raise DownloadError(f"{file.name}: cannot unpack {archive}: {err}") from err
    missing = [p for p in file.provides if not _exists(root / p)]
    if missing:
        raise DownloadError(
            f"{file.name}: unpacked {len(members)} members into {target}, but {missing[0]} is "
            "not there; the archive's layout is not the one expected"
        )
    marker.write_text(
        json.dumps({"name": file.name, "extract_to": file.extract_to, "members": len(members)})
        + "\n",
        encoding="utf-8",
    )
    return ExtractResult(target, len(members), False)


@dataclass(frozen=True, slots=True)
class InstallResult:
    file: RemoteFile
    state_before: str
    fetch: FetchResult | None
    extract: ExtractResult | None


def install(
    file: RemoteFile,
    root: Path,
    progress: Progress | None = None,
    timeout: float = 60.0,
    delete_archive: bool = False,
) -> InstallResult:
    """Fetch and unpack ``file`` unless it is ``installed`` or ``present`` already (a rerun
    fetches nothing). With ``delete_archive`` the download is removed once unpacked."""
    before = file_status(file, root).state
    if before in ("installed", "present"):
        return InstallResult(file, before, None, None)
    fetched = fetch(file, root, progress, timeout)
    unpacked = extract(file, root)
    if delete_archive:
        fetched.path.unlink(missing_ok=True)
    return InstallResult(file, before, fetched, unpacked)


def describe_size(size: int | None) -> str:
    if size is None:
        return "size not published"
    value, unit = float(size), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{size:,} bytes ({value:.1f} {unit})" if unit != "B" else f"{size:,} bytes"


def checksum_lines(
    file: RemoteFile, recorded: Mapping[str, tuple[str, int]]
) -> list[tuple[str, str]]:
    """How ``file`` is verified, as (label, text) pairs: the digests and where they come from."""
    lines = [(algo, d) for algo in ("sha256", "md5") if (d := getattr(file, algo))]
    if file.published:
        lines.append(("source", file.source_note))
    elif file.name in recorded:
        lines.append(("sha256", f"{recorded[file.name][0]} (recorded in ROOT/{CHECKSUMS_FILE})"))
        lines.append(("source", file.source_note))
    else:
        lines.append(("checksum", file.source_note))
    return lines


__all__ = [
    "CHECKSUMS_FILE",
    "DATASET_FILES",
    "DOWNLOADS",
    "MANUAL_STEPS",
    "DatasetPlan",
    "DownloadError",
    "Expected",
    "ExtractResult",
    "FetchResult",
    "FileStatus",
    "InstallResult",
    "ManualStatus",
    "ManualStep",
    "Progress",
    "RemoteFile",
    "UnsafeArchiveError",
    "checksum_lines",
    "dataset_files",
    "describe_size",
    "downloads_dir",
    "expected",
    "extract",
    "fetch",
    "file_status",
    "install",
    "marker_path",
    "plan",
    "read_recorded",
    "record_checksum",
    "select_parts",
]
