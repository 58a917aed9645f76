"""A corpus pattern expanded into its files: brace ranges, shell globs, and the folders
img2dataset writes (a folder of tars, tables or shard folders)."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from braceexpand import braceexpand

from counterfactual import fs
from counterfactual.readers.corpus.common import GLOB_MAGIC, is_picture_name
from counterfactual.readers.corpus.formats import corpus_format


def expand_pattern(pattern: str | Path, kind: str | None = None) -> list[str | Path]:
    """The files named by ``pattern``: brace expansion (``data/{00000..00009}.tar``), then shell
    globs (``*``, ``?``, ``[...]``) on each result, sorted within a glob, brace order kept.
    Local files come back as :class:`Path`, URLs as ``str`` (globbed through fsspec).

    A brace result without glob characters is kept even when it does not exist (the readers
    report it as ``missing-file``); a glob keeps only the files it matches. Raises
    ``ValueError`` naming the pattern when no existing file results.

    With a corpus ``kind`` the pattern may name folders, as img2dataset writes them, and its
    other files are left alone: a glob keeps only the kind's files (:data:`KIND_SUFFIXES`:
    ``*.tar``, ``*.parquet``, ``*.csv``), and an existing folder means its own files of that
    suffix, sorted (img2dataset's ``.parquet`` and ``_stats.json`` beside its tars are not
    read as shards). For ``"files"`` the pattern names shard folders instead (see
    :func:`iter_files`): a glob keeps the folders it matches, and a folder without pictures
    of its own means its subfolders (not those named ``_*`` or ``.*``, such as img2dataset's
    ``_tmp``).
    """
    fmt = None if kind is None else corpus_format(kind)
    suffix = None if fmt is None else fmt.suffix
    folders = fmt is not None and suffix is None
    text = os.fspath(pattern)
    if not text:
        raise ValueError("empty file pattern")
    paths: list[str | Path] = []
    globbed = False
    passed_over = 0
    for part in braceexpand(text):
        if GLOB_MAGIC.search(part):
            found = _glob_folders(part) if folders else fs.glob(part)
            if suffix is not None:
                ours = [p for p in found if _has_suffix(p, suffix)]
                passed_over += len(found) - len(ours)
                found = ours
            globbed = globbed or bool(found)
            paths += found
        elif fmt is not None and fs.isdir(part):
            found = _folder_inputs(part, suffix)
            globbed = globbed or bool(found)
            paths += found
        else:
            paths.append(fs.as_path(part))
    if folders:
        if not globbed and not any(fs.isdir(p) for p in paths):
            raise ValueError(
                f"no shard folder matches {text!r} (img2dataset's files output "
                "DIR/00000/KEY.jpg is read with --root DIR)"
            )
    elif not globbed and not any(fs.isfile(p) for p in paths):
        where = f"no file matches {text!r}"
        if suffix is not None:
            where += f" (a glob or folder is read for its *{suffix} files"
            where += f"; {passed_over} other files passed over)" if passed_over else ")"
        raise ValueError(where)
    return paths


def pattern_root(pattern: str | Path, kind: str | None = None) -> str:
    """The folder every file ``pattern`` names must resolve inside (:func:`counterfactual.fs.inside`):
    the folder before the first part with braces or globs (``data`` for
    ``data/{00000..00009}.tar``), else the folder the pattern names, else the folder of the
    file it names. For ``"files"``, a shard folder named alone stands for its parent, the
    folder its records' ``file`` names are relative to."""
    text = os.fspath(pattern).rstrip("/") or "/"
    magic = re.search(r"[*?\[{]", text)
    if magic is not None:
        head = text[: magic.start()]
        return (head[: head.rfind("/")] or "/") if "/" in head else "."
    if fs.isdir(text):
        named_shard = kind == "files" and any(is_picture_name(n) for n in fs.listdir(text))
        return str(fs.parent(text)) if named_shard else text
    return str(fs.parent(text))


def _has_suffix(path: str | Path, suffix: str) -> bool:
    return fs.name(path).lower().endswith(suffix)


def _skipped_folder(name: str) -> bool:
    """Folders a ``files`` corpus never reads: ``_tmp`` (img2dataset's), hidden ones."""
    return name.startswith(("_", "."))


def _subfolders(folder: str) -> list[str | Path]:
    """The folders directly in ``folder``, sorted by name."""
    p = fs.as_path(folder)
    if isinstance(p, Path):
        return sorted((Path(e.path) for e in os.scandir(p) if e.is_dir()), key=lambda q: q.name)
    remote, inside = fs.filesystem(p)
    entries = remote.ls(inside, detail=True, refresh=True)
    names = sorted(fs.name(e["name"]) for e in entries if e.get("type") == "directory")
    return [fs.join(p, n) for n in names]


def _glob_folders(pattern: str) -> list[str | Path]:
    """The folders a glob matches, sorted; URLs keep their scheme."""
    p = fs.as_path(pattern)
    if isinstance(p, Path):
        return [Path(x) for x in sorted(glob.glob(str(p))) if os.path.isdir(x)]
    remote, inside = fs.filesystem(p)
    return [remote.unstrip_protocol(x) for x in sorted(remote.glob(inside)) if remote.isdir(x)]


def _folder_inputs(folder: str, suffix: str | None) -> list[str | Path]:
    """What an existing folder named as a corpus stands for: its ``*.tar`` (``*.parquet``,
    ``*.csv``) files, by the format's ``suffix``; for shard folders (``suffix=None``: ``files``),
    itself when it holds a picture, else its subfolders."""
    if suffix is None:
        if any(is_picture_name(n) for n in fs.listdir(folder)):
            return [fs.as_path(folder)]
        return [f for f in _subfolders(folder) if not _skipped_folder(fs.name(f))]
    names = [n for n in fs.listdir(folder) if n.lower().endswith(suffix)]
    return [fs.join(folder, n) for n in names]
