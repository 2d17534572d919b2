"""Many EventSource-like readers of resumable streams, cheap enough to run
hundreds at once beside the lab on two cores.

Each reader follows one stream's events URL on a bare asyncio connection
(HTTP/1.1, no httpx: ~10x less CPU per token, see streamlab/experiments/bench/load.py),
and behaves like a browser's EventSource: when the connection ends before a
terminal event (`done`, `error`, `cancelled`) it waits the server's `retry:`
and reconnects with `Last-Event-ID` (the last *dispatched* event's id); any
status but 200 ends it (204: the stream was already over). A read timeout
(a watchdog far above the heartbeat) counts as a cut, so no reader hangs.

    readers = [Reader(host, port, created["events_url"]) for created in ...]
    await asyncio.gather(*(r.run() for r in readers))
    tally(readers, reference_text)     # lost, duplicated, reconnects, stalls
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from streamlab.experiments.report import JSON, Figures
from streamlab.experiments.scenarios.history import History
from streamlab_protocol.sse import Comment, SSEDecoder

TERMINAL_EVENTS = frozenset({"done", "error", "cancelled"})


class Dechunker:
    """HTTP/1.1 chunked transfer coding, undone incrementally."""

    def __init__(self) -> None:
        self._buffer = b""
        self._left = 0  # payload bytes still due in the current chunk
        self._skip = 0  # bytes of the CRLF after the chunk still to drop
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out: list[bytes] = []
        while self._buffer and not self.finished:
            if self._left:
                out.append(self._buffer[:self._left])
                self._buffer = self._buffer[self._left:]
                self._left -= len(out[-1])
            elif self._skip:
                dropped = min(self._skip, len(self._buffer))
                self._buffer, self._skip = self._buffer[dropped:], self._skip - dropped
            else:
                end = self._buffer.find(b"\r\n")
                if end < 0:
                    break
                size = int(self._buffer[:end].split(b";")[0] or b"0", 16)
                self._buffer = self._buffer[end + 2:]
                self.finished = size == 0
                self._left, self._skip = size, 2
        return b"".join(out)


async def readers_done(reading: asyncio.Future[Any], timeout_s: float) -> None:
    """Wait for every reader (their gather) for up to `timeout_s`; past it,
    cancel them and wait until each has unwound, so that no reader still runs
    (and moves its figures) while the scenario tallies them."""
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(reading)
    except TimeoutError:
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reading


@dataclass
class Reader:
    host: str
    port: int
    path: str  # the stream's events URL
    retry_ms: int = 3000  # EventSource's default until the server sends `retry:`
    watchdog_s: float = 10.0
    max_connections: int = 50
    tokens: list[tuple[int, str]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # monotonic, per token
    statuses: list[int] = field(default_factory=list)  # one per connection
    ends: list[str] = field(default_factory=list)  # how each connection ended
    terminal: str | None = None
    terminal_data: dict[str, JSON] | None = None  # the terminal event's data
    error: str | None = None  # why it stopped without a terminal event
    gaps: int = 0
    last_id: str | None = None
    history: History = field(default_factory=History)  # every event, for history.judge

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.tokens)

    async def run(self) -> Reader:
        for attempt in range(self.max_connections):
            if attempt:
                await asyncio.sleep(self.retry_ms / 1000)
            if await self._connect_once():
                return self
        self.error = f"no terminal event after {self.max_connections} connections"
        return self

    async def _connect_once(self) -> bool:
        """One connection; True when the reader is finished (terminal, or a
        status an EventSource gives up on)."""
        head = (f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Accept: text/event-stream\r\nCache-Control: no-cache\r\n"
                "Accept-Encoding: identity\r\nConnection: close\r\n"
                + (f"Last-Event-ID: {self.last_id}\r\n" if self.last_id else "") + "\r\n")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.watchdog_s)
        except (OSError, TimeoutError) as exc:
            self.statuses.append(0)
            self.ends.append(f"connect: {type(exc).__name__}")
            return False
        try:
            writer.write(head.encode())
            return await self._read(reader)
        except TimeoutError:
            self.ends.append("watchdog")
            return False
        except OSError as exc:
            self.ends.append(f"transport: {type(exc).__name__}")
            return False
        finally:
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> bool:
        raw_head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.watchdog_s)
        status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        status = int(status_line.split(" ", 2)[1])
        self.statuses.append(status)
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in header_lines if line)}
        chunked = "chunked" in headers.get("transfer-encoding", "")
        if status != 200:
            self.ends.append(f"http_{status}")
            if status != 204:
                body = await asyncio.wait_for(reader.read(4096), self.watchdog_s)
                self.error = f"HTTP {status}: {Dechunker().feed(body) if chunked else body!r}"
            return True
        dechunk = Dechunker() if chunked else None
        decoder = SSEDecoder()
        decoder.last_event_id = self.last_id or ""
        while True:
            data = await asyncio.wait_for(reader.read(65536), self.watchdog_s)
            if not data:
                self.ends.append("eof")
                return False
            payload = dechunk.feed(data) if dechunk is not None else data
            for item in decoder.feed(payload):
                if isinstance(item, Comment):
                    continue
                # The decoder gives an event the last id in force. A token
                # always carries its own (a replayed one repeats an id: a
                # duplicate, counted); `gap` and `retry` never do; a terminal
                # event has its own only when its id is new (an `error` sent
                # without one is no repeat of the token before it).
                own = bool(item.id) and item.event not in ("gap", "retry") and (
                    item.event == "token" or item.id != self.last_id)
                seq = int(item.id.rsplit(":", 1)[1]) if own else None
                if seq is not None or item.event in ("gap", "retry", *TERMINAL_EVENTS):
                    self.history.saw(item.event, seq, time.monotonic(), item.data)
                if item.event == "gap":
                    self.gaps += 1
                    continue
                self.last_id = item.id or self.last_id
                if item.event == "token":
                    parsed = json.loads(item.data)
                    self.tokens.append((int(parsed["index"]), str(parsed["text"])))
                    self.arrivals.append(time.monotonic())
                elif item.event in TERMINAL_EVENTS:
                    self.terminal, self.terminal_data = item.event, json.loads(item.data)
                    self.ends.append("terminal")
                    return True
            if decoder.reconnection_time_ms is not None:
                self.retry_ms = decoder.reconnection_time_ms
            if dechunk is not None and dechunk.finished:
                self.ends.append("eof")
                return False


def longest_stall_s(reader: Reader) -> float:
    """The longest wait between two tokens this reader saw (0 with < 2 tokens)."""
    times = reader.arrivals
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def tally(readers: list[Reader], reference: str, expected_tokens: int) -> Figures:
    """What a user would check across all readers: each got the reference
    text whole, each token once."""
    lost = duplicated = whole = 0
    lost_streams = 0
    for reader in readers:
        counts = Counter(index for index, _ in reader.tokens)
        missing = expected_tokens - len(counts)
        lost += max(0, missing)
        duplicated += sum(n - 1 for n in counts.values() if n > 1)
        exact = reader.text == reference and reader.terminal == "done"
        whole += exact
        lost_streams += not exact
    stalls = sorted(longest_stall_s(r) for r in readers)
    ends = Counter(end for r in readers for end in r.ends if end != "terminal")
    errors = Counter(
        f"{r.terminal} {(r.terminal_data or {}).get('reason', '')}".strip() if r.terminal
        else (r.error or "none").split(":")[0] for r in readers if r.terminal != "done")
    return {
        "streams": len(readers),
        "streams_whole": whole,
        "streams_lost": lost_streams,
        "tokens_lost": lost,
        "tokens_duplicated": duplicated,
        "reconnects": sum(len(r.statuses) - 1 for r in readers),
        "readers_reconnected": sum(len(r.statuses) > 1 for r in readers),
        "resume_404s": sum(r.statuses.count(404) for r in readers),
        "gap_events": sum(r.gaps for r in readers),
        "longest_stall_s": round(stalls[-1], 3) if stalls else None,
        "median_longest_stall_s": round(stalls[len(stalls) // 2], 3) if stalls else None,
        "cuts": ", ".join(f"{k} {v}" for k, v in ends.most_common(4)) or "none",
        "ends_other_than_done": ", ".join(f"{k} {v}" for k, v in errors.most_common(4))
                                or "none",
    }
