"""An OpenAI-compatible server as the engine's model: vLLM, llama.cpp's server,
Ollama, a hosted API, or another streamlab gateway.

Each generation is one streamed `POST {base_url}/chat/completions`. Every
`delta.content` becomes one engine token (counted with `tracker.generated()`
as it arrives); the final usage chunk (`stream_options.include_usage`) gives
the real token counts.

Cancellation: the handler task is cancelled at its `await` on the response
body; leaving `client.stream(...)` closes the response, and httpx closes a
connection whose body was not read to the end (it cannot be reused). The
upstream sees the connection close at once, which is what makes vLLM abort
the request and free its KV cache.

The engine tells its caller it accepted the call only once the upstream
answered 200 (`defers_acceptance`), so an upstream refusal reaches the client
as the matching HTTP status. The gateway's accept timeout then covers the
upstream's response headers, which OpenAI-compatible servers send before
their prefill.

Errors, translated at this boundary:

    HTTP status before the stream      gRPC status (→ the gateway's HTTP status)
      400, 413, 422                      INVALID_ARGUMENT     (400)
      401 / 403                          UNAUTHENTICATED / PERMISSION_DENIED (502:
                                         the engine's key, not the client's fault)
      404                                NOT_FOUND            (404: unknown model)
      408, 504                           DEADLINE_EXCEEDED    (504)
      429                                RESOURCE_EXHAUSTED   (429)
      other 5xx                          UNAVAILABLE          (503)
    connect failure                      UNAVAILABLE
    no byte for read_timeout_s           DEADLINE_EXCEEDED
    an `error` event, a cut connection,  after the first token: an error event on
    a stream without `[DONE]`            the engine stream (the SSE error event)
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import httpx

from services.engine.backends.base import (
    ACCEPTED,
    Accepted,
    BackendError,
    BackendLoad,
    ErrorStatus,
    GenerationInput,
    GenerationSummary,
    TokenTracker,
)
from services.engine.backends.fake import FakeTiming, read_timing
from services.engine.settings import FakeModelDefaults, OpenAIUpstreamSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.sse import Comment, SSEDecoder

_STATUS_FOR_HTTP: dict[int, ErrorStatus] = {
    400: "INVALID_ARGUMENT", 413: "INVALID_ARGUMENT", 422: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED", 504: "DEADLINE_EXCEEDED", 429: "RESOURCE_EXHAUSTED",
}


def status_for_http(status_code: int) -> ErrorStatus:
    if status_code in _STATUS_FOR_HTTP:
        return _STATUS_FOR_HTTP[status_code]
    return "UNAVAILABLE" if status_code >= 500 else "INTERNAL"


def http_error(status_code: int, body: bytes) -> BackendError:
    """The upstream's refusal, with its own message when it sent an OpenAI-style body."""
    message = body.decode("utf-8", errors="replace")[:500]
    code = f"upstream_http_{status_code}"
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        message = str(error.get("message") or message)
        if error.get("code"):
            code = f"upstream_{error['code']}"
    return BackendError(code, f"upstream answered {status_code}: {message}",
                        status=status_for_http(status_code))


@dataclass(frozen=True)
class UpstreamOptions:
    """What this backend reads from the wire request: the client's sampling
    options (sent on as OpenAI's fields), and the fake model's timing when
    it forwards it."""

    timing: FakeTiming | None = None
    sampling: tuple[tuple[str, float | int], ...] = ()


SAMPLING_FIELDS = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty")


def read_sampling(request: pb.GenerateRequest) -> tuple[tuple[str, float | int], ...]:
    """The sampling options the client set (unset ones: the upstream's defaults)."""
    if not request.HasField("sampling"):
        return ()
    sampling = request.sampling
    return tuple((name, getattr(sampling, name)) for name in SAMPLING_FIELDS
                 if sampling.HasField(name))


def request_body(request: GenerationInput, settings: OpenAIUpstreamSettings,
                 timing: FakeTiming | None = None,
                 sampling: tuple[tuple[str, float | int], ...] = ()) -> dict[str, Any]:
    """The upstream's request body; `timing`, when given, goes as the `streamlab`
    field; `sampling` as OpenAI's own fields."""
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    if not messages:
        messages = [{"role": "user", "content": request.prompt}]
    body: dict[str, Any] = {"messages": messages, "stream": True,
                            "stream_options": {"include_usage": True}}
    if settings.model:
        body["model"] = settings.model
    if request.requested_max_tokens:
        body["max_tokens"] = request.requested_max_tokens
    if request.stop:
        # The upstream stops its own decoding (the GPU saving); the engine's
        # matcher still applies, so the text is cut the same either way.
        body["stop"] = list(request.stop)
    body.update(sampling)
    if timing is not None:
        body["streamlab"] = {
            "prefill_ms": timing.prefill_ms, "token_gap_ms": timing.token_gap_ms,
            "answer_tokens": timing.answer_tokens,
            "pauses": [{"after_token": p.after_token, "pause_ms": p.pause_ms}
                       for p in timing.pauses],
        }
    return body


@dataclass
class ChunkContent:
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None


def parse_chunk(payload: Any) -> ChunkContent:
    """One `data:` JSON of a chat.completion.chunk stream."""
    if not isinstance(payload, dict):
        return ChunkContent(error=f"not a JSON object: {payload!r:.200}")
    if "error" in payload:
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return ChunkContent(error=str(message))
    content = ChunkContent(usage=payload.get("usage") or None)
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        content.text += delta.get("content") or ""
        content.finish_reason = choice.get("finish_reason") or content.finish_reason
    return content


class OpenAIUpstream:
    name = "openai"
    # The engine accepts when the upstream does: its 4xx/5xx become the gateway's.
    defers_acceptance = True
    max_concurrency: int | None = None  # the upstream schedules (vLLM batches)
    calls_tools = False  # tools are not forwarded upstream: refused rather than dropped

    def __init__(self, settings: OpenAIUpstreamSettings,
                 fake_defaults: FakeModelDefaults) -> None:
        if not settings.base_url:
            raise ValueError("the openai backend needs STREAMLAB_OPENAI_BASE_URL "
                             "(e.g. http://127.0.0.1:8000/v1), or `streamlab up --base-url`")
        self._settings = settings
        # Only for forward_streamlab_timing: the timing forwarded is the request's,
        # each unset field filled in as this engine's fake model would.
        self._fake_defaults = fake_defaults
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        headers = {"Accept": "text/event-stream"}
        if settings.api_key is not None:
            headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s,
                                  pool=settings.connect_timeout_s),
        )

    def options(self, request: pb.GenerateRequest) -> UpstreamOptions:
        """The client's sampling options, and the fake model's timing to forward
        (a chained streamlab lab) when asked to."""
        timing = (read_timing(request, self._fake_defaults)
                  if self._settings.forward_streamlab_timing else None)
        return UpstreamOptions(timing, read_sampling(request))

    async def generate(
        self, request: GenerationInput, options: UpstreamOptions, tracker: TokenTracker
    ) -> AsyncGenerator[str | GenerationSummary | Accepted, None]:
        produced = 0
        finish: str | None = None
        usage: dict[str, Any] = {}
        done = False
        try:
            async with self._client.stream(
                "POST", self._url, json=request_body(request, self._settings, options.timing,
                                                    options.sampling),
                headers={"X-Request-Id": request.request_id},
            ) as response:
                if response.status_code != 200:
                    raise http_error(response.status_code, await response.aread())
                yield ACCEPTED
                decoder = SSEDecoder()
                async for raw in response.aiter_bytes():
                    for item in decoder.feed(raw):
                        if isinstance(item, Comment):
                            continue  # the upstream's heartbeats
                        if item.data.strip() == "[DONE]":
                            done = True
                            break
                        chunk = _parse(item.data)
                        if chunk.error is not None:
                            raise BackendError("upstream_error", f"upstream: {chunk.error}",
                                               status="UNAVAILABLE")
                        usage = chunk.usage or usage
                        finish = chunk.finish_reason or finish
                        if chunk.text:
                            tracker.generated()
                            produced += 1
                            yield chunk.text
                    if done:
                        break
        except httpx.ConnectError as exc:
            raise BackendError("upstream_unreachable", f"cannot connect to {self._url}: {exc}",
                               status="UNAVAILABLE") from exc
        except httpx.TimeoutException as exc:
            raise BackendError("upstream_timeout", f"upstream {type(exc).__name__}: {exc}",
                               status="DEADLINE_EXCEEDED") from exc
        except httpx.TransportError as exc:
            raise BackendError("upstream_disconnected", f"upstream connection failed: {exc!r}",
                               status="UNAVAILABLE") from exc
        if not done:
            raise BackendError("upstream_truncated", "upstream stream ended without [DONE]",
                               status="UNAVAILABLE")
        yield GenerationSummary(
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or produced),
            finished_by_length=finish == "length",
        )

    def finished_by_length(
        self, request: GenerationInput, options: UpstreamOptions, produced: int
    ) -> bool:
        return produced >= request.max_tokens  # not used: generate() yields a summary

    def load(self) -> BackendLoad:
        return BackendLoad(device=self._settings.base_url)

    async def aclose(self) -> None:
        await self._client.aclose()


def _parse(data: str) -> ChunkContent:
    try:
        return parse_chunk(json.loads(data))
    except ValueError as exc:
        raise BackendError("upstream_bad_chunk", f"upstream sent invalid JSON: {data[:200]!r}",
                           status="UNAVAILABLE") from exc
