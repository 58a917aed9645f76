"""Read audit inputs: JSON Lines, CSV/TSV with a header row, or plain text (one item a line).

Every row keeps where it came from (``"PATH line N"``) so errors name the file and line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JSONL_SUFFIXES = (".jsonl", ".ndjson")
CSV_SUFFIXES = (".csv", ".tsv")
TEXT_SUFFIXES = (".txt",)

VCR_PERSON_NAMES = (
    "Casey", "Riley", "Jessie", "Jackie", "Avery", "Jaime", "Peyton", "Kerry", "Jody",
    "Kendall", "Peyton", "Skyler", "Frankie", "Pat", "Quinn",
)  # fmt: skip
"""What VCR's person references become (the list of the GD-VCR authors' ``text_preprocessing``
in ``build_dataset/question_cluster.py``; person ``i`` is name ``i``, the last one past the end)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One record; ``where`` is ``"PATH line N"``. CSV values are strings."""

    where: str
    fields: Mapping[str, Any]

    def get(self, name: str) -> Any:
        if name not in self.fields:
            raise ValueError(f"{self.where}: missing field {name!r}")
        return self.fields[name]

    def text(self, name: str, objects_field: str | None = None) -> str:
        """Field ``name`` as text: a string as is; a list (a pre-tokenised text, as VCR
        stores them) joined by spaces. Its object references (lists of indices) become words
        when the record has ``objects_field`` (VCR's ``objects``, a class name per index):
        a person one of :data:`VCR_PERSON_NAMES`, anything else its class name, as the
        GD-VCR authors did; otherwise they are left out."""
        value = self.get(name)
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            objects = None
            if objects_field is not None and objects_field in self.fields:
                objects = self.fields[objects_field]
                if not isinstance(objects, list) or not all(isinstance(o, str) for o in objects):
                    raise ValueError(
                        f"{self.where}: field {objects_field!r} must be a list of class names"
                    )
            words: list[str] = []
            for item in value:
                if isinstance(item, str):
                    words.append(item)
                elif objects is not None and isinstance(item, list):
                    words.extend(self._object_words(item, objects))
            return " ".join(words)
        raise ValueError(f"{self.where}: field {name!r} must be text, got {value!r}")

    def _object_words(self, reference: list[Any], objects: list[str]) -> list[str]:
        words = []
        for index in reference:
            if isinstance(index, bool) or not isinstance(index, int):
                raise ValueError(f"{self.where}: object reference {reference!r} is not indices")
            if not 0 <= index < len(objects):
                raise ValueError(
                    f"{self.where}: object reference {index} is outside the {len(objects)} objects"
                )
            if objects[index] == "person":
                words.append(VCR_PERSON_NAMES[min(index, len(VCR_PERSON_NAMES) - 1)])
            else:
                words.append(objects[index])
        return words


def _decode(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 ({err.reason} at byte {err.start})") from None


def read_rows(path: str | Path) -> list[Row]:
    """Records of a ``.jsonl``/``.ndjson`` (one JSON object a line) or
    ``.csv``/``.tsv`` (header row first) file; blank lines are skipped."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        rows = []
        for number, line in enumerate(_decode(path).splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path} line {number}"
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{where}: malformed JSON: {err.msg} (column {err.colno})"
                ) from None
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
            rows.append(Row(where, value))
        return rows
    if suffix in CSV_SUFFIXES:
        reader = csv.DictReader(
            io.StringIO(_decode(path), newline=""), delimiter="\t" if suffix == ".tsv" else ","
        )
        if reader.fieldnames is None:
            raise ValueError(f"{path}: empty file, expected a header row")
        rows = []
        for record in reader:
            where = f"{path} line {reader.line_num}"
            if None in record or any(v is None for v in record.values()):
                raise ValueError(f"{where}: expected {len(reader.fieldnames)} columns")
            if not any(v.strip() for v in record.values()):
                continue
            rows.append(Row(where, record))
        return rows
    raise ValueError(
        f"{path}: unknown input format {suffix or '(no suffix)'!r}; "
        f"use one of {', '.join(JSONL_SUFFIXES + CSV_SUFFIXES)}"
    )


@dataclass(frozen=True, slots=True)
class TextItem:
    """One text and where it came from; ``row`` is its record (``None`` for ``.txt``)."""

    where: str
    text: str
    row: Row | None = None


def read_texts(
    path: str | Path, fields: Sequence[str], objects_field: str | None = None
) -> list[TextItem]:
    """Texts of a file: each non-blank line of a ``.txt`` file, else one item per record
    and name in ``fields`` (see :meth:`Row.text`, which ``objects_field`` is passed to)."""
    path = Path(path)
    if path.suffix.lower() in TEXT_SUFFIXES:
        return [
            TextItem(f"{path} line {number}", line.strip())
            for number, line in enumerate(_decode(path).splitlines(), start=1)
            if line.strip()
        ]
    if not fields:
        raise ValueError(f"{path}: name the field(s) that hold the text")
    return [
        TextItem(row.where, row.text(name, objects_field), row)
        for row in read_rows(path)
        for name in fields
    ]
