"""A measuring client for the OpenAI-compatible SSE route.

Times are taken per parsed event, on the stream of lines (never per chunk):
TTFT is request start to the first non-empty `delta.content`, as in LLM
benchmarking practice (AIPerf/GenAI-Perf). The read timeout is the client's
idle watchdog: no byte (not even a `: ping`) for that long is an error, never
a hang.

The same record serves `streamlab check` (streamlab/experiments/check/), which
judges someone else's server on it, so nothing the server sends raises: every
read is kept with its time and size (a buffering hop shows as one big read),
every comment counted, data that is not JSON and events after `[DONE]` are
recorded rather than parsed or applied, and a non-2xx answer's body is kept.
Nothing it sends can hang or exhaust the reader either: an event larger than
`max_event_chars` (a line that never ends) stops the read, and so does a
stream still open at `deadline_s` (an answer that never ends); each is an
error with its own code.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from services.client.transport_run import TransportRun
from streamlab_protocol.sse import Comment, Event, SSEDecoder

# An OpenAI chunk is a few hundred bytes, a tool call's arguments a few KB: an
# event past this is a server that never ends its line, and reading on would
# hold all of it (the decoder keeps the unfinished line).
MAX_EVENT_CHARS = 1 << 20
KEPT_TOOL_DELTAS = 1000  # the shape check reads the first ones; a runaway call stops here


@dataclass
class StreamResult:
    status: int = 0
    request_id: str = ""
    headers_s: float | None = None  # request sent → response headers (time to first byte)
    first_byte_s: float | None = None  # request sent → the first body bytes
    ttft_s: float | None = None
    total_s: float = 0.0
    token_times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    ping_times: list[float] = field(default_factory=list)
    done: bool = False
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    bytes_down: int = 0
    closed_early: bool = False  # we stopped reading on purpose (stop_after_tokens)
    left_at: float | None = None  # time.monotonic() when we decided to close
    retry_ms: int | None = None  # the last `retry:` the server sent
    started_unix: float = 0.0  # time.time() at the request's start: other hops' clocks
    retry_after_s: float | None = None  # a refusal's Retry-After header
    content_encoding: str = ""  # the answer's Content-Encoding header ("" when none)
    # What a conformance check judges (streamlab check):
    reads: list[tuple[float, int]] = field(default_factory=list)  # (when, bytes) per read
    token_reads: list[float] = field(default_factory=list)  # reads that carried a token
    token_chunks: int = 0  # chunks with content, tool calls or reasoning in a delta
    events: int = 0
    comments: int = 0
    after_done: int = 0  # events after [DONE] (there must be none)
    bad_json: list[str] = field(default_factory=list)  # event data that is not a JSON object
    last_chunk: dict[str, Any] | None = None
    body: bytes = b""  # a non-2xx answer's body
    paused_at_s: float | None = None  # request sent → the reader held off (pause_after_tokens)
    paused_s: float | None = None  # for how long
    # The stream's shape (streamlab check's `shape` and `tool-calls`):
    first_delta: dict[str, Any] | None = None  # the first choice's first delta
    last_choice_chunk: dict[str, Any] | None = None  # the last chunk with a choice in it
    usage_chunks: int = 0  # chunks that carried `usage`
    invalid_utf8: int = 0  # reads with bytes that are not UTF-8 (the decoder's count)
    tool_deltas: list[dict[str, Any]] = field(default_factory=list)  # each tool_calls entry
    reasoning_fields: set[str] = field(default_factory=set)  # reasoning_content / reasoning

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def error_text(self) -> str:
        """The error in one line, `code: message` ('' when none)."""
        if self.error is None:
            return ""
        return f"{self.error.get('code')}: {self.error.get('message')}"[:200]

    @property
    def lump(self) -> bool:
        """Everything at the end (a buffering or compressing hop): the first byte
        at 80 % of the answer or later, the tokens bunched within 10 % of it."""
        if self.first_byte_s is None or len(self.token_times) < 2:
            return False
        spread = self.token_times[-1] - self.token_times[0]
        return self.first_byte_s >= 0.8 * self.total_s and spread < 0.1 * self.total_s

    @property
    def first_token_s(self) -> float | None:
        """Request sent → the first read that carried a token (content, tool
        calls or reasoning)."""
        return self.token_reads[0] if self.token_reads else None

    @property
    def longest_byte_gap(self) -> tuple[float, float] | None:
        """(length, start) of the longest stretch with no byte over the whole
        answer, from sending the request to its end: what an idle-cutting hop
        sees wherever the silence falls (before the first token, or between
        two tokens while a model thinks or a preempted request waits)."""
        if self.headers_s is None:
            return None
        marks = sorted({0.0, self.headers_s, *(t for t, _ in self.reads), self.total_s})
        if len(marks) < 2:
            return (0.0, 0.0)
        return max((b - a, a) for a, b in itertools.pairwise(marks))

    @property
    def longest_wait_for_token(self) -> tuple[float, float] | None:
        """(length, start) of the longest wait for a token, before the first or
        between two (comments and empty chunks do not end it): the silence the
        server had to keep alive."""
        if not self.token_reads:
            return None
        marks = [0.0, *self.token_reads]
        return max((b - a, a) for a, b in itertools.pairwise(marks))


    def gaps(self) -> list[float]:
        """Between successive reads that carried tokens (a batch in one read is one)."""
        return [b - a for a, b in itertools.pairwise(self.token_reads)]


def chat_body(prompt: str, *, stream: bool = True, max_tokens: int | None = None,
              **timing: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "streamlab-fake", "stream": stream,
                            "messages": [{"role": "user", "content": prompt}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    options = {k: v for k, v in timing.items() if v is not None}
    if options:
        body["streamlab"] = options
    return body


async def stream_chat(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    stop_after_tokens: int | None = None,
    on_token: Callable[[str], None] | None = None,
    before_leaving: Callable[[], Awaitable[None]] | None = None,
    pause_after_tokens: int | None = None,
    pause: Callable[[], Awaitable[None]] | None = None,
    deadline_s: float | None = None,
    max_event_chars: int = MAX_EVENT_CHARS,
) -> StreamResult:
    """POST `body` to `url` (a .../v1/chat/completions URL) and read the stream.

    `stop_after_tokens`: leave then (closing the connection), awaiting
    `before_leaving` first while the stream is still open. `pause_after_tokens`:
    await `pause` once then, reading nothing meanwhile (a reader that stopped),
    then read on to the end. `deadline_s`: stop reading a stream still open
    then (an error, code `deadline`)."""
    result = StreamResult()
    try:
        with anyio.fail_after(deadline_s):
            await _read(client, url, body, headers, result, stop_after_tokens, on_token,
                        before_leaving, pause_after_tokens, pause, max_event_chars)
    except TimeoutError:
        result.error = {"message": f"the stream was still open after {deadline_s:g} s: "
                                   "an answer that does not end", "code": "deadline"}
    if not result.done and result.error is None and not result.closed_early:
        result.error = {"message": "stream ended without [DONE]", "code": "truncated"}
    return result


async def _read(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                headers: dict[str, str] | None, result: StreamResult,
                stop_after_tokens: int | None, on_token: Callable[[str], None] | None,
                before_leaving: Callable[[], Awaitable[None]] | None,
                pause_after_tokens: int | None, pause: Callable[[], Awaitable[None]] | None,
                max_event_chars: int) -> None:
    decoder = SSEDecoder()
    start = time.perf_counter()
    result.started_unix = time.time()  # the same moment on the wall clock (tracing)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            result.status = response.status_code
            result.headers_s = time.perf_counter() - start
            result.request_id = response.headers.get("x-request-id", "")
            result.content_encoding = response.headers.get("content-encoding", "")
            if response.status_code != 200:
                retry_after = response.headers.get("retry-after", "")
                if retry_after.isdigit():
                    result.retry_after_s = float(retry_after)
                raw = await response.aread()
                result.bytes_down = len(raw)
                result.body = raw
                result.error = _error_body(raw)
                return
            # Decoded bytes (nginx may gzip the stream); the wire count comes
            # from httpx's own tally of what it read.
            async for chunk in response.aiter_bytes():
                now = time.perf_counter() - start
                if result.first_byte_s is None:
                    result.first_byte_s = now
                result.bytes_down = response.num_bytes_downloaded
                result.reads.append((now, len(chunk)))
                token_here = False
                for item in decoder.feed(chunk):
                    if isinstance(item, Comment):
                        result.comments += 1
                        if item.text.startswith("ping"):
                            result.ping_times.append(now)
                        continue
                    token_here |= _event(result, item, now, on_token)
                if token_here:
                    result.token_reads.append(now)
                result.invalid_utf8 = decoder.invalid_utf8
                if decoder.pending_chars > max_event_chars:
                    result.error = {"message": f"an event grew past {max_event_chars} "
                                               "characters with no end of line: stopped reading",
                                    "code": "oversized_event"}
                    return
                if (pause is not None and pause_after_tokens is not None
                        and result.paused_s is None and result.token_chunks >= pause_after_tokens):
                    result.paused_at_s = now
                    held = time.perf_counter()
                    await pause()
                    result.paused_s = time.perf_counter() - held
                if stop_after_tokens is not None and len(result.texts) >= stop_after_tokens:
                    if before_leaving is not None:
                        await before_leaving()
                    result.closed_early = True
                    result.left_at = time.monotonic()
                    return  # leaving the block closes the connection
    except httpx.TimeoutException as exc:
        result.error = {"message": f"client timed out: {type(exc).__name__}", "code": "timeout"}
    except httpx.TransportError as exc:
        result.error = {"message": f"connection failed: {exc!r}", "code": "transport"}
    finally:
        result.total_s = time.perf_counter() - start


def _event(result: StreamResult, event: Event, now: float,
           on_token: Callable[[str], None] | None) -> bool:
    """Apply one event; whether it carried a token."""
    result.events += 1
    if event.retry is not None:
        result.retry_ms = event.retry
    if result.done:
        result.after_done += 1  # counted, never applied: the stream was over
        return False
    if event.data == "[DONE]":
        result.done = True
        return False
    try:
        payload = json.loads(event.data)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        result.bad_json.append(event.data[:80])
        if result.error is None:
            result.error = {"message": f"event data is not a JSON object: {event.data[:80]!r}",
                            "code": "bad_json"}
        return False
    result.last_chunk = payload
    _apply(result, payload, now, on_token)
    if _has_token(payload):
        result.token_chunks += 1
        return True
    return False


def _has_token(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls")
                                        or delta.get("reasoning_content")
                                        or delta.get("reasoning")):
            return True
    return False


def _apply(result: StreamResult, payload: dict[str, Any], now: float,
           on_token: Callable[[str], None] | None) -> None:
    if "error" in payload:
        result.error = payload["error"]
        return
    if payload.get("usage"):
        result.usage = payload["usage"]
        result.usage_chunks += 1
    choices = payload.get("choices")
    if isinstance(choices, list) and choices:
        result.last_choice_chunk = payload
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            _shape(result, delta)
        content = delta.get("content") if isinstance(delta, dict) else None
        if content:
            if result.ttft_s is None:
                result.ttft_s = now
            result.token_times.append(now)
            result.texts.append(content)
            if on_token is not None:
                on_token(content)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


def _shape(result: StreamResult, delta: dict[str, Any]) -> None:
    """What the shape checks read of a delta, kept small whatever the stream's length."""
    if result.first_delta is None:
        result.first_delta = delta
    calls = delta.get("tool_calls")
    if isinstance(calls, list):
        room = KEPT_TOOL_DELTAS - len(result.tool_deltas)
        result.tool_deltas.extend(c for c in calls[:max(room, 0)] if isinstance(c, dict))
    for name in ("reasoning_content", "reasoning"):
        if delta.get(name):
            result.reasoning_fields.add(name)


def _error_body(raw: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {"message": raw.decode(errors="replace")[:500], "code": "http_error"}
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error: dict[str, Any] = parsed["error"]
        return error
    return {"message": str(parsed)[:500], "code": "http_error"}


async def sse_chat(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                   headers: dict[str, str] | None = None) -> TransportRun:
    """`stream_chat` in the terms every transport is measured in (transport_run.py)."""
    result = await stream_chat(client, url, body, headers=headers)
    run = TransportRun("sse", requests=1, done=result.done, total_s=result.total_s,
                       payload_bytes_down=result.bytes_down)
    for text, at in zip(result.texts, result.token_times, strict=True):
        run.tokens([text], at)
    if result.error is not None:
        run.error = f"{result.error.get('code')}: {result.error.get('message')}"
    return run
