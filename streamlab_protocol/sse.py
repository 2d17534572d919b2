"""An incremental Server-Sent Events parser that works on bytes, not chunks.

It follows the WHATWG "Parsing an event stream" rules: lines end in CRLF, LF
or CR (a CR at the end of one read and an LF at the start of the next are one
line end), a leading BOM is dropped, `:` lines are comments, one space after
the colon is stripped, `data` lines join with "\\n", `id` persists across
events and is ignored if it holds NUL, `retry` only takes digits, and a blank
line dispatches. UTF-8 is decoded incrementally, so a character split across
two TCP reads comes out whole; bytes that are not UTF-8 come out as U+FFFD,
and the reads that held any are counted (`invalid_utf8`).

Why not httpx-sse's decoder: it drops comments, and the lab must see each
`: ping` (heartbeat scenarios time them), and it is tied to httpx, while the
lab also parses raw sockets (cut and slicer tests).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    data: str
    event: str = "message"
    id: str = ""  # the last event id in force when this event was dispatched
    retry: int | None = None


@dataclass(frozen=True)
class Comment:
    text: str


Item = Event | Comment


class SSEDecoder:
    def __init__(self) -> None:
        # Strict, so that bytes that are not UTF-8 are noticed at no cost to
        # the reads that are: a failed decode leaves the decoder's state as it
        # was, and the read is decoded again with replacement.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self.invalid_utf8 = 0  # reads that held bytes that are not UTF-8
        self._buffer = ""
        self._skip_lf = False  # the previous read ended in CR
        self._started = False
        self._data: list[str] = []
        self._event = ""
        self._retry: int | None = None
        self.last_event_id = ""
        # The server's latest `retry:`, in force from the moment it is parsed
        # (even in a block with no data, which dispatches nothing).
        self.reconnection_time_ms: int | None = None

    @property
    def pending_chars(self) -> int:
        """Characters held for an event not yet complete (an unfinished line and
        the data lines so far): what a reader bounds against a line that never ends."""
        return len(self._buffer) + sum(len(d) for d in self._data)

    def feed(self, chunk: bytes) -> list[Item]:
        """Parse one read's worth of bytes; return the items it completed."""
        try:
            text = self._utf8.decode(chunk)
        except UnicodeDecodeError:
            self.invalid_utf8 += 1
            self._utf8.errors = "replace"
            text = self._utf8.decode(chunk)
            self._utf8.errors = "strict"
        if not self._started and text:
            self._started = True
            text = text.removeprefix("\ufeff")
        if self._skip_lf and text:
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        self._buffer += text
        items: list[Item] = []
        start = 0
        buffer = self._buffer
        length = len(buffer)
        while True:
            cr = buffer.find("\r", start)
            lf = buffer.find("\n", start)
            if cr == -1 and lf == -1:
                break
            end = lf if cr == -1 else cr if lf == -1 else min(cr, lf)
            line = buffer[start:end]
            if buffer[end] == "\r":
                if end + 1 < length:
                    start = end + 2 if buffer[end + 1] == "\n" else end + 1
                else:
                    start = end + 1
                    self._skip_lf = True
            else:
                start = end + 1
            item = self._line(line)
            if item is not None:
                items.append(item)
        self._buffer = buffer[start:]
        return items

    def _line(self, line: str) -> Item | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return Comment(line[1:].removeprefix(" "))
        field, colon, value = line.partition(":")
        if colon:
            value = value.removeprefix(" ")
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif field == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
            self.reconnection_time_ms = self._retry
        return None

    def _dispatch(self) -> Event | None:
        data, event, retry = self._data, self._event, self._retry
        self._data, self._event, self._retry = [], "", None
        if not data:
            return None
        return Event(data="\n".join(data), event=event or "message", id=self.last_event_id,
                     retry=retry)


def encode(event: Event) -> bytes:
    """The inverse, for tests and the reference floor server: one event's bytes."""
    lines = []
    if event.event != "message":
        lines.append(f"event: {event.event}")
    if event.id:
        lines.append(f"id: {event.id}")
    if event.retry is not None:
        lines.append(f"retry: {event.retry}")
    lines.extend(f"data: {part}" for part in event.data.split("\n"))
    return ("\n".join(lines) + "\n\n").encode()
