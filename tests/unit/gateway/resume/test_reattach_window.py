"""The owner's re-attach after its engine call dropped, in-process: its
readers are told `event: retry` (`engine_reattaching`) on the open response,
then get the rest, or `error` `generation_lost` at once when the engine says
it holds no such generation, or at the window's end when nothing answers.
A scripted lease stands in for the engine (tests/integration/
test_engine_death.py does it with real processes)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry
from sse_starlette import ServerSentEvent

from services.gateway.engine_client import EngineEvent, EngineStream
from services.gateway.errors import EngineError
from services.gateway.resume.memory import follow_local
from services.gateway.resume.streams import (
    ENGINE_REATTACHING,
    GENERATION_LOST,
    Attach,
    StreamPolicy,
    StreamRegistry,
)
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.anyio

WINDOW_S = 0.6
DROPPED = EngineError(503, "unavailable", "engine: Socket closed")


class DroppingLease:
    """A detachable generation of `tokens` whose call drops after `drop_at`;
    each re-attach raises the next of `answers` (None: attached, the rest follows)."""

    def __init__(self, tokens: int, drop_at: int, answers: list[EngineError | None]) -> None:
        self.tokens, self.drop_at, self.answers = tokens, drop_at, answers
        self.reattaches = 0
        self._from = 0
        self.closed = False

    @property
    def client_key(self) -> str | None:
        return None

    @property
    def detachable(self) -> bool:
        return True

    async def _events(self) -> AsyncIterator[EngineEvent]:
        start, self._from = self._from, self.tokens
        for index in range(start, self.tokens):
            await asyncio.sleep(0)
            if self.reattaches == 0 and index == self.drop_at:
                raise DROPPED
            yield pb.TokenChunk(index=index, text=f"t{index} ")
        yield pb.Finish(reason=pb.FINISH_REASON_STOP)

    def events(self) -> AsyncIterator[EngineEvent]:
        return self._events()

    async def reattach(self, after_index: int | None) -> EngineStream:
        answer = self.answers[min(self.reattaches, len(self.answers) - 1)]
        self.reattaches += 1
        if answer is not None:
            raise answer
        self._from = 0 if after_index is None else after_index + 1
        return None  # type: ignore[return-value]  # the stream reads events() again

    async def attach(self, after_index: int | None) -> EngineStream:
        raise AssertionError("not a take-over")

    def abandon_call(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def trace_headers(self) -> dict[str, str]:
        return {}  # tracing off


async def read(lease: DroppingLease, window_s: float = WINDOW_S
               ) -> tuple[list[ServerSentEvent], float]:
    """Every event a reader gets, and how long the stream took."""
    registry = StreamRegistry(GatewaySettings(reattach_window_s=window_s), CollectorRegistry())
    started = time.monotonic()
    stream = registry.create("s" * 32, lease, StreamPolicy(
        grace_s=10, ttl_s=10, retry_ms=200, max_events=1000))
    events = [event async for event in follow_local(stream, 0, Attach(0, None, 0, None))]
    took = time.monotonic() - started
    await registry.close()
    return [e for e in events if e.event is not None], took


def names(events: list[ServerSentEvent]) -> list[str]:
    return [str(e.event) for e in events]


def data(event: ServerSentEvent) -> dict[str, object]:
    parsed = json.loads(str(event.data))
    assert isinstance(parsed, dict)
    return parsed


async def test_a_blip_is_told_and_the_rest_follows_on_the_same_response() -> None:
    lease = DroppingLease(6, drop_at=3, answers=[DROPPED, None])
    events, _ = await read(lease)
    assert names(events) == ["token"] * 3 + ["retry"] + ["token"] * 3 + ["done"]
    assert data(events[3])["code"] == ENGINE_REATTACHING
    assert [data(e)["index"] for e in events if e.event == "token"] == list(range(6))
    assert lease.reattaches == 2


async def test_a_stream_taken_over_reattaches_after_its_last_token_not_from_the_first() -> None:
    """A replica took the stream over after token 2 (seq 3); its call drops
    before the first new token. The re-attach asks for what follows token 2:
    the rest once, not the whole answer again under new ids."""
    lease = DroppingLease(6, drop_at=3, answers=[None])
    lease._from = 3  # the take-over's attach: the engine sends from token 3
    registry = StreamRegistry(GatewaySettings(reattach_window_s=WINDOW_S), CollectorRegistry())
    stream = registry.create("s" * 32, lease, StreamPolicy(
        grace_s=10, ttl_s=10, retry_ms=200, max_events=1000), after_seq=3)
    events = [e async for e in follow_local(stream, 3, Attach(0, None, 3, None))
              if e.event is not None]
    await registry.close()
    assert names(events) == ["retry"] + ["token"] * 3 + ["done"]
    assert [data(e)["index"] for e in events if e.event == "token"] == [3, 4, 5]
    assert [e.id for e in events if e.event == "token"] == [f"{'s' * 32}:{seq}"
                                                            for seq in (4, 5, 6)]


async def test_an_engine_that_holds_no_such_generation_ends_it_at_once() -> None:
    gone = EngineError(404, "not_found", "engine: no detachable generation")
    events, took = await read(DroppingLease(6, drop_at=3, answers=[gone]), window_s=30.0)
    assert names(events) == ["token"] * 3 + ["retry", "error"]
    error = data(events[-1])["error"]
    assert isinstance(error, dict)
    assert error["code"] == GENERATION_LOST
    assert "no longer holds it" in str(error["message"])
    assert took < 5.0, "at its first answer, not the window's end"


async def test_nothing_answering_ends_it_at_the_window() -> None:
    events, took = await read(DroppingLease(6, drop_at=3, answers=[DROPPED]))
    assert names(events) == ["token"] * 3 + ["retry", "error"]
    error = data(events[-1])["error"]
    assert isinstance(error, dict)
    assert error["code"] == GENERATION_LOST
    assert f"within {WINDOW_S:g} s" in str(error["message"])
    assert WINDOW_S <= took < WINDOW_S + 1.0
