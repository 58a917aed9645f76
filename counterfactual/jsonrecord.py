"""The sample json's parts as msgspec structs: one base, :class:`Record`, for the plan
(:mod:`counterfactual.method.selection`), the verdict (:mod:`counterfactual.method.verify`)
and the rest of a sample (:mod:`counterfactual.shards.samples`).

Field order is key order; numbers are kept as the json holds them (:data:`Number`: ``1`` stays
an int), so ``from_dict(d).to_dict() == d`` and the bytes of a rewritten json match. Decoding
checks every key and type, and a ``ValueError`` names the path of the first bad one
(``$.plan.mask_boxes[0]``). Per-class parts are lists of records ``{"class": name, ...}``;
older shards hold them as objects keyed by class name, which :func:`upgrade_keyed` turns into
the lists before decoding.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec
import numpy as np

T = TypeVar("T")


Number = int | float
"""A json number kept as the json holds it (``1`` stays an int), so the bytes of a rewritten
json match."""

Box = tuple[Number, Number, Number, Number]
"""``(x, y, w, h)`` pixels."""


class Record(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A part of the sample json: decoded by :meth:`from_dict` (``ValueError`` naming the key
    path, ``$.plan.mask_boxes[0]``), written by :meth:`to_dict` (fresh lists and dicts)."""

    def to_dict(self) -> dict[str, Any]:
        return _builtins(self)

    @classmethod
    def from_dict(cls: type[R], d: Any) -> R:
        return convert(d, cls)


R = TypeVar("R", bound=Record)


def convert(value: Any, kind: type[T]) -> T:
    """``value`` (plain JSON values) as ``kind``; ``ValueError`` naming the key path of the
    first bad key or type."""
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as err:
        raise ValueError(f"sample json: {err}") from err


def _numpy_item(value: Any) -> Any:
    if isinstance(value, np.generic):  # a numpy scalar in a describe() dict: its Python value
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _builtins(value: Any) -> Any:
    """``value`` as plain JSON values: structs as dicts in field order, tuples as lists."""
    return _lists(msgspec.to_builtins(value, enc_hook=_numpy_item))


def _lists(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value


def unique(records: Iterable[Any], what: str) -> None:
    """``ValueError`` when two per-class records (``name``: the class) name the same class."""
    seen: set[str] = set()
    for i, r in enumerate(records):
        if r.name in seen:
            raise ValueError(f"{what}[{i}].class {r.name!r} repeats")
        seen.add(r.name)


def upgrade_keyed(d: Any, paths: Iterable[tuple[str, ...]]) -> Any:
    """The older layout read as the current one: ``d`` with each per-class part at ``paths``
    that is an object keyed by class name (``{c: {field: ...}}``; ``pmi.with_kept`` as
    ``{c: pmi}``) made the list of records ``[{"class": c, ...}]`` (copies along the way; ``d``
    is not changed). Anything else is left for the schema to judge."""
    for path in paths:
        d = _upgrade_at(d, path)
    return d


def _upgrade_at(d: Any, path: tuple[str, ...]) -> Any:
    if not isinstance(d, dict) or path[0] not in d:
        return d
    key, rest = path[0], path[1:]
    value = d[key]
    if rest:
        new = _upgrade_at(value, rest)
    elif isinstance(value, dict):
        new = [
            {"class": c, **v} if isinstance(v, dict) else {"class": c, "pmi": v}
            for c, v in value.items()
        ]
    else:
        return d
    return d if new is value else {**d, key: new}


__all__ = ["Box", "Number", "Record", "convert", "unique", "upgrade_keyed"]
