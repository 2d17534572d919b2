"""EngineStream: a batch message is yielded chunk by chunk (with `pending`
counting down, and counting what a call already holds), and its one re-armed
timer keeps both deadlines: the idle one bounds reads only, never the
consumer's time at `yield`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from services.gateway.engine_client import EngineStream
from services.gateway.errors import EngineError
from streamlab_protocol.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.anyio


class QueuedCall:
    """Answers reads from a queue; `cancel()` behaves as grpc.aio's: the
    waiting reader gets CancelledError."""

    def __init__(self, *responses: pb.GenerateResponse) -> None:
        self.queue: asyncio.Queue[pb.GenerateResponse] = asyncio.Queue()
        for response in responses:
            self.queue.put_nowait(response)
        self.cancelled = asyncio.Event()

    async def read(self) -> object:
        get = asyncio.ensure_future(self.queue.get())
        cancelled = asyncio.ensure_future(self.cancelled.wait())
        await asyncio.wait({get, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        cancelled.cancel()
        if self.cancelled.is_set():
            get.cancel()
            raise asyncio.CancelledError
        return get.result()

    def cancel(self) -> bool:
        self.cancelled.set()
        return True


def token(index: int) -> pb.GenerateResponse:
    return pb.GenerateResponse(token=pb.TokenChunk(index=index, text=f"t{index} "))


FINISH = pb.GenerateResponse(finish=pb.Finish(reason=pb.FINISH_REASON_STOP))


async def test_a_batch_is_yielded_chunk_by_chunk_with_what_is_still_pending() -> None:
    batch = pb.GenerateResponse(tokens=pb.TokenBatch(
        chunks=[pb.TokenChunk(index=i, text=f"t{i} ") for i in (1, 2, 3)]))
    stream = EngineStream(QueuedCall(token(0), batch, token(4), FINISH), "r", 5.0, 60.0)
    seen: list[tuple[str, int]] = []
    async for event in stream:
        if isinstance(event, pb.TokenChunk):
            seen.append((event.text, stream.pending))
    assert seen == [("t0 ", 0), ("t1 ", 2), ("t2 ", 1), ("t3 ", 0), ("t4 ", 0)]


class HoldingCall(QueuedCall):
    """A call that says how many events it holds already (as a MuxCall does
    for the items of one SessionEvent)."""

    def queued(self) -> int:
        return self.queue.qsize()


async def test_pending_counts_the_events_a_call_already_holds() -> None:
    """Broken: a mux call's last token counted as alone, so it leaves in its
    own write before the finish that came with it."""
    stream = EngineStream(HoldingCall(token(0), token(1), FINISH), "r", 5.0, 60.0)
    seen: list[tuple[str, int]] = []
    async for event in stream:
        seen.append((event.text if isinstance(event, pb.TokenChunk) else "finish",
                     stream.pending))
    assert seen == [("t0 ", 2), ("t1 ", 1), ("finish", 0)]


async def test_a_silent_engine_trips_the_idle_deadline() -> None:
    call = QueuedCall(token(0))
    stream = EngineStream(call, "r", 0.05, 60.0)
    texts: list[str] = []

    async def read_all() -> None:
        async for event in stream:
            assert isinstance(event, pb.TokenChunk)
            texts.append(event.text)

    with pytest.raises(EngineError) as caught:
        await read_all()
    assert caught.value.code == "engine_idle_timeout"
    assert texts == ["t0 "]
    assert call.cancelled.is_set()


async def test_a_consumer_slower_than_the_idle_deadline_is_not_an_idle_engine() -> None:
    # Every token is waiting in the call already; the consumer sits on each
    # one for three idle deadlines (a slow client's send).
    stream = EngineStream(QueuedCall(token(0), token(1), token(2), FINISH), "r", 0.02, 60.0)
    events = [event async for event in _slowly(stream, 0.06)]
    assert isinstance(events[-1], pb.Finish)
    assert len(events) == 4


async def test_the_total_deadline_ends_a_stream_that_keeps_sending() -> None:
    call = QueuedCall()
    stream = EngineStream(call, "r", 5.0, 0.1)

    async def engine() -> None:
        index = 0
        while not call.cancelled.is_set():
            call.queue.put_nowait(token(index))
            index += 1
            await asyncio.sleep(0.01)

    feeder = asyncio.create_task(engine())
    try:
        with pytest.raises(EngineError) as caught:
            async for _ in stream:
                pass
    finally:
        feeder.cancel()
    assert caught.value.code == "stream_deadline"


async def test_a_cancel_with_a_reason_still_names_it() -> None:
    call = QueuedCall(token(0))
    stream = EngineStream(call, "r", 5.0, 60.0)
    async def cancel_after_the_first() -> None:
        async for _ in stream:
            stream.cancel("server_draining")

    with pytest.raises(EngineError) as caught:
        await cancel_after_the_first()
    assert caught.value.code == "server_draining"


async def _slowly(stream: EngineStream, hold_s: float
                  ) -> AsyncIterator[pb.TokenChunk | pb.ToolCallDelta | pb.Finish]:
    async for event in stream:
        await asyncio.sleep(hold_s)
        yield event


class RecordedTimings:
    def __init__(self) -> None:
        self.messages: list[int] = []

    def tokens(self, at: float, count: int) -> None:
        self.messages.append(count)


async def test_the_error_hook_sees_each_failure_once_and_timings_see_each_message() -> None:
    """The hooks that replaced the lease's counting wrapper: a batch is one
    message of three tokens, and the error the consumer gets is the one counted."""
    batch = pb.GenerateResponse(tokens=pb.TokenBatch(
        chunks=[pb.TokenChunk(index=i, text=f"t{i} ") for i in (1, 2, 3)]))
    failure = pb.GenerateResponse(error=pb.StreamError(code="model_crashed", message="boom"))
    stream = EngineStream(QueuedCall(token(0), batch, failure), "r", 5.0, 60.0)
    timings, errors = RecordedTimings(), list[EngineError]()
    stream.timings = timings  # type: ignore[assignment]
    stream.on_error = errors.append
    with pytest.raises(EngineError) as raised:
        async for _ in stream:
            pass
    assert [e.code for e in errors] == ["model_crashed"]
    assert errors[0] is raised.value
    assert timings.messages == [1, 3]
    assert stream.ended


async def test_a_finished_stream_has_ended_and_counts_no_error() -> None:
    stream = EngineStream(QueuedCall(token(0), FINISH), "r", 5.0, 60.0)
    errors: list[EngineError] = []
    stream.on_error = errors.append
    async for _ in stream:
        pass
    assert stream.ended
    assert errors == []
