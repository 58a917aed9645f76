"""An output folder is never someone else's, and nothing written there follows a link we did not
make.

Every command that writes a folder of outputs claims it first with :func:`claim_out`, before
anything is written: the folder must be missing, empty or one the command wrote before (its
:class:`OutKind` recognises it by content, not by file names alone, so a user's
``manifest.json`` is not taken for ours); anything else is refused with one line
(``ValueError``: the CLI prints it, exit 2). ``--force-out`` (:class:`OutOptions`) allows
writing beside other files, never over them: a file at one of the command's names in a folder
that is not its own is still refused. :func:`real_folder` makes a folder a command writes into
a real one: a symbolic link at its name is removed, never followed. Local folders only: on an
object store there are no links, and an object store's ``--out`` is not checked.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from counterfactual import fs
from counterfactual.messages import one_line
from counterfactual.options import declare


@dataclass(frozen=True, slots=True)
class OutOptions:
    """How a command may use an output folder that holds other files."""

    force_out: bool = declare(
        False,
        help="write into an --out folder that holds files of another origin: beside them, "
        "never over them (a file at one of this command's names is still refused)",
        kind="flag",
    )


@dataclass(frozen=True, slots=True)
class OutKind:
    """What a command writes in its output folder: ``what`` names it in a message (``a synth
    run``); ``names`` matches every name it writes (files and folders, temporary names
    included); ``ours`` tells, from the folder's content, whether the folder holds its
    output."""

    what: str
    names: re.Pattern[str]
    ours: Callable[[Path], bool]


def claim_out(
    out: fs.PathLike, kind: OutKind, *, force: bool = False, option: str = "--out"
) -> None:
    """``ValueError`` (one line) unless ``out`` may be written: missing, empty, holding
    ``kind``'s output, or, with ``force``, holding other files none of which has one of
    ``kind``'s names. Writes nothing. A link the user names as ``out`` is followed (it is the
    user's choice); a folder that is a file is left to the command's own check."""
    if fs.is_url(out):
        return
    path = Path(fs.as_path(out))
    if not path.is_dir():
        return
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        return  # unreadable: the command's own check names it
    if not entries or kind.ours(path):
        return
    if not force:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ValueError(
            one_line(
                f"{option} {out}: the folder is not empty and not {kind.what} ({shown}); "
                "nothing was written. Pass a new or empty folder, or "
                "--force-out to write beside them"
            )
        )
    clash = [name for name in entries if kind.names.fullmatch(name)]
    if clash:
        raise ValueError(
            one_line(
                f"{option} {out}: {clash[0]} is not from {kind.what}, and --force-out never "
                "writes over another file; nothing was written. Move it, or pass another folder"
            )
        )


def real_folder(path: Path) -> Path:
    """``path`` as a real folder this process may write into: a symbolic link at its name (to
    a folder or not, dangling or not) is removed, never followed, and the folder made. Its
    parent is taken as it is."""
    if path.is_symlink():
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def without_links(folder: Path, names: re.Pattern[str]) -> list[str]:
    """Remove the symbolic links in ``folder`` whose names ``names`` matches (the names a
    command writes: a write or delete there must not reach through them); the names
    removed."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if entry.is_symlink() and names.fullmatch(entry.name):
            os.unlink(entry.path)
            removed.append(entry.name)
    return sorted(removed)
