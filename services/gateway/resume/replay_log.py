"""One stream's replay log, and the event ids that address it.

Pure logic (no I/O, no clock), so it is unit-tested on its own.

Events are numbered 1, 2, 3, ... with no holes; the wire id of event `n` of
stream `s` is `s:n`, so a `Last-Event-ID` names both the stream and the place
in it. The log is bounded by count and by bytes: when it is over either bound
it drops its *oldest* entries (a client that far behind has already missed
them), and `after(n)` reports what can no longer be replayed instead of
silently skipping it.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from services.gateway.errors import GatewayException

# Per-entry bookkeeping on top of the payload (sequence, kind, deque slot): a
# rough figure, so the byte bound tracks real memory rather than only payloads.
ENTRY_OVERHEAD_BYTES = 64

_STREAM_ID = re.compile(r"[0-9a-f]{32}")
_EVENT_ID = re.compile(r"([0-9a-f]{32}):(0|[1-9][0-9]{0,17})")


def is_stream_id(text: str) -> bool:
    return bool(_STREAM_ID.fullmatch(text))


def event_id(stream_id: str, seq: int) -> str:
    return f"{stream_id}:{seq}"


class BadEventId(GatewayException, ValueError):
    """A Last-Event-ID that is not `<stream id>:<sequence>`."""


def parse_event_id(text: str) -> tuple[str, int]:
    match = _EVENT_ID.fullmatch(text)  # fullmatch: no trailing newline slips by
    if match is None:
        raise BadEventId(f"Last-Event-ID {text[:80]!r} is not '<stream id>:<sequence>'")
    return match.group(1), int(match.group(2))


@dataclass(frozen=True)
class Entry:
    seq: int
    kind: str  # the SSE event name: token, done, error, cancelled
    data: str  # the SSE data (JSON text)
    size: int  # bytes this entry accounts for


@dataclass(frozen=True)
class Replay:
    """What a client that has seen everything up to `after` gets now."""

    entries: list[Entry]
    # First and last sequence number the client asked for but the log has
    # already dropped; None when the replay is complete.
    missed: tuple[int, int] | None = None


class ReplayLog:
    def __init__(self, max_events: int, max_bytes: int, start_after: int = 0) -> None:
        """`start_after`: the sequence number before this log's first event (a
        replica that takes a stream over continues the shared log from there)."""
        if max_events < 1 or max_bytes < 1:
            raise ValueError(f"replay log bounds must be positive: {max_events=}, {max_bytes=}")
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._entries: deque[Entry] = deque()
        self.last_seq = start_after  # the newest sequence number ever appended (0: none)
        self.bytes = 0

    @property
    def first_seq(self) -> int:
        """The oldest sequence number still held (last_seq + 1 when empty)."""
        return self._entries[0].seq if self._entries else self.last_seq + 1

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, kind: str, data: str) -> Entry:
        """Add the next event; drop the oldest ones while over the bounds.

        The newest entry is always kept, even alone over max_bytes: a log that
        cannot hold the event being streamed would make every resume a gap.
        """
        self.last_seq += 1
        size = len(data.encode()) + len(kind) + ENTRY_OVERHEAD_BYTES
        entry = Entry(self.last_seq, kind, data, size)
        self._entries.append(entry)
        self.bytes += size
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_events or self.bytes > self.max_bytes
        ):
            self.drop_oldest()
        return entry

    def drop_oldest(self) -> int:
        """Forget the oldest entry; return the bytes freed (0 if empty)."""
        if not self._entries:
            return 0
        entry = self._entries.popleft()
        self.bytes -= entry.size
        return entry.size

    def clear(self) -> int:
        freed = self.bytes
        self._entries.clear()
        self.bytes = 0
        return freed

    def after(self, seq: int) -> Replay:
        """Entries after `seq`, and the range already dropped, if any."""
        if seq < 0 or seq > self.last_seq:
            raise ValueError(f"sequence {seq} is outside 0..{self.last_seq}")
        first = self.first_seq
        missed = (seq + 1, first - 1) if seq + 1 < first else None
        start = max(seq + 1, first) - first
        entries = [self._entries[i] for i in range(start, len(self._entries))]
        return Replay(entries, missed)
