"""The engine's spans (tracing on only: services/common/tracing.py).

`GenerationTrace` is one generation's span, `engine generate`, a child of the
gateway's stream span (its `traceparent`: the Generate call's metadata, or the
request's field on the multiplexed Session). Everything on it is noted at
moments the servicer already passes (no hook per token):

    events      accepted (the call's headers: the gateway may answer 200),
                admitted (a slot: the queue is behind it), first_token (its
                first token handed to the wire), cancel (with its reason),
                end
    attributes  streamlab.request_id, streamlab.detachable,
                streamlab.queue_wait_s (arrival to slot), streamlab.prefill_s
                (slot to first token), streamlab.first_token_s (arrival to
                first token), streamlab.tokens, streamlab.state (completed,
                cancelled, failed, refused), streamlab.cancel_reason,
                streamlab.tokens_after_cancel

`AttachTrace`: an Attach (a gateway re-attaching to a detachable generation),
`engine attach`, with the index it resumed after.
"""

from __future__ import annotations

import logging

from services.common.tracing import ServiceTracer, now_ns, trace_id_hex
from services.engine.stats import GenerationRecord

log = logging.getLogger("streamlab.engine.generation")


class GenerationTrace:
    __slots__ = ("_admitted_ns", "_arrived_ns", "_ended", "_first_ns", "events_started",
                 "request_id", "span")

    def __init__(self, tracer: ServiceTracer, traceparent: str, request_id: str,
                 detachable: bool, name: str = "engine generate") -> None:
        self._arrived_ns = now_ns()
        self.span = tracer.start(name, traceparent or None, start_ns=self._arrived_ns,
                                 attributes={"streamlab.request_id": request_id,
                                             "streamlab.detachable": detachable})
        self.request_id = request_id
        self._admitted_ns = 0
        self._first_ns = 0
        self._ended = False
        # Set once the generation's events run: they end the span (a detachable
        # generation's run outlives the call that started it).
        self.events_started = False

    def accepted(self) -> None:
        if not self._ended:
            self.span.add_event("accepted")

    def admitted(self) -> None:
        self._admitted_ns = now_ns()
        self.span.add_event("admitted", timestamp=self._admitted_ns)
        self.span.set_attribute("streamlab.queue_wait_s",
                                (self._admitted_ns - self._arrived_ns) / 1e9)

    def first_token(self) -> None:
        if self._first_ns or self._ended:
            return
        self._first_ns = now_ns()
        self.span.add_event("first_token", timestamp=self._first_ns)
        self.span.set_attribute("streamlab.first_token_s",
                                (self._first_ns - self._arrived_ns) / 1e9)
        if self._admitted_ns:
            self.span.set_attribute("streamlab.prefill_s",
                                    (self._first_ns - self._admitted_ns) / 1e9)

    def cancelled(self, reason: str) -> None:
        if not self._ended:
            self.span.add_event("cancel", attributes={"reason": reason})
            self.span.set_attribute("streamlab.cancel_reason", reason)

    def end(self, state: str, record: GenerationRecord | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        attributes: dict[str, str | int] = {"streamlab.state": state}
        if record is not None:
            attributes["streamlab.tokens"] = record.tokens_generated
            attributes["streamlab.tokens_after_cancel"] = record.tokens_after_cancel
        self.span.set_attributes(attributes)
        self.span.add_event("end", attributes={"state": state})
        self.span.end()
        log.info("generation %s: %s tokens", state, attributes.get("streamlab.tokens", "-"),
                 extra={"request_id": self.request_id, "trace_id": trace_id_hex(self.span)})


class AttachTrace(GenerationTrace):
    def __init__(self, tracer: ServiceTracer, traceparent: str, request_id: str,
                 after_index: int | None) -> None:
        super().__init__(tracer, traceparent, request_id, True, name="engine attach")
        self.span.set_attribute("streamlab.resume.after_index",
                                -1 if after_index is None else after_index)
