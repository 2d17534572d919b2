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
                      EngineError), with the request's broken modes applied
                      (services/gateway/broken_modes.py); the stream's own
                      hooks count its errors and time its tokens
                      (services/gateway/metrics.py), no wrapper per token
    lease.close()   stop the generation (a detachable one by the engine's
                      explicit Cancel, then its call; any other by cancelling the
                      call), untrack it, free the slot: synchronous and
                      idempotent, so it can run on every exit path, including a
                      `finally` inside a cancelled task

A request that owns its call uses `async with lease:`. A surface whose call
outlives the request (resume, polling) opens the lease in the request, so
refusals are HTTP statuses, and hands it to the task that owns the call from
then on, which closes it when the generation ends.

A lease is handed what it uses of the running gateway (`LeaseGateway`, which
state.py's GatewayState is), not the state itself: it imports nothing that
holds it (pyproject.toml's import contract keeps it so).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from time import monotonic
from types import TracebackType
from typing import Protocol

from services.common import tracing
from services.gateway.admission import SetupAdmission
from services.gateway.broken_modes import BrokenModes
from services.gateway.drain import DRAINING, Drain
from services.gateway.engine_client import Engine, EngineEvent, EngineStream
from services.gateway.errors import BadRequest, EngineError, GatewayError
from services.gateway.limits import StreamLimiter, StreamSlot
from services.gateway.metrics import GatewayMetrics, StreamTimings
from services.gateway.openai_api import TOOL_SURFACES, ChatCompletionRequest
from services.gateway.settings import GatewaySettings
from services.gateway.shared_caps import SharedCaps, SharedSlot
from services.gateway.tracing import StreamTrace, TracedStreamTimings


class LeaseGateway(Protocol):
    """What a lease uses of the running gateway (state.py's GatewayState is one)."""

    @property
    def settings(self) -> GatewaySettings:
        """max_prompt_chars, retry_after_s, engine_wire (the span's tag)."""
        ...

    @property
    def models(self) -> frozenset[str]: ...

    @property
    def broken_modes(self) -> BrokenModes: ...

    @property
    def drain(self) -> Drain: ...

    @property
    def limiter(self) -> StreamLimiter: ...

    @property
    def shared_caps(self) -> SharedCaps | None: ...

    @property
    def admission(self) -> SetupAdmission: ...

    @property
    def metrics(self) -> GatewayMetrics:
        """engine_errors, and each surface's latency histograms."""
        ...

    @property
    def engine(self) -> Engine: ...


class EngineLease:
    def __init__(self, gateway: LeaseGateway, body: ChatCompletionRequest | None,
                 request_id: str, client_key: str | None, surface: str = "sse",
                 detachable: bool = False, traceparent: str | None = None) -> None:
        """`client_key`: the client's identity, whose cap the call counts
        against until the lease closes (None: no slot, for tests of the rest).
        `surface`: the label of its latency histograms (sse, json, resume, ...).
        `detachable`: the generation outlives its call (for re-attach by another
        replica, services/gateway/resume/redis_store.py). `body` None: a lease that only
        re-attaches (`attach()`). `traceparent`: the client's trace context
        (tracing on only: the lease's span is its child, services/gateway/tracing.py)."""
        self._gateway = gateway
        self._body = body
        self._detachable = detachable
        self._request_id = request_id
        self._client_key = client_key
        self._slot: StreamSlot | None = None
        self._shared_slot: SharedSlot | None = None
        self._stream: EngineStream | None = None
        self._cancel_on_close = True
        self._closed = False
        self._surface = surface
        self._timings: StreamTimings | None = None
        self._client_left_at = 0.0  # monotonic s; 0: the client has not left
        self._traceparent = traceparent
        # The stream's span; None with tracing off (the only cost then: this test).
        self.trace: StreamTrace | None = None

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
        if body is None:
            raise RuntimeError("a lease without a request only re-attaches")
        settings = gateway.settings
        gateway.broken_modes.admit(body.streamlab)
        if body.model is not None and body.model not in gateway.models:
            raise GatewayError(404, "model_not_found",
                               f"the model {body.model[:80]!r} does not exist; GET /v1/models "
                               "lists the ones served here", param="model")
        if body.tools and self._surface not in TOOL_SURFACES:
            raise BadRequest("unsupported_parameter", "tools: only /v1/chat/completions "
                             "streams tool calls", param="tools")
        prompt_chars = sum(len(m.text) for m in body.messages)
        if prompt_chars > settings.max_prompt_chars:
            raise BadRequest("prompt_too_long", f"messages hold {prompt_chars} characters; "
                             f"the limit is {settings.max_prompt_chars}", param="messages")
        if gateway.drain.draining:
            raise GatewayError(503, DRAINING, "gateway is draining for a restart; retry shortly",
                               headers={"Retry-After": str(settings.retry_after_s)})

    async def open(self) -> EngineStream:
        opened_at = monotonic()
        self.admit()
        assert self._body is not None  # admit() refuses a lease without one
        gateway = self._gateway
        if self._client_key is not None:
            self._slot = gateway.limiter.acquire(self._client_key)
        request = self._body.to_engine_request(self._request_id)
        request.detachable = self._detachable
        if (tracer := tracing.tracer()) is not None:
            self._start_trace(tracer, "open")
            assert self.trace is not None
            request.traceparent = self.trace.child
        try:
            if self._client_key is not None and gateway.shared_caps is not None:
                self._shared_slot = await gateway.shared_caps.acquire(self._client_key)
            # Its turn to be set up (services/gateway/admission.py), holding its slot.
            await gateway.admission.wait()
            self._stream = await gateway.engine.open(request)
        except BaseException as exc:
            self.close()
            if isinstance(exc, EngineError):
                gateway.metrics.engine_errors.labels(exc.code).inc()
            raise
        self._opened(opened_at)
        return self._stream

    def _start_trace(self, tracer: tracing.ServiceTracer, attach: str) -> None:
        traceparent = self._traceparent or tracing.incoming_traceparent.get()
        self.trace = StreamTrace(tracer, self._surface, traceparent, self._request_id,
                                 attach, self._gateway.settings.engine_wire)
        tracing.log_context.set((self._request_id, self.trace.trace_id))

    def _opened(self, opened_at: float) -> None:
        gateway = self._gateway
        assert self._stream is not None
        gateway.drain.track(self._stream)
        surface = gateway.metrics.surface(self._surface)
        self._timings = (StreamTimings(surface, opened_at) if self.trace is None
                         else TracedStreamTimings(surface, opened_at, self.trace))
        self._stream.timings = self._timings
        self._stream.on_error = self._engine_failed
        if self.trace is not None:
            self.trace.event("engine.accepted")

    async def _engine_attach(self, request_id: str, after_index: int | None) -> EngineStream:
        engine = self._gateway.engine
        if self.trace is None:
            return await engine.attach(request_id, after_index)
        return await engine.attach(request_id, after_index, traceparent=self.trace.child)

    def trace_headers(self) -> dict[str, str]:
        """`traceresponse` for the response, tracing on; else none."""
        return self.trace.headers() if self.trace is not None else {}

    async def attach(self, after_index: int | None) -> EngineStream:
        """Re-attach to a detachable generation whose caller (another replica)
        is gone, from the token after `after_index`. No admission and no slot:
        the generation was admitted when it started, and refusing it now would
        lose it; EngineError (404) when the engine no longer holds it."""
        opened_at = monotonic()
        gateway = self._gateway
        if (tracer := tracing.tracer()) is not None:
            self._start_trace(tracer, "attach")
            if after_index is not None and self.trace is not None:
                self.trace.set("streamlab.resume.after_index", after_index)
        try:
            self._stream = await self._engine_attach(self._request_id, after_index)
        except BaseException as exc:
            self.close()
            if isinstance(exc, EngineError):
                gateway.metrics.engine_errors.labels(exc.code).inc()
            raise
        self._opened(opened_at)
        return self._stream

    @property
    def detachable(self) -> bool:
        return self._detachable or self._body is None  # a re-attach lease is too

    async def reattach(self, after_index: int | None) -> EngineStream:
        """Attach again to this lease's generation after its call dropped (an
        engine-hop blip): the slot and the timings stay; the dead call leaves
        the drain's tracking and the new one joins it. EngineError if the
        engine cannot be reached yet or no longer holds the generation."""
        if self._closed:
            raise RuntimeError("the lease is closed")
        gateway = self._gateway
        old = self._stream
        if self.trace is not None:
            self.trace.event("reattach", after_index=-1 if after_index is None else after_index)
        stream = await self._engine_attach(self.request_id, after_index)
        if self._closed:  # stopped while the attach was in flight: stop this one too
            stream.stop()
            raise EngineError(503, "cancelled", "the stream was stopped during a re-attach")
        if old is not None:
            old.cancel()
            gateway.drain.untrack(old)
        gateway.drain.track(stream)
        stream.timings = self._timings
        stream.on_error = self._engine_failed
        self._stream = stream
        return stream

    def events(self) -> AsyncIterator[EngineEvent]:
        options = self._body.streamlab if self._body is not None else None
        return self._gateway.broken_modes.apply(self, options, self.stream.__aiter__())

    def _engine_failed(self, exc: EngineError) -> None:
        self._gateway.metrics.engine_errors.labels(exc.code).inc()

    def client_left(self) -> None:
        """The client went away (its disconnect arrived): the close that follows
        times the cancel from here."""
        if self._client_left_at == 0.0:
            self._client_left_at = monotonic()
            if self.trace is not None:
                self.trace.event("client_left")

    def abandon_call(self) -> None:
        """Leave the call running after close (only the detached broken mode does)."""
        self._cancel_on_close = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            stream = self._stream
            if self._cancel_on_close:
                # stop(), not cancel(): a detachable generation outlives a
                # dropped call, and an explicit stop must still stop it at once.
                stream.stop()
            self._gateway.drain.untrack(stream)
            if self._timings is not None:
                now = monotonic()
                self._timings.closed(now)
                if self._client_left_at and self._cancel_on_close and not stream.ended:
                    self._timings.cancelled(self._client_left_at, now)
        if self._slot is not None:
            self._slot.release()
        if self._shared_slot is not None:
            self._shared_slot.release()
        if self.trace is not None:
            self.trace.end(self._outcome())

    def _outcome(self) -> str:
        """How the stream ended, for its span."""
        stream = self._stream
        if stream is None:
            return "refused"
        if stream.ended:
            return "completed"
        if self._client_left_at:
            return "client_left"
        return "closed"

    async def __aenter__(self) -> EngineStream:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
