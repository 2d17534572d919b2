"""A client for the gateway's resume surface that behaves like EventSource.

It creates a stream (`POST /v1/streams`), reads its events URL, and when the
connection ends before a terminal event (`done`, `error`, `cancelled`) it
waits the server's `retry:` and reconnects with `Last-Event-ID`, as a
browser does. With `resume=False` it stops at the first cut instead: the
"broken" client that shows what a cut costs without resume.

Trouble that may pass is never an end: `event: retry` (no id: the gateway's
store unreachable, the gateway paused) or an `error` whose data says
`"retryable": true` are noted in `retries`; the server then closes the
response and the client reconnects after `retry:` with the last id it has,
exactly as after a cut.

The id it resumes from is that of the last *dispatched* event, never the last
`id:` line parsed: a cut between an event's `id:` line and its blank line
must not count that event as received (the WHATWG rule; the cut tests aim at
exactly that spot).

Every connection is recorded (status, the id sent, the response's
`Last-Event-ID` header, the raw bytes), so tests can see where each cut fell.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from streamlab_protocol.sse import Comment, SSEDecoder

TERMINAL_EVENTS = frozenset({"done", "error", "cancelled"})
RETRY_EVENT = "retry"  # services/gateway/resume/store.py: reconnect, nothing ended
DEFAULT_RETRY_MS = 3000  # what browsers use before a server says otherwise


class ResumeError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"creating the stream failed: HTTP {status}: {body[:300]}")
        self.status = status


@dataclass
class Connection:
    sent_last_event_id: str | None
    status: int = 0
    response_last_event_id: str | None = None
    raw: bytearray = field(default_factory=bytearray)
    events: int = 0
    ended: str = ""  # terminal | eof | transport | timeout | http_<status>
    detail: str = ""


@dataclass
class ResumeResult:
    stream_id: str = ""
    tokens: list[tuple[int, str]] = field(default_factory=list)  # (index, text) as received
    terminal: str | None = None  # the terminal event's name, if one arrived
    terminal_data: dict[str, Any] | None = None
    gaps: list[dict[str, Any]] = field(default_factory=list)
    retries: list[dict[str, Any]] = field(default_factory=list)  # `retry` events' data
    connections: list[Connection] = field(default_factory=list)
    error: dict[str, Any] | None = None  # why it stopped without a terminal event

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.tokens)

    @property
    def indexes(self) -> list[int]:
        return [index for index, _ in self.tokens]


async def create_stream(client: httpx.AsyncClient, base_url: str,
                        body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(f"{base_url}/v1/streams", json=body)
    if response.status_code != 201:
        raise ResumeError(response.status_code, response.text)
    created: dict[str, Any] = response.json()
    return created


async def follow_stream(
    client: httpx.AsyncClient,
    base_url: str,
    created: dict[str, Any],
    *,
    resume: bool = True,
    max_connections: int = 100,
    before_connect: Callable[[int], Awaitable[None]] | None = None,
    last_event_id: str | None = None,
    default_retry_ms: int = DEFAULT_RETRY_MS,
    on_token: Callable[[int, str], None] | None = None,
) -> ResumeResult:
    """Read a created stream to its end, reconnecting after cuts if `resume`.

    `before_connect(n)` runs before the n-th connection (0-based): tests use
    it to set the next cut. `last_event_id` picks up where an earlier reader
    (another process, a page before a reload) left off. `on_token(index, text)`
    sees each token as it arrives (a caller that acts on progress, e.g. a cut).
    """
    result = ResumeResult(stream_id=created["id"])
    url = f"{base_url}{created['events_url']}"
    last_id = last_event_id
    retry_ms = default_retry_ms  # until the server's `retry:` arrives
    for attempt in range(max_connections):
        if attempt:
            await anyio.sleep(retry_ms / 1000)  # the protocol's reconnection delay
        if before_connect is not None:
            await before_connect(attempt)
        conn = Connection(sent_last_event_id=last_id)
        result.connections.append(conn)
        # identity: byte positions on the wire are positions in the event stream.
        headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache",
                   "Accept-Encoding": "identity"}
        if last_id:
            headers["Last-Event-ID"] = last_id
        decoder = SSEDecoder()
        decoder.last_event_id = last_id or ""
        try:
            async with client.stream("GET", url, headers=headers) as response:
                conn.status = response.status_code
                conn.response_last_event_id = response.headers.get("last-event-id")
                if response.status_code != 200:
                    raw = await response.aread()
                    conn.raw += raw
                    conn.ended = f"http_{response.status_code}"
                    if response.status_code != 204:
                        result.error = _error_body(response.status_code, raw)
                    return result  # an EventSource gives up on any status but 200
                async for chunk in response.aiter_raw():
                    conn.raw += chunk
                    for item in decoder.feed(chunk):
                        if isinstance(item, Comment):
                            continue
                        conn.events += 1
                        payload = json.loads(item.data)
                        if item.event == "gap":
                            result.gaps.append(payload)
                            continue
                        if item.event == RETRY_EVENT or (
                                item.event == "error" and isinstance(payload, dict)
                                and payload.get("retryable") is True):
                            result.retries.append(payload)  # then EOF, and a reconnect
                            continue
                        last_id = item.id or last_id
                        if item.event == "token":
                            result.tokens.append((int(payload["index"]), str(payload["text"])))
                            if on_token is not None:
                                on_token(*result.tokens[-1])
                        elif item.event in TERMINAL_EVENTS:
                            result.terminal, result.terminal_data = item.event, payload
                            conn.ended = "terminal"
                            return result
                    if decoder.reconnection_time_ms is not None:
                        retry_ms = decoder.reconnection_time_ms
            conn.ended = "eof"
        except httpx.TimeoutException as exc:
            conn.ended, conn.detail = "timeout", type(exc).__name__
        except httpx.TransportError as exc:
            conn.ended, conn.detail = "transport", repr(exc)
        if not resume:
            result.error = {"code": "truncated",
                            "message": f"connection ended ({conn.ended}) before the stream did"}
            return result
    result.error = {"code": "too_many_connections",
                    "message": f"no terminal event after {max_connections} connections"}
    return result


def _error_body(status: int, raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"code": f"http_{status}", "message": raw.decode(errors="replace")[:300]}
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict):
        return {"status": status, **error}
    return {"code": f"http_{status}", "message": str(parsed)[:300]}
