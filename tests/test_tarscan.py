"""The fast header walk gives exactly tarfile's members, and stops where tarfile stops."""

from __future__ import annotations

import io
import tarfile

import pytest

from counterfactual.readers.tarscan import Walk


def _tar(fmt: int, members: list[tuple[str, bytes | None, bytes]]) -> bytes:
    """``(name, data, type)``; ``data`` None for members without data."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.SYMTYPE or kind == tarfile.LNKTYPE:
                info.linkname = "a.jpg"
            info.size = len(data) if data is not None else 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _by_tarfile(raw: bytes) -> tuple[list[tuple], int] | str:
    fh = io.BytesIO(raw)
    try:
        tar = tarfile.open(fileobj=fh, mode="r:")
        out = []
        while (info := tar.next()) is not None:
            out.append((info.name, info.type, info.size, info.offset_data, info.isreg()))
        return out, tar.offset
    except tarfile.ReadError as err:
        return f"ReadError: {err}"


def _by_walk(raw: bytes) -> tuple[list[tuple], int] | str:
    walk = Walk(io.BytesIO(raw))
    try:
        out = [(i.name, i.type, i.size, i.offset_data, i.isreg()) for i in walk]
        return out, walk.offset
    except tarfile.ReadError as err:
        return f"ReadError: {err}"


REG, DIR = tarfile.REGTYPE, tarfile.DIRTYPE
MEMBERS = [
    ("000001.jpg", b"x" * 1000, REG),
    ("000001.txt", b"a dog", REG),
    ("000001.json", b"{}", REG),
    ("sub", None, DIR),
    ("link", None, tarfile.SYMTYPE),
    ("hard", None, tarfile.LNKTYPE),
    ("000002.jpg", b"", REG),
    ("000002.txt", b"y" * 512, REG),
]
LONG = [("d" * 120 + "/000003.jpg", b"z" * 700, REG), ("chât/000004.txt", b"\xc3\xa9", REG)]
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("long", [False, True], ids=["short", "long-names"])
def test_same_members_as_tarfile(fmt: str, long: bool) -> None:
    members = MEMBERS + (LONG if long else []) + MEMBERS[:2]
    if long and fmt == "ustar":
        members = members[:-4] + [("p" * 120 + "/000005.jpg", b"q", REG)] + MEMBERS[:2]
    raw = _tar(FORMATS[fmt], members)
    expected = _by_tarfile(raw)
    assert isinstance(expected, tuple) and len(expected[0]) == len(members)
    assert _by_walk(raw) == expected


def _damaged() -> dict[str, bytes]:
    raw = _tar(tarfile.GNU_FORMAT, MEMBERS)
    second = 512 + 1024  # the header after the first member's 1000 bytes
    bad_sum = bytearray(raw)
    bad_sum[second + 10] ^= 0x01
    bad_first = bytearray(raw)
    bad_first[3] ^= 0x01
    old_dir = bytearray(_tar(tarfile.GNU_FORMAT, [("dir/", None, tarfile.AREGTYPE)] + MEMBERS))
    return {
        "cut-in-data": raw[:700],
        "cut-in-header": raw[: second + 100],
        "cut-at-header": raw[:second],
        "bad-checksum-later": bytes(bad_sum),
        "bad-checksum-first": bytes(bad_first),
        "garbage": b"not a tar at all" * 64,
        "empty": b"",
        "zeros": b"\0" * 2048,
        "no-end-blocks": raw[: raw.rindex(b"y" * 512) + 512],
        "old-style-directory": bytes(old_dir),
    }


@pytest.mark.parametrize("case", list(_damaged()))
def test_stops_where_tarfile_stops(case: str) -> None:
    raw = _damaged()[case]
    assert _by_walk(raw) == _by_tarfile(raw)


def test_walk_from_an_offset_like_tarfile() -> None:
    """A walk starts at the file's position, as tarfile does (offsets stay absolute)."""
    raw = b"\0" * 1024 + _tar(tarfile.PAX_FORMAT, MEMBERS + LONG)
    fh = io.BytesIO(raw)
    fh.seek(1024)
    walk = Walk(fh)
    names = [(i.name, i.offset_data) for i in walk]
    fh.seek(1024)
    tar = tarfile.open(fileobj=fh, mode="r:")
    assert names == [(i.name, i.offset_data) for i in tar]
