"""img2dataset's ``files`` output (``kind="files"``): shard folders (``DIR/00000/``) holding, per
sample, ``KEY.jpg`` (or ``jpeg``, ``png``, ``webp``), ``KEY.txt`` and ``KEY.json``, read as a
WebDataset sample's members are. One piece per shard folder; a picture is a file of its own,
``SHARD/KEY.jpg`` under the folder that holds the shard folders (:func:`files_root`). A
sample whose picture, ``txt`` or ``json`` resolves outside that folder (a link out) is
``unsafe-path``, none of its files read."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from counterfactual import fs
from counterfactual.readers.corpus.common import (
    GLOB_MAGIC,
    KEY_FIELD,
    MAX_TEXT_BYTES,
    PICTURE_FIELDS,
    InputPiece,
    PlannedFile,
    WholeFiles,
    is_picture_name,
    open_binary,
    raise_if_store_down,
    record_captions,
    repeated_hashes,
)
from counterfactual.readers.corpus.members import (
    TextMember,
    caption_origin,
    downloader_rows,
    duplicate_key,
)
from counterfactual.readers.keyset import key_hash, key_hashes
from counterfactual.records import ImageRecord, Status


class Files(WholeFiles):
    """The :class:`~counterfactual.readers.corpus.common.CorpusFormat` of shard folders."""

    kind = "files"
    suffix = None
    root_help = (
        "img2dataset's output folder (its shard folders 00000/, 00001/, ...), e.g. 'data/cc3m'"
    )

    def default_images(self, root: str) -> str | None:
        return files_root(root)

    def keys(self, file: PlannedFile) -> np.ndarray | None:
        try:
            return key_hashes(sorted(_folder_groups(fs.listdir(file.path))))
        except OSError as err:
            raise_if_store_down(err)
            return None

    def read(self, piece: InputPiece, seen: dict[str, str]) -> Iterator[ImageRecord | Status]:
        return _read_folder(piece.path, seen, repeated_hashes(piece))


FORMAT = Files()


def files_root(pattern: str | Path) -> str | None:
    """The folder a ``files`` corpus's record ``file`` names (``SHARD/KEY.jpg``) are relative
    to: the folder ``pattern`` names when it holds shard folders, the parent of a shard folder
    or of a pattern whose last part alone has braces or globs; ``None`` when the shard folders
    may lie in several folders."""
    text = os.fspath(pattern).rstrip("/") or "/"
    if not GLOB_MAGIC.search(text) and "{" not in text:
        if fs.isdir(text) and not any(is_picture_name(n) for n in fs.listdir(text)):
            return text
        return str(fs.parent(text))
    parent = str(fs.parent(text))
    return None if GLOB_MAGIC.search(parent) or "{" in parent else parent


def _read_folder(
    folder: str, seen: dict[str, str], again: frozenset[int] = frozenset()
) -> Iterator[ImageRecord | Status]:
    try:
        if not fs.isdir(folder):
            yield Status(folder, "failed", "missing-file", f"no such shard folder {folder}")
            return
        names = fs.listdir(folder)
    except OSError as err:
        raise_if_store_down(err)  # the store's fault, not the folder's: the run stops
        yield Status(folder, "failed", "bad-shard", f"{type(err).__name__}: {err}")
        return
    groups = _folder_groups(names)
    for key in sorted(groups):
        yield _file_row(folder, key, groups[key], seen, again)
    yield from downloader_rows(folder, seen)


def _folder_groups(names: Iterable[str]) -> dict[str, dict[str, str]]:
    """A shard folder's files by key, then field (``KEY.jpg`` -> ``{KEY: {"jpg": ...}}``)."""
    groups: dict[str, dict[str, str]] = {}
    for name in names:
        match = KEY_FIELD.match(name)
        if match is not None and not name.startswith("."):
            groups.setdefault(match.group(1), {})[match.group(2).lower()] = name
    return groups


def _file_row(
    folder: str, key: str, fields: dict[str, str], seen: dict[str, str], again: frozenset[int]
) -> ImageRecord | Status:
    shard = fs.name(folder)
    if key in seen:
        return Status(key, "failed", "duplicate-key", f"first in {seen[key]}, again in {folder}")
    seen[key] = folder
    if again and key_hash(key) in again:
        return duplicate_key(key, folder)
    picture = next((fields[f] for f in PICTURE_FIELDS if f in fields), None)
    if picture is None:
        names = ", ".join(fields)
        return Status(key, "failed", "missing-image", f"{shard}: no picture among {names}")
    root = fs.parent(folder)
    read = [picture, *(fields[f] for f in ("txt", "json") if f in fields)]
    leaving = [n for n in read if fs.inside(root, fs.join(folder, n)) is None]
    if leaving:
        detail = f"{shard}/{leaving[0]}: resolves outside {root} (a link out of the corpus)"
        return Status(key, "failed", "unsafe-path", detail)
    members = {}
    for field in ("txt", "json"):
        if field in fields:
            member = _small_file(fs.join(folder, fields[field]))
            if isinstance(member, str):
                return Status(key, "failed", "bad-metadata", member)
            members[field] = member
    text = caption_origin(key, members.get("txt"), members.get("json"))
    if isinstance(text, Status):
        return text
    file = f"{shard}/{picture}"
    captions = record_captions(text[0])
    return ImageRecord(key, file, 0, 0, (), captions, root, None, "files", None, text[1])


def _small_file(path: str | Path) -> TextMember | str:
    """A ``txt`` or ``json`` file, read up to one byte over :data:`MAX_TEXT_BYTES`, or why it
    cannot be read."""
    try:
        with open_binary(str(path)) as fh:
            data = fh.read(MAX_TEXT_BYTES + 1)
    except OSError as err:
        raise_if_store_down(err)
        return f"{fs.name(path)}: {type(err).__name__}: {err}"
    return TextMember(fs.name(path), len(data), lambda: data)
