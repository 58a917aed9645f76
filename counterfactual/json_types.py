"""The Arrow type of JSON values, merged over many samples (for the dataset card's features).

A type is JSON itself, so a shard's stats file can hold it: a name (``"null"``, ``"bool"``,
``"int64"``, ``"float64"``, ``"string"``), ``{"list": T}`` or ``{"struct": {key: T, ...}}``
(keys in first-seen order). :func:`merge_types` unifies two types as one Arrow column needs:
``null`` takes the other type (a ``None``, or the items of an empty list, as ``null``), ``int64``
and ``float64`` give ``float64``, structs take the union of their keys (a key absent from a
sample reads as ``None``). Anything else cannot share a column and gives :data:`MIXED`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

JsonType = str | dict[str, Any]

NULL = "null"
MIXED = "mixed"
"""Two types one Arrow column cannot hold (e.g. a number and a string, a list and an object)."""

_SCALARS = ("null", "bool", "int64", "float64", "string")


def json_type(value: Any) -> JsonType:
    """The type of a JSON-ready value (tuples are lists); ``ValueError`` for anything else."""
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int64"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        item: JsonType = NULL
        for v in value:
            item = merge_types(item, json_type(v))
        return {"list": item}
    if isinstance(value, dict):
        return {"struct": {str(k): json_type(v) for k, v in value.items()}}
    raise ValueError(f"not a JSON value: {type(value).__name__} {value!r:.60}")


def merge_types(a: JsonType | None, b: JsonType | None) -> JsonType:
    """One type for values of type ``a`` and ``b`` (``None``: no value seen yet)."""
    if a is None or a == NULL:
        return NULL if b is None else b
    if b is None or b == NULL:
        return a
    if a == b:
        return a
    if isinstance(a, str) or isinstance(b, str):
        return "float64" if sorted(map(str, (a, b))) == ["float64", "int64"] else MIXED
    if "list" in a and "list" in b:
        return {"list": merge_types(a["list"], b["list"])}
    if "struct" in a and "struct" in b:
        fields = dict(a["struct"])
        for key, t in b["struct"].items():
            fields[key] = merge_types(fields.get(key), t)
        return {"struct": fields}
    return MIXED


def mixed_paths(t: JsonType, path: str = "") -> Iterator[str]:
    """The key paths (``plan.evidence.co_removal``; ``[]`` for list items) whose type is
    :data:`MIXED`."""
    if t == MIXED:
        yield path or "(the whole value)"
    elif isinstance(t, dict) and "list" in t:
        yield from mixed_paths(t["list"], f"{path}[]")
    elif isinstance(t, dict):
        for key, sub in t["struct"].items():
            yield from mixed_paths(sub, f"{path}.{key}" if path else key)


def check_type(t: Any) -> JsonType:
    """``t`` if it is a type as this module writes it (read back from a stats file), else
    ``ValueError``."""
    ok = (
        t in (*_SCALARS, MIXED)
        or (isinstance(t, dict) and list(t) == ["list"] and check_type(t["list"]) is not None)
        or (
            isinstance(t, dict)
            and list(t) == ["struct"]
            and isinstance(t["struct"], dict)
            and all(check_type(v) is not None for v in t["struct"].values())
        )
    )
    if not ok:
        raise ValueError(f"not a json type: {t!r:.80}")
    return t


def declare(t: JsonType, known: Mapping[str, JsonType], path: str = "") -> JsonType:
    """``t`` with each key path of ``known`` (``plan.rejected_by``; ``[]`` for list items) that
    it holds merged with its known type: a nullable key every value held as ``None`` is typed
    ``null`` by :func:`json_type`, and ``known`` says what it holds when set. Paths ``t``
    does not hold are not added."""
    if path in known:
        t = merge_types(t, known[path])
    if isinstance(t, dict) and "list" in t:
        return {"list": declare(t["list"], known, f"{path}[]")}
    if isinstance(t, dict) and "struct" in t:
        return {
            "struct": {
                k: declare(sub, known, f"{path}.{k}" if path else k)
                for k, sub in t["struct"].items()
            }
        }
    return t


def hf_feature(t: JsonType) -> dict[str, Any]:
    """The Hugging Face ``datasets`` feature of ``t`` as a dataset card's YAML writes it, less
    its ``name`` (``{"dtype": "string"}``, ``{"list": ...}``, ``{"struct": [...]}``).
    ``ValueError`` on :data:`MIXED`."""
    if t == MIXED:
        raise ValueError("a mixed type has no feature")
    if isinstance(t, str):
        return {"dtype": t}
    if "list" in t:
        return {"list": hf_feature(t["list"])}
    return {"struct": [{"name": k, **hf_feature(sub)} for k, sub in t["struct"].items()]}


__all__: Sequence[str] = (
    "MIXED",
    "NULL",
    "JsonType",
    "check_type",
    "declare",
    "hf_feature",
    "json_type",
    "merge_types",
    "mixed_paths",
)
