"""The gRPC servicer: validates requests, runs a backend, streams and counts.

A plain generation runs in its call's handler; a `detachable` one in a task of
its own that its call (and later any Attach) only reads (detached.py), so it
survives a caller that vanishes, until its orphan grace ends or a Cancel.
The multiplexed Session call (session.py) runs the same `generation` and
`attachment` work for each call it carries.

Cancellation: when the gateway cancels the call (its client left), grpc.aio
cancels this handler's task, so CancelledError surfaces at the backend's next
await (its next decode step), or closes the generator (GeneratorExit) if it
is parked at a `yield`. We record the cancel, let `finally` close the
generation, and re-raise: swallowing it would leave grpc thinking the handler
is still running. A done-callback marks the cancel too, for backends whose
decode loop lives in a thread and notices later than the event loop does.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import grpc

from services.common import tracing
from services.engine.admission import Admission
from services.engine.backends.base import (
    ACCEPTED,
    Accepted,
    Backend,
    BackendError,
    ChatMessage,
    GenerationInput,
    GenerationSummary,
    InvalidRequest,
    ObservesSteps,
    ToolCallPiece,
    ToolSpec,
)
from services.engine.detached import AttachRefused, Detachables, Replaced, Stopped
from services.engine.metrics import EngineMetrics
from services.engine.session import Accept, EngineSession, Health, Refused
from services.engine.settings import EngineSettings
from services.engine.stats import EngineStats, GenerationRecord
from services.engine.stop import MAX_STOP_CHARS, MAX_STOP_SEQUENCES, StopMatcher
from services.engine.tracing import AttachTrace, GenerationTrace
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from streamlab_protocol.generation import GenerationState


def to_generation_input(request: pb.GenerateRequest, settings: EngineSettings) -> GenerationInput:
    """Validate a wire request and fill in defaults; InvalidRequest names the bad field.
    Fields only one backend reads (the fake model's timing) are its `options()`."""
    if not request.prompt and not request.messages:
        raise InvalidRequest("one of `prompt` or `messages` is required")
    if request.max_tokens > settings.max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens={request.max_tokens} exceeds the limit {settings.max_tokens_limit}"
        )
    if len(request.stop) > MAX_STOP_SEQUENCES:
        raise InvalidRequest(f"stop: at most {MAX_STOP_SEQUENCES} sequences, "
                             f"got {len(request.stop)}")
    if any(not s or len(s) > MAX_STOP_CHARS for s in request.stop):
        raise InvalidRequest(f"stop: each sequence must be 1-{MAX_STOP_CHARS} characters")
    tools, forced = _tools(request)
    required = request.tool_choice.mode in (pb.TOOL_CHOICE_MODE_REQUIRED,
                                            pb.TOOL_CHOICE_MODE_FUNCTION)
    return GenerationInput(
        request_id=request.request_id or uuid.uuid4().hex,
        prompt=request.prompt,
        messages=tuple(ChatMessage(m.role, m.content) for m in request.messages),
        max_tokens=request.max_tokens or settings.max_tokens_limit,
        stop=tuple(request.stop),
        requested_max_tokens=request.max_tokens,
        tools=tools,
        forced_tool=forced,
        tool_required=required and bool(tools),
    )


MAX_TOOLS = 128  # OpenAI's own limit on `tools`


def _tools(request: pb.GenerateRequest) -> tuple[tuple[ToolSpec, ...], str | None]:
    """The offered tools the model may call (none under tool_choice NONE) and
    the one it must call; InvalidRequest names what is wrong."""
    if len(request.tools) > MAX_TOOLS:
        raise InvalidRequest(f"tools: at most {MAX_TOOLS}, got {len(request.tools)}")
    tools: list[ToolSpec] = []
    for i, tool in enumerate(request.tools):
        if not tool.name:
            raise InvalidRequest(f"tools.{i}.name is required")
        try:
            parameters = json.loads(tool.parameters_json) if tool.parameters_json else {}
        except ValueError:
            raise InvalidRequest(f"tools.{i}.parameters_json is not JSON") from None
        if not isinstance(parameters, dict):
            raise InvalidRequest(f"tools.{i}.parameters_json must be a JSON object")
        tools.append(ToolSpec(tool.name, tool.description, parameters))
    mode = request.tool_choice.mode
    if mode in (pb.TOOL_CHOICE_MODE_REQUIRED, pb.TOOL_CHOICE_MODE_FUNCTION) and not tools:
        raise InvalidRequest("tool_choice: requires tools")
    if mode == pb.TOOL_CHOICE_MODE_NONE:
        return (), None
    if mode == pb.TOOL_CHOICE_MODE_FUNCTION:
        name = request.tool_choice.function
        if name not in {tool.name for tool in tools}:
            raise InvalidRequest(f"tool_choice: no tool named {name[:80]!r} is offered")
        return tuple(tools), name
    return tuple(tools), None


def _refusal(exc: BackendError | Replaced | Stopped) -> Refused:
    """The status a generation's failure ends its call with: a backend error's
    own status; ABORTED when a newer Attach took the generation over; CANCELLED
    when an explicit Cancel stopped it."""
    if isinstance(exc, BackendError):
        return Refused(grpc.StatusCode[exc.status], f"{exc.code}: {exc.message}")
    if isinstance(exc, Replaced):
        return Refused(grpc.StatusCode.ABORTED, str(exc))
    return Refused(grpc.StatusCode.CANCELLED, str(exc))


class EngineServicer(pb_grpc.EngineServiceServicer):
    def __init__(self, backend: Backend[Any], stats: EngineStats, settings: EngineSettings,
                 metrics: EngineMetrics | None = None) -> None:
        self._backend = backend
        self._stats = stats
        self._settings = settings
        self._metrics = metrics = metrics or EngineMetrics()
        # A backend that runs fewer generations at once than the engine allows
        # (the hf backend: its batch size) sets the slots: the rest queue
        # here, visible in GetStats, and past the queue are refused before any
        # header, which the gateway turns into a 429.
        running = settings.max_running_generations
        if backend.max_concurrency is not None:
            running = min(running, backend.max_concurrency)
        self._admission = Admission(running, settings.max_queued_generations)
        self._detachables = Detachables(stats, settings.orphan_grace_s,
                                        settings.orphan_buffer_tokens)
        metrics.watch(stats, self._admission)
        self._health = Health()  # what Session calls tell the gateway (session.py)
        if isinstance(backend, ObservesSteps):
            backend.observe_steps(metrics.step)

    def set_serving(self, serving: bool, stopping: bool = False) -> None:
        """The engine's health changed (server.py): Sessions tell their callers,
        and once `stopping`, refuse new calls as the stopping server does."""
        self._health.set(serving, stopping)

    async def aclose(self) -> None:
        """Engine shutdown: stop the detachable generations (no caller runs them)."""
        await self._detachables.close()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        async def accept(request_id: str) -> None:
            await context.send_initial_metadata((("x-request-id", request_id),))

        def started(record: GenerationRecord) -> None:
            # The model runs in this handler's task: a dropped call cancels it.
            context.add_done_callback(lambda ctx: self._on_done(ctx, record))

        if tracing.tracer() is not None:
            _traceparent_from_metadata(request, context)
        try:
            async with aclosing(self.generation(request, accept, started)) as stream:
                async for message in stream:
                    yield message
        except Refused as exc:
            await context.abort(exc.status, exc.details)

    def generation(
        self, request: pb.GenerateRequest, accept: Accept,
        started: Callable[[GenerationRecord], None],
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """One Generate call's work, for whichever wire carries it: validate,
        admit, run (a detachable generation in a task of its own), yield its
        events; Refused is the status the call ends with. `started` is told the
        record of a plain (not detachable) generation, which runs in the task
        that iterates this: cancelling that task is the cancel. Tracing on,
        the same work inside its span (services/engine/tracing.py)."""
        tracer = tracing.tracer()
        if tracer is None:
            return self._generation(request, accept, started, None)
        return self._traced_generation(tracer, request, accept, started)

    async def _traced_generation(
        self, tracer: tracing.ServiceTracer, request: pb.GenerateRequest, accept: Accept,
        started: Callable[[GenerationRecord], None],
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        trace = GenerationTrace(tracer, request.traceparent, request.request_id,
                                request.detachable)
        token = tracing.log_context.set((request.request_id, tracing.trace_id_hex(trace.span)))

        async def traced_accept(request_id: str) -> None:
            trace.accepted()
            await accept(request_id)

        try:
            async with aclosing(self._generation(request, traced_accept, started,
                                                 trace)) as stream:
                async for message in stream:
                    yield message
        except Refused as exc:
            trace.span.set_attribute("streamlab.refused", exc.status.name)
            raise
        finally:
            if not trace.events_started:  # refused, or gone before its slot
                trace.end("refused")
            tracing.log_context.reset(token)

    async def _generation(
        self, request: pb.GenerateRequest, accept: Accept,
        started: Callable[[GenerationRecord], None], trace: GenerationTrace | None,
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        try:
            generation = to_generation_input(request, self._settings)
            options = self._backend.options(request)
            if generation.tools and not self._backend.calls_tools:
                raise InvalidRequest(f"tools: the {self._backend.name} backend does not "
                                     "call tools")
            if generation.tools and request.detachable:
                raise InvalidRequest("tools: a detachable generation streams tokens only")
        except InvalidRequest as exc:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if request.detachable and generation.request_id in self._detachables:
            raise Refused(grpc.StatusCode.ALREADY_EXISTS,
                          f"a detachable generation {generation.request_id!r} is already "
                          "held here: Attach to it, or Cancel it first")
        if self._admission.full():
            # Refused before anything started: no record, no slot, no tokens.
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, self._admission.describe())
        # Accepted now, before any queueing and the (possibly long) prefill: the
        # gateway learns that the engine accepted the call and can commit to a 200.
        # A backend that defers acceptance says when (an upstream's 200), unless
        # the call must first wait for a slot here: waiting is accepting.
        accepted = not self._backend.defers_acceptance or self._admission.would_wait()
        if accepted:
            await accept(generation.request_id)
        queued_at = asyncio.get_running_loop().time()
        await self._admission.acquire()  # queued here; a cancel leaves the queue
        self._metrics.queue_wait.observe(asyncio.get_running_loop().time() - queued_at)
        if trace is not None:
            trace.admitted()
        if request.detachable and generation.request_id in self._detachables:
            # The same id started while this call waited for its slot.
            self._admission.release()
            raise Refused(grpc.StatusCode.ALREADY_EXISTS,
                          f"a detachable generation {generation.request_id!r} is "
                          "already held here")
        record = self._stats.begin(
            generation.request_id, request.sampling if request.HasField("sampling") else None)
        # The events' `finally` frees the slot and ends the record, whoever runs them.
        events = self._events(generation, options, record, request.accept_token_batches,
                              trace)
        if trace is not None:
            trace.events_started = True  # the events' `finally` ends the span
        messages: AsyncGenerator[pb.GenerateResponse | Accepted, None]
        if request.detachable:
            # Its own task runs the generation; this call is only its first
            # consumer, and its end without a Cancel orphans it (detached.py).
            held = self._detachables.start(generation.request_id, record, events,
                                           lambda: self._never_ran(record))
            messages = held.follow(held.attach(None), request.accept_token_batches,
                                   announce=True)
        else:
            started(record)
            messages = events
        async with aclosing(messages) as stream:
            try:
                async for message in stream:
                    if isinstance(message, Accepted):
                        if not accepted:
                            await accept(generation.request_id)
                            accepted = True
                        continue
                    yield message
            except (BackendError, Replaced, Stopped) as exc:  # BackendError: before the first token
                raise _refusal(exc) from None

    async def Attach(
        self, request: pb.AttachRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        async def accept(request_id: str) -> None:
            await context.send_initial_metadata((("x-request-id", request_id),))

        if tracing.tracer() is not None:
            _traceparent_from_metadata(request, context)
        try:
            async with aclosing(self.attachment(request, accept)) as stream:
                async for message in stream:
                    yield message
        except Refused as exc:
            await context.abort(exc.status, exc.details)

    def attachment(
        self, request: pb.AttachRequest, accept: Accept
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """One Attach call's work, for whichever wire carries it (as `generation`)."""
        after = request.after_index if request.HasField("after_index") else None
        tracer = tracing.tracer()
        if tracer is None:
            return self._attachment(request, accept, after, None)
        return self._traced_attachment(
            request, accept, after,
            AttachTrace(tracer, request.traceparent, request.request_id, after))

    async def _traced_attachment(
        self, request: pb.AttachRequest, accept: Accept, after: int | None, trace: AttachTrace
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        state = "refused"
        try:
            async with aclosing(self._attachment(request, accept, after, trace)) as stream:
                async for message in stream:
                    yield message
            state = "completed"
        except (asyncio.CancelledError, GeneratorExit):
            state = "detached"
            raise
        finally:
            trace.end(state)

    async def _attachment(
        self, request: pb.AttachRequest, accept: Accept, after: int | None,
        trace: AttachTrace | None,
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        try:
            held, attachment = self._detachables.attach(request.request_id, after)
        except AttachRefused as exc:
            raise Refused(grpc.StatusCode[exc.status], exc.message) from None
        try:
            await accept(held.request_id)
        except BaseException:
            held.release(attachment)  # gone before its stream began: orphaned again
            raise
        if trace is not None:
            trace.accepted()
        async with aclosing(held.follow(attachment, request.accept_token_batches)) as stream:
            try:
                async for message in stream:
                    if isinstance(message, pb.GenerateResponse):
                        yield message
            except (BackendError, Replaced, Stopped) as exc:
                raise _refusal(exc) from None

    async def Session(
        self, request_iterator: AsyncIterator[pb.SessionRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.SessionEvent]:
        """The multiplexed wire (services/engine/session.py)."""
        session = EngineSession(self, self._stats, self._health)
        self._stats.sessions_open += 1  # which wire a lab's gateways speak, seen from here
        try:
            async with aclosing(session.run(request_iterator)) as events:
                async for event in events:
                    yield event
        finally:
            self._stats.sessions_open -= 1

    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelResponse:
        held = self._detachables.get(request.request_id)
        return pb.CancelResponse(cancelled=held is not None and held.stop())

    async def _events(
        self, generation: GenerationInput, options: Any, record: GenerationRecord, batches: bool,
        trace: GenerationTrace | None = None,
    ) -> AsyncGenerator[pb.GenerateResponse | Accepted, None]:
        """One generation's messages: ACCEPTED once the backend accepted it, its
        tokens, then one finish (or error event); BackendError if it fails before
        its first token. Closing it early is a cancel. Its `finally` frees the
        slot and ends the record, so it must be closed (aclosing) by its runner."""
        state = GenerationState.FAILED
        produced = 0
        summary: GenerationSummary | None = None
        stop = StopMatcher(generation.stop)
        stopped = False
        unsent = 0
        announced = False
        called_tools = False
        try:
            # aclosing: the backend's own `finally` (freeing a KV cache, closing an
            # upstream HTTP stream) runs now on every exit, not when GC gets to it.
            async with aclosing(self._backend.generate(generation, options, record)) as items:
                async for item in items:
                    if not announced:
                        announced = True
                        yield ACCEPTED
                    if isinstance(item, Accepted):
                        continue
                    if isinstance(item, GenerationSummary):
                        summary = item
                        continue
                    if isinstance(item, ToolCallPiece):
                        # Arguments are JSON, not prose: stop sequences do not apply.
                        called_tools = True
                        yield pb.GenerateResponse(tool_call=pb.ToolCallDelta(
                            index=item.index, id=item.id, name=item.name,
                            arguments=item.arguments))
                        continue
                    texts = item if isinstance(item, list) else (item,)
                    chunks: list[pb.TokenChunk] = []
                    for taken, text in enumerate(texts, 1):
                        fed = stop.feed(text)
                        if fed.text:
                            chunks.append(pb.TokenChunk(index=produced, text=fed.text))
                            produced += 1
                        if fed.stopped:
                            stopped = True
                            unsent = len(texts) - taken  # made with the batch, past the stop
                            break
                    if trace is not None and chunks:
                        trace.first_token()
                    # Tokens that were ready together leave in one message, to a
                    # caller that reads them.
                    if len(chunks) > 1 and batches:
                        yield pb.GenerateResponse(tokens=pb.TokenBatch(chunks=chunks))
                    else:
                        for chunk in chunks:
                            yield pb.GenerateResponse(token=chunk)
                    if stopped:
                        # Leaving the loop closes the backend (aclosing): it
                        # stops at this step, as on a cancel, minus the cancel.
                        break
            if not stopped and (rest := stop.flush()):
                yield pb.GenerateResponse(token=pb.TokenChunk(index=produced, text=rest))
                produced += 1
            if summary is None or stopped:
                # Counted from the model's decode steps, not from the chunks sent:
                # held-back text can leave as one chunk for several tokens, and a
                # stop ends the loop before a backend's own summary arrives.
                made = record.tokens_generated - unsent
                by_length = (not stopped and
                             self._backend.finished_by_length(generation, options, made))
                summary = GenerationSummary(
                    prompt_tokens=_prompt_tokens(generation),
                    completion_tokens=made,
                    finished_by_length=by_length,
                )
            reason = (pb.FINISH_REASON_TOOL_CALLS if called_tools
                      else pb.FINISH_REASON_LENGTH if summary.finished_by_length
                      else pb.FINISH_REASON_STOP)
            state = GenerationState.COMPLETED
            yield pb.GenerateResponse(
                finish=pb.Finish(
                    reason=reason,
                    usage=pb.Usage(prompt_tokens=summary.prompt_tokens,
                                   completion_tokens=summary.completion_tokens),
                )
            )
        except (asyncio.CancelledError, GeneratorExit):
            # CancelledError when the cancel lands in an await (a decode step);
            # GeneratorExit when the runner closes this generator while it is
            # parked at a `yield`. Both mean the generation is stopped. Unless the
            # finish event had already gone out: a caller that cancels instead of
            # waiting for the trailers (a gateway done with the stream) cancelled
            # nothing.
            if state is not GenerationState.COMPLETED:
                self._stats.mark_cancel(record)
                state = GenerationState.CANCELLED
                if trace is not None:
                    trace.cancelled("call_cancelled" if not record.cancel_seen else "cancelled")
            raise
        except BackendError as exc:
            if produced == 0 and not called_tools:
                raise  # the caller gets it as a gRPC status
            yield pb.GenerateResponse(error=pb.StreamError(code=exc.code, message=exc.message))
        finally:
            self._admission.release()
            self._stats.end(record, state)
            if trace is not None:
                trace.end(state.name.lower(), record)

    async def GetStats(
        self, request: pb.GetStatsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStatsResponse:
        stats = self._stats
        return pb.GetStatsResponse(
            backend=self._backend.name,
            tokens_generated=stats.tokens_generated,
            generations_active=stats.active,
            generations_started=stats.started,
            generations_completed=stats.completed,
            generations_cancelled=stats.cancelled,
            generations_failed=stats.failed,
            tokens_after_cancel=stats.tokens_after_cancel,
            generations=[_record_to_pb(r) for r in stats.records(request.request_id)],
            load=self._load(),
            generations_orphaned=stats.orphaned,
            generations_reattached=stats.reattached,
            generations_orphan_expired=stats.orphan_expired,
        )

    def _load(self) -> pb.EngineLoad:
        admission, backend = self._admission, self._backend.load()
        return pb.EngineLoad(
            running=admission.running, running_limit=admission.running_limit,
            queue_waiting=admission.waiting, queue_limit=admission.queued_limit,
            device=backend.device, device_memory_allocated=backend.device_memory_allocated,
            decode_steps=backend.decode_steps, decode_step_tokens=backend.decode_step_tokens,
        )

    def _never_ran(self, record: GenerationRecord) -> None:
        # A detachable generation stopped before its task began: still a cancel.
        self._stats.mark_cancel(record)
        self._admission.release()
        self._stats.end(record, GenerationState.CANCELLED)

    def _on_done(self, context: grpc.aio.ServicerContext, record: GenerationRecord) -> None:
        if context.cancelled():
            self._stats.mark_cancel(record)


def _traceparent_from_metadata(request: pb.GenerateRequest | pb.AttachRequest,
                               context: grpc.aio.ServicerContext) -> None:
    """A Generate or Attach call carries the caller's trace context as its
    `traceparent` metadata; the work below reads it from the request, as the
    multiplexed wire carries it."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent" and isinstance(value, str):
            request.traceparent = value
            return


def _prompt_tokens(generation: GenerationInput) -> int:
    text = generation.prompt or " ".join(m.content for m in generation.messages)
    return len(text.split())


def _record_to_pb(record: GenerationRecord) -> pb.GenerationRecord:
    return pb.GenerationRecord(
        request_id=record.request_id,
        state=record.state.to_wire(),
        tokens_generated=record.tokens_generated,
        tokens_after_cancel=record.tokens_after_cancel,
        sampling=record.sampling,
        started_at=record.started_at,
        cancelled_at=record.cancelled_at,
        ended_at=record.ended_at,
    )
