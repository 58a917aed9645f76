"""A plain tar's member headers, read without :mod:`tarfile`'s per-member overhead.

Reading the keys of a WebDataset corpus (what the driver does to find keys repeated across
tars) and grouping a tar's samples (what every worker does) walk each header and skip the data
by seeking. :mod:`tarfile` spends about 45 µs of Python per member on that walk; the common
header (POSIX ustar or old GNU, a regular file, a directory or a link, no long name) needs a
checksum, a name and a size, parsed here in a few µs. Every other header (pax and GNU long
names, sparse files, base-256 sizes, a ``prefix`` field) is handed to :mod:`tarfile`, which
goes on from that header to the end, so the members and the place where reading stops are
exactly what ``tarfile.TarFile.next`` gives (:func:`headers` is tested against it).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterator
from typing import IO

BLOCK = tarfile.BLOCKSIZE
_REGULAR = frozenset(b"07\0")  # REGTYPE, CONTTYPE, AREGTYPE: their data follows the header
_OTHER = frozenset(b"123456")  # links, devices, directories, FIFOs: no data
_NAME = slice(0, 100)
_SIZE = slice(124, 136)
_CHKSUM = slice(148, 156)
_PREFIX = slice(345, 500)


class Walk:
    """The members of one tar from the file's current position (0 for a whole tar), and where
    the walk stopped: ``offset``, the header that ended it (an end-of-archive block, a cut or
    damaged header), as ``tarfile.TarFile.offset`` after its last member.

    Raises :class:`tarfile.ReadError` where :mod:`tarfile` does (an empty file, a first header
    that is not one)."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.offset = fh.tell()

    def __iter__(self) -> Iterator[tarfile.TarInfo]:
        fh = self._fh
        while True:
            fh.seek(self.offset)
            buf = fh.read(BLOCK)
            if not buf and self.offset:
                fh.seek(self.offset - 1)
                if not fh.read(1):  # the last member's data is cut off
                    raise tarfile.ReadError("unexpected end of data")
            member = _plain(buf, self.offset)
            if member is None:  # tarfile reads (or judges) it, from its absolute offset as ever
                yield from self._tarfile()
                return
            if member is _END:
                return
            yield member
            self.offset = member.offset_data
            if member.isreg():  # its data follows the header
                self.offset += -(-member.size // BLOCK) * BLOCK

    def _tarfile(self) -> Iterator[tarfile.TarInfo]:
        """The rest of the walk by :mod:`tarfile`, from the header at ``offset``."""
        self._fh.seek(self.offset)
        tar = tarfile.open(fileobj=self._fh, mode="r:")
        while (info := tar.next()) is not None:
            tar.members.clear()  # memory stays flat on large tars; nothing is looked up
            yield info
        self.offset = tar.offset


_END = tarfile.TarInfo()  # the end-of-archive block


def _plain(buf: bytes, offset: int) -> tarfile.TarInfo | None:
    """The header in ``buf`` when it is a plain one, ``_END`` for an end-of-archive block, or
    ``None`` for anything :mod:`tarfile` must read (or judge: a cut or damaged header)."""
    if len(buf) != BLOCK:
        return None
    if not any(buf):
        return _END
    kind = buf[156]
    if kind not in _REGULAR and kind not in _OTHER:
        return None
    if buf[124] & 0x80 or buf[148] & 0x80 or buf[_PREFIX][0] != 0:
        return None  # base-256 numbers and ustar's name prefix: tarfile's rules
    try:
        chksum = int(buf[_CHKSUM].split(b"\0", 1)[0].strip() or b"0", 8)
        size = int(buf[_SIZE].split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    if chksum != sum(buf) - sum(buf[_CHKSUM]) + 8 * 32:
        return None  # tarfile also accepts a signed sum, and judges what is damaged
    name = buf[_NAME].split(b"\0", 1)[0].decode(tarfile.ENCODING, "surrogateescape")
    if kind == 0 and name.endswith("/"):
        return None  # an old-style directory: tarfile retypes it
    if kind == ord("5"):
        name = name.rstrip("/")  # as tarfile names directories
    info = tarfile.TarInfo(name)
    info.type = bytes([kind])
    info.size = size
    info.offset = offset
    info.offset_data = offset + BLOCK
    return info
