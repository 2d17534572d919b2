"""The gateway's span per stream (tracing on only: services/common/tracing.py).

`StreamTrace` is one engine lease's span, `gateway <surface>`: a child of the
client's `traceparent` (through every proxy, untouched), or the root of a new
trace. Its context goes to the engine with the call (metadata on a Generate
call, the request's `traceparent` field on the multiplexed Session), so the
engine's generation span is its child. What a streaming investigation needs
is on it:

    attributes  streamlab.request_id, streamlab.transport (sse, json, resume,
                ws, poll, ...), streamlab.resume.attach (open | attach |
                reattach), streamlab.engine_wire, streamlab.heartbeats,
                streamlab.tokens, streamlab.outcome (completed, client_left,
                closed, refused), streamlab.reattaches
    events      engine.accepted, first_token (read from the engine), heartbeat
                (the first MAX_HEARTBEAT_EVENTS), client_left, reattach, closed

`TracedStreamTimings` is the metrics' per-stream clock with the first token
and the token count noted for the span: no other hook per token.
"""

from __future__ import annotations

import logging

from services.common.tracing import ServiceTracer, now_ns, trace_id_hex, traceparent_of
from services.gateway.metrics import StreamTimings, SurfaceTimings

MAX_HEARTBEAT_EVENTS = 100
log = logging.getLogger("streamlab.gateway.stream")


class StreamTrace:
    __slots__ = ("_ended", "child", "heartbeats", "request_id", "span", "tokens", "trace_id")

    def __init__(self, tracer: ServiceTracer, surface: str, traceparent: str | None,
                 request_id: str, attach: str, engine_wire: str) -> None:
        self.span = tracer.start(f"gateway {surface}", traceparent, attributes={
            "streamlab.request_id": request_id, "streamlab.transport": surface,
            "streamlab.resume.attach": attach, "streamlab.engine_wire": engine_wire})
        self.child = traceparent_of(self.span)  # what the engine call carries
        self.trace_id = trace_id_hex(self.span)
        self.request_id = request_id
        self.heartbeats = 0
        self.tokens = 0
        self._ended = False

    def event(self, name: str, **attributes: str | int | float | bool) -> None:
        if not self._ended:
            self.span.add_event(name, attributes=attributes or None)

    def set(self, key: str, value: str | int | float | bool) -> None:
        if not self._ended:
            self.span.set_attribute(key, value)

    def heartbeat(self) -> None:
        self.heartbeats += 1
        if self.heartbeats <= MAX_HEARTBEAT_EVENTS:
            self.event("heartbeat", n=self.heartbeats)

    def first_token(self, at_ns: int) -> None:
        if not self._ended:
            self.span.add_event("first_token", timestamp=at_ns)

    def end(self, outcome: str) -> None:
        if self._ended:
            return
        self.span.set_attributes({"streamlab.outcome": outcome,
                                  "streamlab.heartbeats": self.heartbeats,
                                  "streamlab.tokens": self.tokens})
        self.span.add_event("closed", attributes={"outcome": outcome})
        self._ended = True
        self.span.end()
        # One line a stream, with its ids (JSON logs: services/common/tracing.py).
        log.info("stream %s: %d tokens, %d heartbeats", outcome, self.tokens, self.heartbeats,
                 extra={"request_id": self.request_id, "trace_id": self.trace_id})

    def headers(self) -> dict[str, str]:
        """The response's `traceresponse` (W3C Trace Context level 2): the trace
        this request joined, for a proxy's log and a client that sent none."""
        return {"traceresponse": self.child}


class TracedStreamTimings(StreamTimings):
    __slots__ = ("_trace",)

    def __init__(self, surface: SurfaceTimings, opened_at: float, trace: StreamTrace) -> None:
        super().__init__(surface, opened_at)
        self._trace = trace

    def tokens(self, at: float, count: int) -> None:
        if self._last == 0.0:
            self._trace.first_token(now_ns())
        self._trace.tokens += count
        super().tokens(at, count)
