"""Server-Sent Events, read line by line (the WHATWG event stream format)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["SseEvent", "SseParser"]


@dataclass(frozen=True)
class SseEvent:
    """One event of a stream: `event` (its type, `message` when the stream
    named none), `data` (the data lines joined with newlines) and `id` (the
    last event id, or None)."""

    event: str
    data: str
    id: str | None = None

    def json(self) -> Any:
        """`data` parsed as JSON."""
        return json.loads(self.data)


class SseParser:
    """Feeds lines (without their line ending), answers each event as its
    closing blank line arrives. Comments (`:` lines, the keep-alives) and
    unknown fields are skipped."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def feed(self, line: str) -> SseEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = SseEvent(event=self._event or "message", data="\n".join(self._data), id=self._id)
        self._event = ""
        self._data = []
        return event
