"""What WebDataset shards and ``files`` shard folders share: a sample's ``txt`` and ``json``
members (the caption and the :class:`~counterfactual.records.Origin`), the ``duplicate-key`` row
of a key an earlier piece had, and img2dataset's metadata ``SHARD.parquet`` beside each tar or
shard folder, whose failed urls become ``download-failed`` rows."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from counterfactual import fs
from counterfactual.readers.clean import clean_text
from counterfactual.readers.corpus.common import (
    MAX_TEXT_BYTES,
    parquet_file,
    pyarrow_modules,
    raise_if_store_down,
)
from counterfactual.records import Origin, Status


def duplicate_key(key: str, where: str) -> Status:
    """The ``duplicate-key`` row of a key an earlier piece of the run had."""
    detail = f"{where}: an earlier piece of this run has the same key"
    return Status(key, "failed", "duplicate-key", detail)


@dataclass(frozen=True, slots=True)
class TextMember:
    """A ``txt`` or ``json`` member (or file) of a sample: its name for messages, its size and
    how to read its bytes."""

    name: str
    size: int
    read: Callable[[], bytes]


def caption_origin(
    key: str, txt: TextMember | None, meta: TextMember | None
) -> tuple[str, Origin | None] | Status:
    """The stripped caption (``""`` when there is none) and the origin in the ``json``, or a
    ``bad-metadata`` status. The caption is the ``txt``, else the json's ``caption``; a json
    that cannot be read fails the sample only when the caption had to come from it (else the
    sample just has no origin)."""
    text = ""
    if txt is not None:
        if txt.size > MAX_TEXT_BYTES:
            return Status(key, "failed", "bad-metadata", _too_large(txt.name, txt.size))
        try:
            text = txt.read().decode("utf-8").strip()
        except UnicodeDecodeError as err:
            return Status(key, "failed", "bad-metadata", f"{txt.name}: not UTF-8 ({err})")
        if not clean_text(text).text:  # the json's caption, as for no txt
            text = ""
    if meta is None:
        return text, None
    value = _json_object(meta)
    if isinstance(value, str):
        return (text, None) if text else Status(key, "failed", "bad-metadata", value)
    if not text:
        caption = value.get("caption")
        text = caption.strip() if isinstance(caption, str) else ""
    return text, Origin.from_mapping(value)


def _json_object(meta: TextMember) -> dict[str, Any] | str:
    """The member's JSON object, or why it is not one."""
    if meta.size > MAX_TEXT_BYTES:
        return _too_large(meta.name, meta.size)
    try:
        value = json.loads(meta.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"{meta.name}: not JSON ({err})"
    if not isinstance(value, dict):
        return f"{meta.name}: not a JSON object"
    return value


def _too_large(name: str, size: int) -> str:
    return f"{name}: {size} bytes, over the {MAX_TEXT_BYTES} read for text"


# --------------------------------------------------------------------------- img2dataset's
# metadata: {shard}.parquet beside each tar or shard folder, one row per input url


def _metadata_path(shard: str) -> str | None:
    """img2dataset's ``00000.parquet`` beside ``00000.tar`` or the ``00000/`` folder."""
    name = fs.name(shard)
    if name.lower().endswith(".tar"):
        name = name[: -len(".tar")]
    elif "." in name:
        return None
    return str(fs.join(fs.parent(shard), f"{name}.parquet"))


def downloader_rows(shard: str, seen: dict[str, str]) -> Iterator[Status]:
    """A ``failed`` status for each url img2dataset's metadata beside ``shard`` lists and the
    shard lacks: ``download-failed`` (its status is not ``success``; ``detail``: its status,
    error_message and url), or ``missing-image`` (a success whose sample is not in the shard,
    e.g. cut off a truncated tar). Nothing when there is no metadata file, or it lacks
    img2dataset's ``key`` and ``status`` columns; a ``bad-shard`` when it cannot be read, an
    ``unsafe-path`` when it resolves outside the shard's folder (a link out: never read)."""
    meta = _metadata_path(shard)
    if meta is None or not fs.isfile(meta):
        return
    if fs.inside(fs.parent(shard), meta) is None:
        detail = f"img2dataset's metadata resolves outside {fs.parent(shard)} (a link out)"
        yield Status(meta, "failed", "unsafe-path", detail)
        return
    pa, _ = pyarrow_modules()
    try:
        with parquet_file(meta) as pf:
            names = pf.schema_arrow.names
            if "key" not in names or "status" not in names:
                return
            rows = pf.read(columns=[c for c in Origin.FIELDS if c in names]).to_pylist()
    except FileNotFoundError:
        return
    except (OSError, pa.ArrowException) as err:
        raise_if_store_down(err)
        detail = f"img2dataset's metadata: {type(err).__name__}: {err}"
        yield Status(meta, "failed", "bad-shard", detail)
        return
    for row in rows:
        key = row.get("key")
        if not isinstance(key, str) or not key or key in seen:
            continue
        seen[key] = meta
        origin = Origin.from_mapping(row) or Origin(key=key)
        if origin.status == "success":
            detail = f"{fs.name(meta)} lists it as downloaded; {fs.name(shard)} has no such sample"
            yield Status(key, "failed", "missing-image", detail, url=origin.url)
        else:
            yield Status(key, "failed", "download-failed", download_detail(origin), url=origin.url)


def download_detail(origin: Origin) -> str:
    """A failed download as a status row's ``detail``: ``STATUS: ERROR_MESSAGE (URL)``."""
    detail = f"{origin.status or 'not downloaded'}: {origin.error_message or 'no error message'}"
    return f"{detail} ({origin.url})" if origin.url else detail
