"""A measuring client for the OpenAI-compatible SSE route.

Times are taken per parsed event, on the stream of lines (never per chunk):
TTFT is request start to the first non-empty `delta.content`, as in LLM
benchmarking practice (AIPerf/GenAI-Perf). The read timeout is the client's
idle watchdog: no byte (not even a `: ping`) for that long is an error, never
a hang.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from services.client.transport_run import TransportRun
from streamlab_protocol.sse import Comment, SSEDecoder


@dataclass
class StreamResult:
    status: int = 0
    request_id: str = ""
    first_byte_s: float | None = None
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
    retry_after_s: float | None = None  # a refusal's Retry-After header

    @property
    def text(self) -> str:
        return "".join(self.texts)


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
) -> StreamResult:
    """POST `body` to `url` (a .../v1/chat/completions URL) and read the stream."""
    result = StreamResult()
    decoder = SSEDecoder()
    start = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as response:
            result.status = response.status_code
            result.request_id = response.headers.get("x-request-id", "")
            if response.status_code != 200:
                retry_after = response.headers.get("retry-after", "")
                if retry_after.isdigit():
                    result.retry_after_s = float(retry_after)
                raw = await response.aread()
                result.bytes_down = len(raw)
                result.error = _error_body(raw)
                return result
            # Decoded bytes (nginx may gzip the stream); the wire count comes
            # from httpx's own tally of what it read.
            async for chunk in response.aiter_bytes():
                now = time.perf_counter() - start
                if result.first_byte_s is None:
                    result.first_byte_s = now
                result.bytes_down = response.num_bytes_downloaded
                for item in decoder.feed(chunk):
                    if isinstance(item, Comment):
                        if item.text.startswith("ping"):
                            result.ping_times.append(now)
                        continue
                    if item.retry is not None:
                        result.retry_ms = item.retry
                    if item.data == "[DONE]":
                        result.done = True
                        continue
                    _apply(result, json.loads(item.data), now, on_token)
                if stop_after_tokens is not None and len(result.texts) >= stop_after_tokens:
                    result.closed_early = True
                    result.left_at = time.monotonic()
                    return result  # leaving the block closes the connection
    except httpx.TimeoutException as exc:
        result.error = {"message": f"client timed out: {type(exc).__name__}", "code": "timeout"}
    except httpx.TransportError as exc:
        result.error = {"message": f"connection failed: {exc!r}", "code": "transport"}
    finally:
        result.total_s = time.perf_counter() - start
    if not result.done and result.error is None:
        result.error = {"message": "stream ended without [DONE]", "code": "truncated"}
    return result


def _apply(result: StreamResult, payload: dict[str, Any], now: float,
           on_token: Callable[[str], None] | None) -> None:
    if "error" in payload:
        result.error = payload["error"]
        return
    if payload.get("usage"):
        result.usage = payload["usage"]
    for choice in payload.get("choices", ()):
        content = choice.get("delta", {}).get("content")
        if content:
            if result.ttft_s is None:
                result.ttft_s = now
            result.token_times.append(now)
            result.texts.append(content)
            if on_token is not None:
                on_token(content)
        if choice.get("finish_reason"):
            result.finish_reason = choice["finish_reason"]


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
