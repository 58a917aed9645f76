"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1.

The session fixture ``s3`` starts ``moto_server`` on a free port, points the standard ``AWS_*``
variables at it (subprocesses such as Ray workers inherit them) and yields an :class:`S3Server`
that makes fresh buckets and copies files in and out. Tests are skipped when moto or s3fs is not
installed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class S3Server:
    """A running moto server: ``endpoint`` is its ``http://127.0.0.1:<port>`` address."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._numbers = itertools.count()

    def _fs(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(
            key=_ENV["AWS_ACCESS_KEY_ID"],
            secret=_ENV["AWS_SECRET_ACCESS_KEY"],
            endpoint_url=self.endpoint,
            skip_instance_cache=True,
        )

    def bucket(self, name: str | None = None) -> str:
        """Create a bucket (``cf-test-<n>`` unless named) and return ``"s3://<name>"``."""
        name = name or f"cf-test-{next(self._numbers)}"
        if not _BUCKET.match(name) or ".." in name:
            raise ValueError(f"invalid bucket name {name!r}")
        self._fs().mkdir(name)
        return f"s3://{name}"

    def upload(self, local: Path, url: str) -> None:
        """Copy a file to ``url``, or a folder's files recursively under ``url``."""
        local = Path(local)
        fs = self._fs()
        target = url.removeprefix("s3://").rstrip("/")
        if local.is_dir():
            for path in sorted(p for p in local.rglob("*") if p.is_file()):
                fs.put_file(str(path), f"{target}/{path.relative_to(local).as_posix()}")
        else:
            fs.put_file(str(local), target)

    def download(self, url: str, local: Path) -> None:
        """Copy the object at ``url`` to the file ``local``, or every object under the prefix
        ``url`` into the folder ``local``."""
        local = Path(local)
        fs = self._fs()
        source = url.removeprefix("s3://").rstrip("/")
        if fs.isfile(source):
            local.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(source, str(local))
            return
        for key in fs.find(source):
            dest = local / key[len(source) :].lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            fs.get_file(key, str(dest))


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_up(endpoint: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(endpoint + "/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server did not answer at {endpoint} within {timeout:.0f} s")


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """A moto S3 server for the whole session, with ``AWS_*`` pointing at it."""
    try:
        import moto  # noqa: F401
        import s3fs
    except ImportError as err:
        pytest.skip(f"S3 tests need moto[server] and s3fs: {err}")
    proc, endpoint = start_moto()
    names = ["AWS_ENDPOINT_URL", *_ENV]
    saved = {k: os.environ.get(k) for k in names}
    try:
        os.environ.update(_ENV, AWS_ENDPOINT_URL=endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        yield S3Server(endpoint)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        s3fs.S3FileSystem.clear_instance_cache()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 in front of a server: :meth:`stop` makes the endpoint
    unreachable (listener and every open connection closed, as an outage does) while the
    server keeps its objects, and :meth:`start` brings it back on the same port."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._guard = threading.Lock()

    def start(self) -> None:
        """Listen on :attr:`port` (again, after :meth:`stop`); a forwarder listening already
        goes on as it is."""
        if self._listener is not None:
            return
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._guard:
            for sock in list(self._open):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._guard:
                self._open.update((client, server))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def start_moto() -> tuple[subprocess.Popen, str]:
    """A moto server of its own (a test that stops or pauses it), and its endpoint; the
    caller terminates it."""
    exe = Path(sys.executable).with_name("moto_server")
    if not exe.is_file():
        pytest.skip(f"S3 tests need the moto_server console script ({exe} is missing)")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_until_up(endpoint, proc)
    except BaseException:
        proc.kill()
        raise
    return proc, endpoint


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of a server that answers like a refusing or
    throttling S3: once ``after`` requests that ``matches`` accepts have gone through, every
    further one gets ``status`` with S3's error body for ``code`` (``403 AccessDenied``,
    ``503 SlowDown``; a ``HEAD`` gets no body, as S3 sends none), until :meth:`heal`. Requests
    are forwarded one at a time per connection, keep-alive included; :meth:`stop` ends it."""

    def __init__(
        self,
        target: str,
        status: int,
        code: str,
        after: int,
        matches: Any = None,
    ) -> None:
        from http.server import ThreadingHTTPServer

        self.target = target
        self.status, self.code, self.after = status, code, after
        self.matches = matches or (lambda method, path: True)
        self.faults = 0  # requests answered with the fault
        self.seen: list[str] = []  # "METHOD PATH" of every request that ``matches`` accepts
        self._seen = 0
        self._guard = threading.Lock()
        self._healed = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def heal(self) -> None:
        """Every request goes through from now on."""
        self._healed = True

    def _fault(self, method: str, path: str) -> bool:
        if self._healed or not self.matches(method, path):
            return False
        with self._guard:
            self._seen += 1
            self.seen.append(f"{method} {path}")
            fault = self._seen > self.after
            self.faults += fault
            return fault

    def _error_body(self) -> bytes:
        message = {"AccessDenied": "Access Denied", "SlowDown": "Please reduce your request rate."}
        return (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{self.code}</Code><Message>{message.get(self.code, self.code)}"
            "</Message><RequestId>FAULT</RequestId></Error>"
        ).encode()

    def _handler(self) -> type:
        import http.client
        from http.server import BaseHTTPRequestHandler

        proxy = self
        host, _, port = proxy.target.removeprefix("http://").partition(":")
        hop = {"connection", "keep-alive", "transfer-encoding", "content-length"}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if proxy._fault(self.command, self.path):
                    payload = b"" if self.command == "HEAD" else proxy._error_body()
                    self.send_response(proxy.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                    self.send_response(answer.status, answer.reason)
                    for key, value in answer.getheaders():
                        if key.lower() not in hop:
                            self.send_header(key, value)
                    given = answer.getheader("Content-Length")
                    head = self.command == "HEAD" and given is not None
                    self.send_header("Content-Length", given if head else str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        return Handler
