"""One streamed request, timed read by read and parsed by the project's SSE
codec (the WHATWG rules), so every check judges the same record."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from streamlab.experiments.report import JSON
from streamlab_protocol.sse import Comment, Event, SSEDecoder


@dataclass
class StreamRecord:
    status: int = 0
    headers_s: float | None = None  # request sent → response headers (time to first byte)
    first_token_s: float | None = None  # request sent → the first content delta
    reads: list[tuple[float, int]] = field(default_factory=list)  # (when, bytes) per read
    token_reads: list[float] = field(default_factory=list)  # reads that carried a token
    tokens: int = 0
    events: int = 0
    comments: int = 0
    done: bool = False  # `data: [DONE]` arrived
    after_done: int = 0  # events after [DONE] (there must be none)
    bad_json: list[str] = field(default_factory=list)  # data that is not JSON
    last_chunk: dict[str, JSON] | None = None
    body: bytes = b""  # a non-2xx answer's body
    error: str = ""  # a transport error ("" when none)
    left: bool = False  # the client left on purpose

    @property
    def longest_silence_s(self) -> float | None:
        """The longest stretch with no byte at all, from sending the request to
        the first token: what an idle-cutting hop on the way sees."""
        if self.first_token_s is None:
            return None
        marks = [0.0] + ([self.headers_s] if self.headers_s is not None else [])
        marks += [t for t, _ in self.reads if t <= self.first_token_s] + [self.first_token_s]
        marks.sort()
        return max(b - a for a, b in itertools.pairwise(marks)) if len(marks) > 1 else 0.0

    @property
    def bytes_before_first_token(self) -> int:
        if self.first_token_s is None:
            return sum(n for _, n in self.reads)
        return sum(n for t, n in self.reads if t < self.first_token_s)

    def gaps(self) -> list[float]:
        """Between successive reads that carried tokens (a batch in one read is one)."""
        return [b - a for a, b in zip(self.token_reads, self.token_reads[1:], strict=False)]


def _has_token(chunk: dict[str, JSON]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")
                                        or delta.get("reasoning_content")):
            return True
    return False


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict[str, JSON],
                      headers: dict[str, str], *, leave_after_tokens: int | None = None,
                      before_leaving: Callable[[], Awaitable[None]] | None = None
                      ) -> StreamRecord:
    """POST `body` and read the answer to its end (or leave after that many
    tokens, awaiting `before_leaving` first while the stream is still open);
    never raises on the server's behaviour, records it."""
    record = StreamRecord()
    decoder = SSEDecoder()
    start = time.monotonic()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            record.status = response.status_code
            record.headers_s = time.monotonic() - start
            if response.status_code >= 300:
                record.body = await response.aread()
                return record
            async for raw in response.aiter_bytes():
                now = time.monotonic() - start
                record.reads.append((now, len(raw)))
                token_here = False
                for item in decoder.feed(raw):
                    if isinstance(item, Comment):
                        record.comments += 1
                        continue
                    token_here |= _record_event(record, item)
                if token_here:
                    record.token_reads.append(now)
                    if record.first_token_s is None:
                        record.first_token_s = now
                if leave_after_tokens is not None and record.tokens >= leave_after_tokens:
                    if before_leaving is not None:
                        await before_leaving()
                    record.left = True
                    return record  # leaving the block closes the connection
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:200] or type(exc).__name__
    return record


def _record_event(record: StreamRecord, event: Event) -> bool:
    """Count one event; whether it carried a token."""
    record.events += 1
    if record.done:
        record.after_done += 1
        return False
    if event.data == "[DONE]":
        record.done = True
        return False
    try:
        chunk = json.loads(event.data)
    except ValueError:
        record.bad_json.append(event.data[:80])
        return False
    if not isinstance(chunk, dict):
        record.bad_json.append(event.data[:80])
        return False
    record.last_chunk = chunk
    if _has_token(chunk):
        record.tokens += 1
        return True
    return False
