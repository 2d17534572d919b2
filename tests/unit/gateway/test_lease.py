"""The EngineLease: admission in order, and one owner that releases the call,
the drain's tracking and the stream slot on every exit."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.errors import BadRequest, EngineError, GatewayError
from services.gateway.lease import EngineLease
from services.gateway.openai_api import ChatCompletionRequest
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.unit.gateway.inprocess import Running, chat, running
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine

pytestmark = pytest.mark.anyio


def body(**streamlab: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(chat(**streamlab))


def held(gw: Running) -> tuple[int, int]:
    """(stream slots held, calls the drain tracks)."""
    return gw.gateway.limiter.open, gw.gateway.drain.live


async def test_open_holds_a_slot_and_is_tracked_close_releases_both_and_cancels() -> None:
    async with running() as gw:
        lease = gw.gateway.lease(body(), "r1", client_key="client:a")
        stream = await lease.open()
        assert stream.request_id == "r1"
        assert held(gw) == (1, 1)
        lease.close()
        lease.close()  # idempotent: every exit path may call it
        assert gw.engine.last.cancelled
        assert held(gw) == (0, 0)


async def test_leaving_the_block_by_an_error_cancels_the_call() -> None:
    async with running() as gw:
        with pytest.raises(RuntimeError):
            async with gw.gateway.lease(body(), "r1", client_key="client:a"):
                raise RuntimeError("the surface failed")
        assert gw.engine.last.cancelled
        assert held(gw) == (0, 0)


async def test_an_engine_refusal_frees_the_slot_and_is_counted() -> None:
    refusal = EngineError(429, "resource_exhausted", "engine: queue full")
    async with running(ScriptedEngine(refusal=refusal)) as gw:
        with pytest.raises(EngineError):
            await gw.gateway.lease(body(), "r1", client_key="client:a").open()
        assert held(gw) == (0, 0)
        errors = gw.gateway.metrics.registry.get_sample_value(
            "streamlab_gateway_engine_errors_total", {"code": "resource_exhausted"})
        assert errors == 1


async def test_admission_refuses_in_order_before_the_engine_is_asked() -> None:
    async with running(max_prompt_chars=5, retry_after_s=7,
                       max_streams_per_client=1) as gw:
        gateway = gw.gateway
        with pytest.raises(BadRequest) as broken:
            await gateway.lease(body(engine_errors="swallow"), "r", "client:a").open()
        assert broken.value.code == "broken_mode_disabled"
        assert "engine_errors=swallow" in broken.value.message

        long = ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "a long prompt"}]})
        with pytest.raises(BadRequest) as too_long:
            await gateway.lease(long, "r", "client:a").open()
        assert too_long.value.code == "prompt_too_long"

        first = gateway.lease(body(), "r1", "client:a")
        await first.open()
        with pytest.raises(GatewayError) as capped:
            await gateway.lease(body(), "r2", "client:a").open()
        assert (capped.value.status_code, capped.value.headers["Retry-After"]) == (429, "7")
        # A surface without a connection (a polling job) takes no slot.
        job = gateway.lease(body(), "r3", client_key=None)
        await job.open()
        job.close()
        first.close()

        gateway.drain.draining = True
        with pytest.raises(GatewayError) as draining:
            await gateway.lease(body(), "r4", "client:a").open()
        assert (draining.value.status_code, draining.value.code) == (503, "server_draining")
        assert draining.value.headers["Retry-After"] == "7"
        assert len(gw.engine.calls) == 2  # only the two admitted leases reached it


async def read_all(lease: EngineLease, seen: list[object]) -> None:
    async with lease:
        async for event in lease.events():
            seen.append(event)


async def test_events_are_tokens_then_the_finish_or_one_engine_error() -> None:
    async with running(ScriptedEngine(Script(tokens=2))) as gw:
        lease = gw.gateway.lease(body(), "r1", "client:a")
        async with lease:
            events = [event async for event in lease.events()]
        assert [type(e) for e in events] == [pb.TokenChunk, pb.TokenChunk, pb.Finish]
        assert [e.text for e in events if isinstance(e, pb.TokenChunk)] == ["t0 ", "t1 "]

    for end, code in (("error", "engine_failed"), ("eof", "truncated")):
        async with running(ScriptedEngine(Script(tokens=1, end=end))) as gw:
            lease = gw.gateway.lease(body(), "r1", "client:a")
            seen: list[object] = []

            with pytest.raises(EngineError) as failed:
                await read_all(lease, seen)
            assert failed.value.code == code
            assert len(seen) == 1
            assert gw.gateway.metrics.registry.get_sample_value(
                "streamlab_gateway_engine_errors_total", {"code": code}) == 1


async def test_a_lease_that_abandons_its_call_still_frees_the_slot() -> None:
    """Only the detached broken mode abandons its call: that is the leak."""
    async with running(ScriptedEngine(Script(tokens=5, hold_after=1))) as gw:
        lease = gw.gateway.lease(body(), "r1", "client:a")
        await lease.open()
        lease.abandon_call()
        lease.close()
        assert not gw.engine.last.cancelled
        assert held(gw) == (0, 0)
