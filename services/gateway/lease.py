"""One owner per engine call: every surface (SSE, non-streaming, resume,
WebSocket, polling) opens the engine through an `EngineLease`.

    lease.open()    admission, in this order, before anything starts:
                      broken modes refused (400), the model (404), prompt
                      size (400), drain (503 + Retry-After), the caps (429 +
                      Retry-After: every surface counts against its client's
                      identity, services/gateway/identity.py), then the
                      engine call, accepted (or its refusal as an HTTP status);
                      a started call is tracked by the drain
    lease.events()  the call's events (tokens, then the finish, or one
                      EngineError), counted, with the request's broken modes
                      applied (services/gateway/broken_modes.py)
    lease.close()   cancel the call, untrack it, free the slot: synchronous and
                      idempotent, so it can run on every exit path, including a
                      `finally` inside a cancelled task

A request that owns its call uses `async with lease:`. A surface whose call
outlives the request (resume, polling) opens the lease in the request, so
refusals are HTTP statuses, and hands it to the task that owns the call from
then on, which closes it when the generation ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import TYPE_CHECKING

from services.gateway.drain import DRAINING
from services.gateway.engine_client import EngineEvent, EngineStream
from services.gateway.errors import BadRequest, EngineError, GatewayError
from services.gateway.limits import StreamSlot
from services.gateway.openai_api import ChatCompletionRequest

if TYPE_CHECKING:
    from services.gateway.state import GatewayState

class EngineLease:
    def __init__(self, gateway: GatewayState, body: ChatCompletionRequest, request_id: str,
                 client_key: str | None) -> None:
        """`client_key`: the client's identity, whose cap the call counts
        against until the lease closes (None: no slot, for tests of the rest)."""
        self._gateway = gateway
        self._body = body
        self._request_id = request_id
        self._client_key = client_key
        self._slot: StreamSlot | None = None
        self._stream: EngineStream | None = None
        self._cancel_on_close = True
        self._closed = False

    @property
    def stream(self) -> EngineStream:
        if self._stream is None:
            raise RuntimeError("the lease is not open")
        return self._stream

    @property
    def client_key(self) -> str | None:
        """The identity that asked: it owns the call (and a stream or job built on it)."""
        return self._client_key

    @property
    def request_id(self) -> str:
        """The engine's id for the call once open (it may echo its own), else ours."""
        return self._stream.request_id if self._stream is not None else self._request_id

    def admit(self) -> None:
        """The checks on the request itself, for a surface that must refuse
        before it does anything else (and `open()` repeats them)."""
        gateway, body = self._gateway, self._body
        settings = gateway.settings
        gateway.broken_modes.admit(body.streamlab)
        if body.model is not None and body.model not in gateway.models:
            raise GatewayError(404, "model_not_found",
                               f"the model {body.model[:80]!r} does not exist; GET /v1/models "
                               "lists the ones served here", param="model")
        prompt_chars = sum(len(m.text) for m in body.messages)
        if prompt_chars > settings.max_prompt_chars:
            raise BadRequest("prompt_too_long", f"messages hold {prompt_chars} characters; "
                             f"the limit is {settings.max_prompt_chars}", param="messages")
        if gateway.drain.draining:
            raise GatewayError(503, DRAINING, "gateway is draining for a restart; retry shortly",
                               headers={"Retry-After": str(settings.retry_after_s)})

    async def open(self) -> EngineStream:
        self.admit()
        gateway = self._gateway
        if self._client_key is not None:
            self._slot = gateway.limiter.acquire(self._client_key)
        try:
            self._stream = await gateway.engine.open(self._body.to_engine_request(
                self._request_id))
        except BaseException as exc:
            self.close()
            if isinstance(exc, EngineError):
                gateway.metrics.engine_errors.labels(exc.code).inc()
            raise
        gateway.drain.track(self._stream)
        return self._stream

    def events(self) -> AsyncIterator[EngineEvent]:
        return self._gateway.broken_modes.apply(self, self._body.streamlab, self._counted())

    async def _counted(self) -> AsyncIterator[EngineEvent]:
        try:
            async for event in self.stream:
                yield event
        except EngineError as exc:
            self._gateway.metrics.engine_errors.labels(exc.code).inc()
            raise

    def abandon_call(self) -> None:
        """Leave the call running after close (only the detached broken mode does)."""
        self._cancel_on_close = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            if self._cancel_on_close:
                self._stream.cancel()
            self._gateway.drain.untrack(self._stream)
        if self._slot is not None:
            self._slot.release()

    async def __aenter__(self) -> EngineStream:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
