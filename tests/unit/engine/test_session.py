"""The multiplexed Session's writer: what leaves together in one SessionEvent.

The real servicer and fake model run in-process; only grpc's call is left out
(the writer is the Session call's response iterator, read here directly)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from services.engine.backends.fake import FakeModel
from services.engine.servicer import EngineServicer
from services.engine.session import EngineSession, Health
from services.engine.settings import EngineSettings
from services.engine.stats import EngineStats
from streamlab_protocol.engine.v1 import engine_pb2 as pb

Kinds = list[list[str]]


def _open(call: int, prefill_ms: int) -> pb.SessionRequest:
    return pb.SessionRequest(call=call, window_tokens=64, open=pb.GenerateRequest(
        request_id=f"r{call}", max_tokens=2, accept_token_batches=True,
        messages=[pb.ChatMessage(role="user", content="hi")],
        timing=pb.FakeModelTiming(prefill_ms=prefill_ms, token_gap_ms=0, answer_tokens=2)))


async def _events_of_one_call(prefill_ms: int) -> Kinds:
    """Each SessionEvent's items (kind, or the event's kind) for one call, to its finish."""
    settings = EngineSettings()
    backend = FakeModel(settings.fake)
    stats = EngineStats(settings.stats_history)
    servicer = EngineServicer(backend, stats, settings)
    done = asyncio.Event()

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        yield _open(1, prefill_ms)
        await done.wait()  # the caller keeps the session open until its call ends

    out: Kinds = []
    events = EngineSession(servicer, stats, Health()).run(requests())
    try:
        async with asyncio.timeout(10):
            async for event in events:
                kinds = [item.event.WhichOneof("event") if item.WhichOneof("kind") == "event"
                         else str(item.WhichOneof("kind")) for item in event.items]
                if kinds:
                    out.append(kinds)
                if "finish" in kinds:
                    break
    finally:
        done.set()
        await events.aclose()
        await backend.aclose()
    return out


def test_a_calls_items_leave_once_each_in_order() -> None:
    # The outbox is the next SessionEvent, swapped for a new one at each send:
    # nothing added around a swap may be lost or sent twice.
    events = asyncio.run(_events_of_one_call(prefill_ms=0))
    assert [kind for event in events for kind in event] == [
        "accepted", "token", "token", "finish"], events


def test_a_prefill_does_not_hold_the_accept_back() -> None:
    # The gateway commits to a 200 on the accept: it must not wait for the
    # first token of a long prefill.
    events = asyncio.run(_events_of_one_call(prefill_ms=300))
    assert events[0] == ["accepted"], events
    assert "token" in events[1], events


def test_an_accept_leaves_with_the_first_tokens_of_a_stream_without_prefill() -> None:
    # One message instead of two for a stream whose first step is at once:
    # the accept waits (ACCEPT_HOLD_S) for the tokens it would precede anyway.
    events = asyncio.run(_events_of_one_call(prefill_ms=0))
    assert events[0][:2] == ["accepted", "token"], events
