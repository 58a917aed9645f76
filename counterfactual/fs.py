"""Local paths and fsspec URLs behind one small set of functions.

Every option that names input or output data takes a local path or a URL that fsspec knows
(``s3://bucket/key``, ``gs://``, ``az://``, ``hf://``, ``file://``). Local paths go through the
standard library (no fsspec import); URLs through ``fsspec.core.url_to_fs``, so credentials and
endpoints are read the standard way of each backend (for S3 the ``AWS_*`` variables, including
``AWS_ENDPOINT_URL``). The object-store backends are optional extras
(``pip install "counterfactual-vl[s3]"``, ``[gcs]``, ``[azure]``).

Paths are returned as ``str`` for URLs and :class:`~pathlib.Path` for local paths, so code that
only ever sees local data keeps its ``Path`` objects.

Writes are atomic: :func:`atomic_write` writes a local file under a temporary name and renames it
when complete; on an object store the object appears only when its upload (single or multipart)
completes, and an upload cut short leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob as _glob
import hashlib
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from counterfactual._lazy import extra_hint, require
from counterfactual.messages import one_line

PathLike = str | os.PathLike[str]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure"}
"""The extra that installs each scheme's backend (``pip install "counterfactual-vl[s3]"``)."""


def is_url(path: PathLike) -> bool:
    """Whether ``path`` names a location through a scheme other than ``file://``."""
    m = _SCHEME.match(os.fspath(path))
    return m is not None and m.group(1).lower() != "file"


def as_path(path: PathLike) -> str | Path:
    """A URL as ``str``, anything local (a ``file://`` URL too) as :class:`Path`."""
    text = os.fspath(path)
    if is_url(text):
        return text.rstrip("/") if text.count("/") > 3 else text
    if text.startswith("file://"):
        text = text[len("file://") :]
    return Path(text)


@dataclass(frozen=True, slots=True)
class StoreLimits:
    """How long object-store I/O may wait (S3 and S3-compatible stores, through botocore).

    ``connect``: seconds to open a connection; ``read``: seconds without a byte of an answer;
    ``attempts``: tries of one request (botocore's ``standard`` retry mode: the first and its
    retries, with exponential backoff of at most 20 s between them). One request therefore
    gives up after at most :attr:`budget` seconds, and the run ends with one line
    (:func:`store_error`). Read from the environment (:meth:`from_env`):
    ``COUNTERFACTUAL_S3_CONNECT_TIMEOUT``, ``COUNTERFACTUAL_S3_READ_TIMEOUT``,
    ``COUNTERFACTUAL_S3_ATTEMPTS``.
    """

    connect: float = 10.0
    read: float = 60.0
    attempts: int = 3

    def __post_init__(self) -> None:
        if not (self.connect > 0 and self.read > 0):
            raise ValueError(
                f"object-store timeouts must be > 0 s, got connect={self.connect}, read={self.read}"
            )
        if self.attempts < 1:
            raise ValueError(f"object-store attempts must be >= 1, got {self.attempts}")

    @property
    def budget(self) -> float:
        """Seconds after which one request has surely given up: every attempt waiting its
        full connect and read timeouts, and botocore's backoff between them."""
        backoff = sum(min(2.0**i, 20.0) for i in range(self.attempts - 1))
        return self.attempts * (self.connect + self.read) + backoff

    @classmethod
    def from_env(cls) -> StoreLimits:
        """The limits the ``COUNTERFACTUAL_S3_*`` variables set (``ValueError`` naming a bad
        one), the defaults for the others."""
        values: dict[str, Any] = {}
        for name, field_, kind in (
            ("COUNTERFACTUAL_S3_CONNECT_TIMEOUT", "connect", float),
            ("COUNTERFACTUAL_S3_READ_TIMEOUT", "read", float),
            ("COUNTERFACTUAL_S3_ATTEMPTS", "attempts", int),
        ):
            text = os.environ.get(name)
            if text:
                try:
                    values[field_] = kind(text)
                except ValueError:
                    raise ValueError(f"{name}={text!r} is not a number") from None
        return cls(**values)

    def storage_options(self) -> dict[str, Any]:
        """s3fs's options that set these limits (``config_kwargs`` go to aiobotocore's
        ``AioConfig``)."""
        return {
            "config_kwargs": {
                "connect_timeout": self.connect,
                "read_timeout": self.read,
                "retries": {"total_max_attempts": self.attempts, "mode": "standard"},
                "http_session_cls": _http_session(),
            }
        }


@functools.cache
def _http_session() -> type:
    """aiobotocore's HTTP session without ``Expect: 100-continue``: botocore asks for it on
    every upload, and aiohttp then waits for the server's ``100 Continue`` with no timeout at
    all, so a stalled store would hang an upload forever. Without it the body goes at once and
    the read timeout applies to the answer."""
    from aiobotocore.httpsession import AIOHTTPSession

    class NoContinueSession(AIOHTTPSession):  # type: ignore[misc]
        async def send(self, request: Any) -> Any:
            if "Expect" in request.headers:
                del request.headers["Expect"]
            response = await super().send(request)
            if response.status_code >= 400:
                response.headers[REQUEST_HEADER] = f"{request.method} {request.url}"
            return response

    return NoContinueSession


REQUEST_HEADER = "x-counterfactual-request"
"""A header our HTTP session adds to every S3 error answer it receives (``METHOD URL`` of the
request refused): botocore keeps the answer's headers in the error it raises
(``ResponseMetadata.HTTPHeaders``), so :func:`store_error` can name the object, which neither
S3's error body nor s3fs's translation of it does."""


_S3_SCHEMES = ("s3", "s3a")


def filesystem(path: PathLike) -> tuple[Any, str]:
    """``(fsspec filesystem, path inside it)`` for a URL; ``ValueError`` naming the extra to
    install when its backend is missing. S3 gets the timeouts and retries of
    :class:`StoreLimits` (botocore retries; s3fs's own retry loop is set to one pass, so the
    budget holds)."""
    fsspec = require("fsspec", "s3")
    text = os.fspath(path)
    scheme = _SCHEME.match(text)
    s3 = scheme is not None and scheme.group(1).lower() in _S3_SCHEMES
    try:
        if not s3:
            return fsspec.core.url_to_fs(text)
        fsys, inside = fsspec.core.url_to_fs(text, **StoreLimits.from_env().storage_options())
        fsys.retries = 1  # botocore retries (with backoff); s3fs would multiply them
        return fsys, inside
    except ImportError as err:
        scheme = _SCHEME.match(text)
        extra = EXTRAS.get(scheme.group(1).lower() if scheme else "", "s3")
        raise ValueError(
            f"{text}: this scheme needs an fsspec backend that is not installed; "
            f"{extra_hint(extra)} ({err})"
        ) from err


def _unstrip(inside: str, fs: Any) -> str:
    """A path from ``fs`` back as a full URL with its scheme."""
    return fs.unstrip_protocol(inside) if hasattr(fs, "unstrip_protocol") else inside


def join(base: PathLike, *parts: str) -> str | Path:
    """``base / part / ...`` for a local path, ``base/part/...`` for a URL."""
    b = as_path(base)
    if isinstance(b, Path):
        return b.joinpath(*parts)
    return "/".join([b.rstrip("/"), *(p.strip("/") for p in parts)])


def name(path: PathLike) -> str:
    """The last component of ``path``."""
    return os.fspath(path).rstrip("/").rsplit("/", 1)[-1]


def parent(path: PathLike) -> str | Path:
    p = as_path(path)
    if isinstance(p, Path):
        return p.parent
    return p.rstrip("/").rsplit("/", 1)[0]


def open_file(path: PathLike, mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """Open a local file or a URL (``FileNotFoundError`` when it does not exist)."""
    p = as_path(path)
    if isinstance(p, Path):
        return open(p, mode, **kwargs)  # noqa: SIM115 - the caller closes it
    fs, inside = filesystem(p)
    return fs.open(inside, mode, **kwargs)


def exists(path: PathLike) -> bool:
    p = as_path(path)
    if isinstance(p, Path):
        return p.exists()
    fs, inside = filesystem(p)
    return bool(fs.exists(inside))


def isfile(path: PathLike) -> bool:
    p = as_path(path)
    if isinstance(p, Path):
        return p.is_file()
    fs, inside = filesystem(p)
    return bool(fs.isfile(inside))


def isdir(path: PathLike) -> bool:
    """A local folder, or a URL prefix that holds objects (object stores have no empty
    folders: a bucket prefix is a folder once something lies under it)."""
    p = as_path(path)
    if isinstance(p, Path):
        return p.is_dir()
    fs, inside = filesystem(p)
    return bool(fs.isdir(inside))


def size(path: PathLike) -> int:
    p = as_path(path)
    if isinstance(p, Path):
        return p.stat().st_size
    fs, inside = filesystem(p)
    return int(fs.size(inside))


def glob(pattern: PathLike) -> list[str | Path]:
    """Files matching a shell glob, sorted; URLs keep their scheme."""
    p = as_path(pattern)
    if isinstance(p, Path):
        return [Path(x) for x in sorted(_glob.glob(str(p))) if os.path.isfile(x)]
    fs, inside = filesystem(p)
    found = sorted(x for x in fs.glob(inside) if not fs.isdir(x))
    return [_unstrip(x, fs) for x in found]


def listdir(folder: PathLike) -> list[str]:
    """The names (last components) of the files directly in ``folder``; ``[]`` when it does
    not exist."""
    p = as_path(folder)
    if isinstance(p, Path):
        try:
            return sorted(e.name for e in os.scandir(p) if e.is_file())
        except FileNotFoundError:
            return []
    fs, inside = filesystem(p)
    try:
        entries = fs.ls(inside, detail=True, refresh=True)
    except FileNotFoundError:
        return []
    return sorted(name(e["name"]) for e in entries if e.get("type") != "directory")


def makedirs(path: PathLike) -> None:
    """Create a local folder (and its parents); nothing to do on an object store."""
    p = as_path(path)
    if isinstance(p, Path):
        p.mkdir(parents=True, exist_ok=True)


def remove(path: PathLike) -> None:
    """Delete a file or object; no error when it is already gone."""
    p = as_path(path)
    if isinstance(p, Path):
        p.unlink(missing_ok=True)
        return
    fs, inside = filesystem(p)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(inside)


def read_bytes(path: PathLike) -> bytes:
    with open_file(path, "rb") as fh:
        return fh.read()


def read_text(path: PathLike) -> str:
    return read_bytes(path).decode("utf-8")


def file_sha256(path: PathLike) -> str:
    """SHA-256 of a local file or object, read in 1 MiB blocks (about 1.2 GB/s on a core with
    SHA instructions)."""
    h = hashlib.sha256()
    with open_file(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def write_bytes(
    path: PathLike, data: bytes, *, run: str | None = None, durable: bool = False
) -> None:
    """Write a whole file atomically (see :func:`atomic_write`)."""
    with atomic_write(path, run=run, durable=durable) as fh:
        fh.write(data)


def write_text(path: PathLike, text: str, *, run: str | None = None, durable: bool = False) -> None:
    write_bytes(path, text.encode("utf-8"), run=run, durable=durable)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the system can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(fd)
    except OSError as err:  # a filesystem that cannot sync folders
        if err.errno not in (errno.EINVAL, errno.EBADF):
            raise
    finally:
        os.close(fd)


class OutputError(OSError):
    """Output that cannot be written for a reason no single sample causes (the disk is full):
    the run stops with this one-line message, and a rerun of the same command resumes. It
    pickles as itself, so a Ray worker's reaches the driver (as the ``cause`` of Ray's
    ``RayTaskError``)."""


NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errnos of a full disk or an exhausted quota."""


def disk_full(err: BaseException, path: PathLike) -> OutputError | None:
    """The :class:`OutputError` to raise instead of ``err`` when ``err`` says that there is no
    space left while writing ``path``; ``None`` for any other error."""
    if isinstance(err, OSError) and not isinstance(err, OutputError) and err.errno in NO_SPACE:
        return OutputError(
            f"disk full while writing {os.fspath(path)}: free space and rerun the same command "
            "to resume"
        )
    return None


TMP_SUFFIX = ".tmp"


def temp_name(path: PathLike, run: str | None = None) -> str | Path:
    """A temporary name beside ``path``, unique to this writer: ``NAME.<token>.tmp``; with a
    ``run`` token (hex, the first 12 kept) ``NAME.<run>-<token>.tmp``, so that the run that
    made it can find it again and leave every other writer's alone (:func:`temp_target`)."""
    p = as_path(path)
    token = uuid.uuid4().hex[:12] if run is None else f"{run[:12]}-{uuid.uuid4().hex[:8]}"
    if isinstance(p, Path):
        return p.with_name(f"{p.name}.{token}{TMP_SUFFIX}")
    return f"{p}.{token}{TMP_SUFFIX}"


_TEMP = re.compile(r"(?P<target>.+)\.(?P<run>[0-9a-f]{12})(?:-[0-9a-f]{8})?" + re.escape(".tmp"))


def temp_target(name: str) -> tuple[str, str] | None:
    """``(target name, token)`` of a name :func:`temp_name` makes (``shard-000001.tar`` and the
    run token, or the writer's own token), else ``None``: a ``notes.tmp`` is nobody's temp."""
    m = _TEMP.fullmatch(name)
    return None if m is None else (m.group("target"), m.group("run"))


def _no_follow(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)


def _create_new(path: Path) -> IO[bytes]:
    """A new file at ``path`` to write (``x``: ``O_CREAT | O_EXCL``, and ``O_NOFOLLOW``):
    ``FileExistsError`` when anything is there, a symbolic link included, so a write never
    follows one."""
    return open(path, "xb", opener=_no_follow)  # noqa: SIM115 - the caller closes it


@contextlib.contextmanager
def atomic_write(
    path: PathLike, *, run: str | None = None, durable: bool = False
) -> Iterator[IO[bytes]]:
    """A binary file to write ``path`` with: it appears whole when the block ends without an
    exception, and not at all otherwise.

    Locally the data goes to :func:`temp_name` (``run``: the run token it carries), a new file
    (never through a link planted at that name), and is renamed over ``path`` (a link at
    ``path`` is replaced, its target untouched); ``durable``: the file is fsynced before the rename and its folder
    after it, so that a node crash leaves the old state or the whole new file. On an object
    store fsspec uploads on close (multipart for large files), and the object exists only once
    the upload completes; an exception discards the upload. No space left: :class:`OutputError`.
    """
    p = as_path(path)
    if isinstance(p, Path):
        tmp = temp_name(p, run)
        assert isinstance(tmp, Path)
        try:
            with _create_new(tmp) as fh:
                yield fh
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, p)
            if durable:
                _fsync_folder(p.parent)
        except BaseException as err:
            tmp.unlink(missing_ok=True)
            full = disk_full(err, p)
            if full is not None:
                raise full from err
            raise
        return
    fs, inside = filesystem(p)
    fh = fs.open(inside, "wb")
    try:
        yield fh
    except BaseException as err:
        discard = getattr(fh, "discard", None)
        if discard is not None:
            discard()
            fh.closed = True  # nothing left to upload: its __del__ must not try
        else:  # pragma: no cover - backends without discard
            with contextlib.suppress(Exception):
                fh.close()
            remove(p)
        full = disk_full(err, p)
        if full is not None:
            raise full from err
        raise
    try:
        fh.close()
    except OSError as err:
        full = disk_full(err, p)
        if full is not None:
            raise full from err
        raise


def safe_relative_path(name: str) -> str | None:
    """``name`` as a relative POSIX path inside the dataset root, or ``None`` when it is absolute,
    empty or climbs out with ``..`` (a dataset file must never make us read elsewhere)."""
    if not isinstance(name, str) or not name or "\x00" in name:
        return None
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        return None
    return path.as_posix()


def inside(root: PathLike, path: PathLike) -> str | Path | None:
    """``path`` when it lies inside the folder ``root`` (or is ``root``), else ``None``: the one
    rule for every file a dataset names (a picture, a caption, a shard, a table).

    Local: both sides resolved, symlinks followed (a link that leaves ``root`` leaves it, one
    that stays inside is fine; a link loop is outside), and ``path`` comes back resolved; a
    relative ``path`` is taken from the working folder, as ``open`` takes it. A URL: an object
    store has no links, so ``path`` must be ``root/`` followed by a :func:`safe_relative_path`;
    a URL and a local path are never inside each other."""
    r, p = as_path(root), as_path(path)
    if isinstance(r, str) or isinstance(p, str):
        if not (isinstance(r, str) and isinstance(p, str)):
            return None
        base = r.rstrip("/")
        rest = p.rstrip("/")[len(base) + 1 :] if p.startswith(base + "/") else None
        if p.rstrip("/") == base or (rest is not None and safe_relative_path(rest) is not None):
            return p
        return None
    try:
        base, found = r.resolve(), p.resolve()
    except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13)
        return None
    return found if found == base or base in found.parents else None


def abort_uploads(folder: PathLike, wanted: Callable[[str], bool]) -> int:
    """Abort the unfinished multipart uploads of objects directly in ``folder`` whose name
    ``wanted(name)`` accepts (a writer killed mid-upload leaves one, invisible but billed); a
    no-op for local folders and stores other than S3. Returns how many it aborted."""
    p = as_path(folder)
    if isinstance(p, Path):
        return 0
    fsys, inside = filesystem(p)
    protocols = fsys.protocol if isinstance(fsys.protocol, tuple) else (fsys.protocol,)
    if not set(protocols) & set(_S3_SCHEMES):
        return 0
    bucket, _, prefix = inside.strip("/").partition("/")
    prefix = f"{prefix}/" if prefix else ""
    aborted = 0
    marker: dict[str, str] = {}
    while True:
        page = fsys.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix, **marker)
        for upload in page.get("Uploads", []):
            rest = upload["Key"][len(prefix) :]
            if "/" not in rest and wanted(rest):
                fsys.call_s3(
                    "abort_multipart_upload",
                    Bucket=bucket,
                    Key=upload["Key"],
                    UploadId=upload["UploadId"],
                )
                aborted += 1
        if not page.get("IsTruncated"):
            return aborted
        marker = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


def store_error(err: BaseException) -> OutputError | None:
    """The one-line :class:`OutputError` for an object store that cannot be used, naming the
    endpoint and the cause (``unreachable``, ``no credentials``, ``bucket X does not exist``,
    ``timed out after N s``); ``None`` for any other error. A rerun of the same command
    resumes once the store is back."""
    botocore = sys.modules.get("botocore.exceptions")
    limits = StoreLimits.from_env()
    endpoint = _endpoint(getattr(err, "kwargs", {}).get("endpoint_url"))
    again = "rerun the same command to resume once it answers"
    if botocore is not None and isinstance(
        err, botocore.NoCredentialsError | botocore.PartialCredentialsError
    ):
        cause = "no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
        again = "rerun the same command to resume once they are set"
    elif botocore is not None and isinstance(err, botocore.ConnectTimeoutError):
        cause = f"unreachable (no connection within {limits.connect:g} s, {limits.attempts} tries)"
    elif botocore is not None and isinstance(err, botocore.EndpointConnectionError):
        cause = f"unreachable (connection refused or no route, {limits.attempts} tries)"
    elif (botocore is not None and isinstance(err, botocore.ReadTimeoutError)) or _timeout(err):
        cause = f"timed out after {limits.read:g} s without an answer ({limits.attempts} tries)"
    elif isinstance(err, FileNotFoundError) and "bucket does not exist" in str(err):
        bucket = _bucket_of(err)
        cause = f"bucket {bucket} does not exist" if bucket else "the bucket does not exist"
        again = "create it or name another --out"
    else:
        return _refusal(err)
    return OutputError(one_line(f"object store {endpoint}: {cause}; {again}"))


@dataclass(frozen=True, slots=True)
class Refusal:
    """An S3 error answer, as botocore parsed it: ``status`` (HTTP), S3's error ``code``
    (``AccessDenied``, ``SlowDown``; a ``HEAD``'s is its status, as S3 sends no body),
    ``tries`` (the first request and botocore's retries), and the request refused when our
    HTTP session recorded it (:data:`REQUEST_HEADER`): ``method`` and ``url``."""

    status: int
    code: str
    tries: int
    method: str = ""
    url: str = ""

    @classmethod
    def of(cls, err: BaseException) -> Refusal | None:
        """The refusal ``err`` is (botocore's ``ClientError``) or that s3fs translated into it
        (its ``__cause__``: ``PermissionError`` for 403, ``OSError`` EBUSY for 503); ``None``
        for any other error."""
        for candidate in (err, err.__cause__):
            response = getattr(candidate, "response", None)
            if isinstance(response, dict) and isinstance(response.get("ResponseMetadata"), dict):
                meta = response["ResponseMetadata"]
                status = meta.get("HTTPStatusCode")
                if not isinstance(status, int):
                    return None
                code = str((response.get("Error") or {}).get("Code") or status)
                request = str((meta.get("HTTPHeaders") or {}).get(REQUEST_HEADER, ""))
                method, _, url = request.partition(" ")
                return cls(status, code, int(meta.get("RetryAttempts") or 0) + 1, method, url)
        return None


_DENIED_CODES = frozenset(
    {"AccessDenied", "Forbidden", "AllAccessDisabled", "AccountProblem", "NotSignedUp"}
)
_CREDENTIAL_CODES = {
    "InvalidAccessKeyId": "the access key is not known to the store",
    "SignatureDoesNotMatch": "the secret key does not match the access key",
    "ExpiredToken": "the session token has expired",
    "InvalidToken": "the session token is not valid",
    "TokenRefreshRequired": "the session token has expired",
    "RequestTimeTooSkewed": "this machine's clock is too far from the store's",
}
_THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded"}
)
_VERBS = {"GET": "reading", "HEAD": "looking up", "PUT": "writing", "DELETE": "deleting"}


def _refusal(err: BaseException) -> OutputError | None:
    """The one line for a store that refuses a request (403: credentials or permission) or
    keeps answering 503 ``SlowDown`` (throttling) or another 5xx after every try: endpoint,
    the request (what and which object), the HTTP status and S3's code, the cause and the
    rerun. ``None`` for other answers (a missing key is its file's own error)."""
    refusal = Refusal.of(err)
    if refusal is None:
        return None
    limits = StoreLimits.from_env()
    tries = f"{refusal.tries} {'try' if refusal.tries == 1 else 'tries'}"
    if refusal.code in _CREDENTIAL_CODES:
        cause = f"credentials refused ({_CREDENTIAL_CODES[refusal.code]})"
        again = "rerun the same command to resume once they are fixed"
    elif refusal.status == 403 or refusal.code in _DENIED_CODES:
        cause = (
            "access denied: the credentials may not do this (expired, or a bucket or IAM "
            "policy refuses it; check AWS_ACCESS_KEY_ID or AWS_PROFILE and the policies)"
        )
        again = "rerun the same command to resume once they may"
    elif refusal.status in (429, 503) or refusal.code in _THROTTLE_CODES:
        cause = f"throttled: the store asks for fewer requests per second, still after {tries}"
        again = (
            "rerun the same command to resume (COUNTERFACTUAL_S3_ATTEMPTS, now "
            f"{limits.attempts}, lets each request wait longer)"
        )
    elif refusal.status >= 500:
        cause = f"the store failed, still after {tries}"
        again = "rerun the same command to resume once it answers"
    else:
        return None
    endpoint, target = _request_target(refusal)
    request = f"HTTP {refusal.status} {refusal.code}" + (f" {target}" if target else "")
    return OutputError(one_line(f"object store {endpoint}: {request}: {cause}; {again}"))


def _request_target(refusal: Refusal) -> tuple[str, str]:
    """``(endpoint, "writing s3://bucket/key")`` of a refused request: the endpoint the
    request went to (the bucket left out of a virtual-hosted name), and what it did to which
    object, or ``""`` when the request is not known."""
    configured = _endpoint(None)
    found = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]+)([^?#]*)\??([^#]*)", refusal.url)
    if found is None:
        return configured, ""
    scheme, host, path, query = found.groups()
    from urllib.parse import parse_qs, unquote

    configured_host = configured.partition("://")[2]
    if configured_host and host.endswith("." + configured_host):
        bucket, endpoint_host = host[: -len(configured_host) - 1], configured_host
    elif (virtual := re.match(r"^(.+?)\.(s3[.-].*amazonaws\.com.*)$", host)) is not None:
        bucket, endpoint_host = virtual.group(1), virtual.group(2)
    else:
        bucket, _, path = path.lstrip("/").partition("/")
        endpoint_host = host
    key = unquote(path.lstrip("/"))
    params = parse_qs(query, keep_blank_values=True)
    verb = _VERBS.get(refusal.method, "writing")
    if refusal.method == "GET" and not key:
        verb, key = "listing", (params.get("prefix") or [""])[0]
    elif refusal.method == "POST" and "delete" in params:
        verb = "deleting"
    return f"{scheme}://{endpoint_host}", f"{verb} s3://{bucket}/{key}"


def store_failures() -> tuple[type[BaseException], ...]:
    """The exceptions an object store that is down, stalled or refusing raises: ``OSError``
    (s3fs's translations), timeouts, and botocore's own errors when botocore is loaded (they
    are no ``OSError``). For code that retries or reports such failures, not for samples."""
    kinds: list[type[BaseException]] = [OSError, TimeoutError]
    botocore = sys.modules.get("botocore.exceptions")
    if botocore is not None:
        kinds += [botocore.BotoCoreError, botocore.ClientError]
    fsspec_errors = sys.modules.get("fsspec.exceptions")
    if fsspec_errors is not None:
        kinds.append(fsspec_errors.FSTimeoutError)
    return tuple(kinds)


def _timeout(err: BaseException) -> bool:
    """fsspec's and asyncio's timeouts (s3fs raises them for a stalled transfer)."""
    fsspec_asyn = sys.modules.get("fsspec.exceptions")
    kinds: tuple[type[BaseException], ...] = (TimeoutError,)
    if fsspec_asyn is not None:
        kinds += (fsspec_asyn.FSTimeoutError,)
    return isinstance(err, kinds) and not isinstance(err, OutputError)


def _endpoint(url: str | None) -> str:
    """``scheme://host:port`` of a request's url, else the configured S3 endpoint."""
    url = url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return "AWS S3"
    found = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/]+", url)
    return found.group(0) if found else url


def _bucket_of(err: BaseException) -> str | None:
    """The bucket an s3fs ``FileNotFoundError`` is about: S3 names it in the error response
    of the botocore error it translated (its ``__cause__``), else its filename."""
    response = getattr(err.__cause__, "response", None)
    if isinstance(response, dict):
        bucket = (response.get("Error") or {}).get("BucketName")
        if isinstance(bucket, str) and bucket:
            return bucket
    name_ = getattr(err, "filename", None)
    if isinstance(name_, str) and name_:
        return name_.removeprefix("s3://").split("/", 1)[0]
    return None
