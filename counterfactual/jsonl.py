"""Read JSON Lines input strictly: every problem names the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class JsonLine:
    path: Path
    line: int
    value: dict[str, Any]

    @property
    def where(self) -> str:
        """``"PATH line N"``, for error messages."""
        return f"{self.path} line {self.line}"


def json_objects(path: str | Path) -> Iterator[JsonLine]:
    """Each non-blank line of a UTF-8 JSON Lines file as a JSON object. Bad UTF-8, malformed JSON
    or a line that is not an object raise ``ValueError`` naming the file and line."""
    path = Path(path)
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        where = f"{path} line {number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"{where}: not UTF-8 ({err.reason})") from None
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: malformed JSON: {err.msg} (column {err.colno})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(value).__name__}")
        yield JsonLine(path, number, value)
