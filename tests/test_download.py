"""`counterfactual data` and counterfactual.readers.download, offline: tiny archives served through
file:// URLs and a loopback HTTP server built here; nothing reaches the network."""

import hashlib
import http.server
import io
import tarfile
import threading
import urllib.request
import zipfile
from pathlib import Path

import pytest

from counterfactual.cli import main
from counterfactual.readers import download as dl

NESTED = {"pkg/inner/a.txt": b"alpha\n", "pkg/b.txt": b"beta beta\n"}


def make_zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data)
    return path


def make_targz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def remote(path: Path, name: str | None = None, **overrides) -> dl.RemoteFile:
    """A RemoteFile for the local file ``path``, with its true size and sha256 unless told."""
    data = path.read_bytes()
    fields = dict(
        name=name or path.name,
        url=path.as_uri(),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        md5=None,
        extract_to="data",
        source_note="built by the test",
        part="tiny",
        provides=("data/pkg/inner/a.txt",),
    )
    fields.update(overrides)
    return dl.RemoteFile(**fields)


class Calls:
    def __init__(self):
        self.seen: list[tuple[int, int | None]] = []

    def __call__(self, done, total):
        self.seen.append((done, total))


@pytest.fixture
def no_network(monkeypatch):
    """Fail any attempt to open a URL that is not file:// (the CLI listing must open none)."""
    real = urllib.request.urlopen
    opened = []

    def guarded(request, *args, **kwargs):
        url = request.full_url if isinstance(request, urllib.request.Request) else request
        opened.append(url)
        if not url.startswith("file:"):
            raise AssertionError(f"network access to {url}")
        return real(request, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", guarded)
    return opened


def test_download_verify_extract_then_rerun_fetches_nothing(tmp_path, no_network):
    src = make_zip(tmp_path / "tiny.zip", NESTED)
    file = remote(src)
    root = tmp_path / "root"
    calls = Calls()
    assert dl.plan("coco", root, [file]).files[0].state == "missing"

    result = dl.install(file, root, calls)
    assert result.fetch.fetched_bytes == file.size and not result.fetch.skipped
    assert "sha256 verified" in result.fetch.note
    assert result.extract.members == 2
    for name, data in NESTED.items():
        assert (root / "data" / name).read_bytes() == data
    assert (root / "downloads" / "tiny.zip").read_bytes() == src.read_bytes()
    assert not (root / "downloads" / "tiny.zip.part").exists()
    assert calls.seen and calls.seen[-1] == (file.size, file.size)
    assert dl.plan("coco", root, [file]).files[0].state == "installed"

    extracted = root / "data" / "pkg" / "inner" / "a.txt"
    mtime = extracted.stat().st_mtime_ns
    opened, progressed = len(no_network), len(calls.seen)
    again = dl.install(file, root, calls)
    assert again.state_before == "installed" and again.fetch is None
    assert len(calls.seen) == progressed
    assert len(no_network) == opened and extracted.stat().st_mtime_ns == mtime

    # fetch alone on a finished download opens nothing either
    assert dl.fetch(file, root, calls).skipped and len(no_network) == opened


def test_wrong_checksum_fails_loudly_and_leaves_no_final_file(tmp_path):
    src = make_zip(tmp_path / "tiny.zip", NESTED)
    wrong = "0" * 64
    file = remote(src, sha256=wrong)
    root = tmp_path / "root"
    with pytest.raises(dl.DownloadError) as err:
        dl.install(file, root)
    actual = hashlib.sha256(src.read_bytes()).hexdigest()
    message = str(err.value)
    assert "tiny.zip" in message and wrong in message and actual in message
    assert not (root / "downloads" / "tiny.zip").exists()
    assert not (root / "downloads" / "tiny.zip.part").exists()
    assert not (root / "data").exists()


def test_wrong_size_and_wrong_md5_fail(tmp_path):
    src = make_zip(tmp_path / "tiny.zip", NESTED)
    with pytest.raises(dl.DownloadError, match="size mismatch"):
        dl.fetch(remote(src, size=src.stat().st_size - 1), tmp_path / "a")
    with pytest.raises(dl.DownloadError, match="md5 mismatch"):
        dl.fetch(remote(src, sha256=None, md5="f" * 32), tmp_path / "b")
    good = remote(src, sha256=None, md5=hashlib.md5(src.read_bytes()).hexdigest())
    assert "md5 verified" in dl.fetch(good, tmp_path / "c").note


@pytest.mark.parametrize("evil", ["../evil.txt", "/tmp/evil-abs.txt", "pkg/../../evil.txt"])
def test_zip_slip_member_is_refused_before_anything_is_written(tmp_path, evil):
    src = make_zip(tmp_path / "slip.zip", {"pkg/ok.txt": b"fine", evil: b"escaped"})
    file = remote(src, provides=())
    root = tmp_path / "root"
    dl.fetch(file, root)
    with pytest.raises(dl.UnsafeArchiveError, match="would land outside"):
        dl.extract(file, root)
    assert not (root / "data" / "pkg" / "ok.txt").exists()
    assert not (root / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()
    assert not dl.marker_path(file, root).exists()


def test_tar_gz_extracts_nested_and_refuses_escape(tmp_path):
    good = make_targz(tmp_path / "good.tar.gz", NESTED)
    file = remote(good)
    assert file.archive == "tar"
    dl.install(file, tmp_path / "root")
    assert (tmp_path / "root" / "data" / "pkg" / "inner" / "a.txt").read_bytes() == b"alpha\n"

    bad = make_targz(tmp_path / "bad.tar.gz", {"../up.txt": b"x"})
    bad_file = remote(bad, provides=())
    dl.fetch(bad_file, tmp_path / "root")
    with pytest.raises(dl.UnsafeArchiveError):
        dl.extract(bad_file, tmp_path / "root")
    assert not (tmp_path / "root" / "up.txt").exists()


def test_unpublished_checksum_is_recorded_then_enforced(tmp_path, capsys):
    src = tmp_path / "train.txt"
    src.write_text("1000092795\n10002456\n")
    file = remote(src, size=None, sha256=None, extract_to=".", provides=("train.txt",))
    root = tmp_path / "root"
    result = dl.install(file, root)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert result.fetch.note == f"no published checksum; recorded {digest} of what was downloaded"
    assert (root / "train.txt").read_bytes() == src.read_bytes()
    assert dl.read_recorded(root) == {"train.txt": (digest, src.stat().st_size)}

    # upstream changes: the next download must match what was recorded
    src.write_text("something else\n")
    (root / "downloads" / "train.txt").unlink()
    with pytest.raises(dl.DownloadError, match="recorded in ROOT/CHECKSUMS.txt"):
        dl.fetch(file, root)
    assert not (root / "downloads" / "train.txt").exists()


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    payload = b""
    honour_range = True
    truncate_to: int | None = None  # announce everything, send only this many bytes, hang up
    ranges: list = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        wanted = self.headers.get("Range")
        type(self).ranges.append(wanted)
        data, status = self.payload, 200
        if wanted and self.honour_range:
            start = int(wanted.removeprefix("bytes=").rstrip("-"))
            data, status = self.payload[start:], 206
        self.send_response(status)
        if status == 206:
            self.send_header(
                "Content-Range", f"bytes {start}-{len(self.payload) - 1}/{len(self.payload)}"
            )
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data if self.truncate_to is None else data[: self.truncate_to])
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("Handler", (_RangeHandler,), {"ranges": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, handler
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("honour_range", [True, False])
def test_partial_download_resumes_with_range_when_the_server_allows(tmp_path, server, honour_range):
    httpd, handler = server
    payload = bytes(range(256)) * 4000  # ~1 MB, more than one chunk
    handler.payload, handler.honour_range = payload, honour_range
    url = f"http://127.0.0.1:{httpd.server_address[1]}/big.bin"
    file = dl.RemoteFile(
        name="big.bin",
        url=url,
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        md5=None,
        extract_to=".",
        source_note="test server",
        part="big",
    )
    root = tmp_path / "root"
    (root / "downloads").mkdir(parents=True)
    half = len(payload) // 2
    (root / "downloads" / "big.bin.part").write_bytes(payload[:half])
    assert dl.file_status(file, root).partial_bytes == half

    result = dl.fetch(file, root)
    assert handler.ranges == [f"bytes={half}-"]
    assert (root / "downloads" / "big.bin").read_bytes() == payload
    if honour_range:
        assert (result.resumed_from, result.fetched_bytes) == (half, len(payload) - half)
    else:  # the server sent everything: start over
        assert (result.resumed_from, result.fetched_bytes) == (0, len(payload))


def test_interrupted_transfer_keeps_the_part_file_and_a_rerun_resumes(tmp_path, server):
    httpd, handler = server
    payload = bytes(range(256)) * 4000
    handler.payload, handler.truncate_to = payload, 300_000
    file = dl.RemoteFile(
        name="big.bin",
        url=f"http://127.0.0.1:{httpd.server_address[1]}/big.bin",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
        md5=None,
        extract_to=".",
        source_note="test server",
        part="big",
    )
    root = tmp_path / "root"
    with pytest.raises(dl.DownloadError, match="big.bin: .*rerun resumes it"):
        dl.fetch(file, root)
    part = root / "downloads" / "big.bin.part"
    assert 0 < part.stat().st_size <= 300_000
    assert not (root / "downloads" / "big.bin").exists()
    kept = part.stat().st_size

    handler.truncate_to = None
    result = dl.fetch(file, root)
    assert (result.resumed_from, result.fetched_bytes) == (kept, len(payload) - kept)
    assert result.path.read_bytes() == payload


def test_file_url_with_partial_download_starts_over(tmp_path):
    src = make_zip(tmp_path / "tiny.zip", NESTED)
    file = remote(src)
    root = tmp_path / "root"
    (root / "downloads").mkdir(parents=True)
    (root / "downloads" / "tiny.zip.part").write_bytes(b"garbage")
    result = dl.fetch(file, root)
    assert (result.resumed_from, result.fetched_bytes) == (0, file.size)
    assert result.path.read_bytes() == src.read_bytes()


def test_network_error_is_one_clear_error_naming_the_file(tmp_path):
    file = dl.RemoteFile(
        name="gone.zip",
        url=(tmp_path / "does-not-exist.zip").as_uri(),
        size=None,
        sha256=None,
        md5=None,
        extract_to=".",
        source_note="none",
        part="x",
    )
    with pytest.raises(dl.DownloadError, match="gone.zip: could not download"):
        dl.fetch(file, tmp_path / "root")


def test_cli_lists_every_official_coco_url_without_network(tmp_path, capsys, no_network):
    assert main(["data", "--dataset", "coco", "--root", str(tmp_path / "coco")]) == 0
    out = capsys.readouterr().out
    for file in dl.DATASET_FILES["coco"]:
        assert file.url in out and file.name in out
        assert (file.sha256 or file.md5) in out
    for url in (
        "http://images.cocodataset.org/zips/train2017.zip",
        "http://images.cocodataset.org/zips/val2017.zip",
        "http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
        "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",
    ):
        assert url in out
    assert "tensorflow/datasets tensorflow_datasets/url_checksums/coco.txt" in out
    assert "status:   missing" in out
    assert "counterfactual synth --dataset coco" in out and "make synth DATASET=coco" in out
    assert no_network == [] and not (tmp_path / "coco").exists()


def test_cli_flickr30k_lists_the_manual_image_step(tmp_path, capsys, no_network):
    assert main(["data", "--dataset", "flickr30k", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "https://shannon.cs.illinois.edu/DenotationGraph/" in out and "[to do]" in out
    assert "no published checksum" in out
    assert "https://github.com/BryanPlummer/flickr30k_entities/raw/master/annotations.zip" in out
    (tmp_path / "flickr30k-images").mkdir()
    (tmp_path / "flickr30k-images" / "1.jpg").write_bytes(b"x")
    assert main(["data", "--dataset", "flickr30k", "--root", str(tmp_path)]) == 0
    assert "[done]" in capsys.readouterr().out


def test_cli_download_is_idempotent_and_errors_are_one_line(tmp_path, capsys, monkeypatch):
    src = make_zip(tmp_path / "tiny.zip", NESTED)
    tiny = remote(src, part="annotations")
    extra = remote(
        make_zip(tmp_path / "other.zip", {"x/y.txt": b"y"}),
        part="other",
        extract_to=".",
        provides=("x/y.txt",),
    )
    monkeypatch.setitem(dl.DATASET_FILES, "coco", (tiny, extra))
    root = tmp_path / "root"
    args = ["data", "--dataset", "coco", "--root", str(root), "--download"]

    assert main([*args, "--parts", "annotations"]) == 0
    assert (root / "data" / "pkg" / "b.txt").read_bytes() == b"beta beta\n"
    assert not (root / "x").exists()  # not asked for
    err = capsys.readouterr().err
    assert "sha256 verified" in err and "unpacked 2 members" in err

    assert main(args) == 0
    assert (root / "x" / "y.txt").read_bytes() == b"y"
    err = capsys.readouterr().err
    assert "tiny.zip" in err and "installed, skipped" in err

    assert main(["data", "--dataset", "coco", "--root", str(root)]) == 0
    captured = capsys.readouterr().out
    assert captured.count("installed (digest verified") == 2 and "nothing to fetch" in captured

    assert main([*args, "--parts", "bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "counterfactual data: error: unknown part 'bogus'; choose from annotations, other"
    ]

    bad = remote(src, name="bad.zip", sha256="1" * 64, part="bad")
    monkeypatch.setitem(dl.DATASET_FILES, "coco", (bad,))
    assert main([*args[:4], str(tmp_path / "fresh"), "--download"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("counterfactual data: error: bad.zip: sha256 mismatch: expected 1111")


def test_dataset_table_has_a_checksum_with_its_source_or_none_said_explicitly():
    assert set(dl.DATASET_FILES) == {"coco", "flickr30k"}
    for dataset, files in dl.DATASET_FILES.items():
        assert len({f.name for f in files}) == len(files), dataset
        assert len({f.url for f in files}) == len(files), dataset
        for f in files:
            assert f.provides, f.name
            if f.published:
                # a source note names the repository and path the value was taken from
                assert "/" in f.source_note and "." in f.source_note, f.name
            else:
                assert f.sha256 is None and f.md5 is None
                assert "no published checksum" in f.source_note, f.name
    coco = {f.name: f for f in dl.DATASET_FILES["coco"]}
    for name in ("train2017.zip", "val2017.zip", "annotations_trainval2017.zip"):
        assert coco[name].sha256 is not None and coco[name].size, name
        assert coco[name].default
    assert {f.part for f in dl.DATASET_FILES["coco"] if f.default} == {
        "annotations", "train2017", "val2017", "karpathy"
    }  # fmt: skip


@pytest.mark.parametrize(
    "override, message",
    [
        ({"sha256": "ABC"}, "sha256"),
        ({"md5": "12"}, "md5"),
        ({"name": "a/b.zip"}, "plain file name"),
        ({"url": "ftp://x/y.zip"}, "not http"),
        ({"extract_to": "../out"}, "leaves the root"),
        ({"provides": ("/etc",)}, "stay under the root"),
        ({"size": -1}, "byte count"),
    ],
)
def test_remote_file_rejects_bad_fields(tmp_path, override, message):
    src = make_zip(tmp_path / "tiny.zip", NESTED)
    with pytest.raises(ValueError, match=message):
        remote(src, **override)
