"""The multiplexed engine wire: one Session call carries every generation.

Real parts: an engine serving gRPC on a free TCP port in this process, reached
through real channels (the raw Session stub, and the gateway's own
EngineClient on either wire). What the rest of the suite checks through the
gateway (cancellation, resume, re-attach, replicas, drain) runs on this wire,
the default (and on per_request with `make test-wire-per-request`); this file
checks what only this wire has:
one event per decode step for every generation, an abort that stops one
generation and no other, a session whose break drops every call it carried,
and a gateway that fails a broken session's streams as it fails broken calls,
then opens a new session.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

import grpc
import pytest

from services.engine.server import Engine, create_server
from services.engine.settings import EngineSettings
from services.gateway.engine_client import EngineClient
from services.gateway.errors import EngineError
from services.gateway.settings import GatewaySettings
from streamlab.lab.target import LabTarget
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

GRACE_S = 5.0
# A stop "at once" is well under the orphan grace: one that waited for it fails.
AT_ONCE_S = 1.5


@asynccontextmanager
async def engine(port: int = 0) -> AsyncIterator[Engine]:
    settings = EngineSettings(backend="fake", host="127.0.0.1", port=port,
                              orphan_grace_s=GRACE_S, max_tokens_limit=100_000)
    running = await create_server(settings)
    try:
        yield running
    finally:
        await running.stop(0)


@asynccontextmanager
async def stub_to(port: int) -> AsyncIterator[pb_grpc.EngineServiceStub]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield pb_grpc.EngineServiceStub(channel)
    finally:
        await channel.close()


def generate(rid: str, tokens: int, gap_ms: int, detachable: bool = False) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=rid, prompt="many at once", max_tokens=tokens, detachable=detachable,
        accept_token_batches=True,
        timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=gap_ms, answer_tokens=tokens,
                                  clock=pb.FAKE_CLOCK_BATCHED))


class Session:
    """A raw Session call: messages in through a queue, events read by the test."""

    def __init__(self, stub: pb_grpc.EngineServiceStub) -> None:
        self._outbox: asyncio.Queue[pb.SessionRequest | None] = asyncio.Queue()
        self.call = stub.Session(self._requests())

    async def _requests(self) -> AsyncIterator[pb.SessionRequest]:
        while (message := await self._outbox.get()) is not None:
            yield message

    def close(self) -> None:
        """Cancel the call, and end its requests (grpc leaves their iterator
        waiting, and the loop's shutdown cannot close a generator that waits)."""
        self._outbox.put_nowait(None)
        self.call.cancel()

    def send(self, message: pb.SessionRequest) -> None:
        self._outbox.put_nowait(message)

    async def event(self) -> pb.SessionEvent:
        async with asyncio.timeout(10):
            event = await self.call.read()
        assert isinstance(event, pb.SessionEvent), event
        return event


async def record(stub: pb_grpc.EngineServiceStub, rid: str) -> pb.GenerationRecord:
    stats = await stub.GetStats(pb.GetStatsRequest(request_id=rid), timeout=5)
    assert stats.generations, f"the engine has no record of {rid}"
    generation: pb.GenerationRecord = stats.generations[0]
    return generation


async def ended(stub: pb_grpc.EngineServiceStub, rid: str, timeout_s: float
                ) -> pb.GenerationRecord:
    async def done() -> pb.GenerationRecord | None:
        found = await record(stub, rid)
        return found if found.state != pb.GENERATION_STATE_RUNNING else None
    return await wait_until_async(done, timeout_s=timeout_s, interval_s=0.01,
                                  what=f"generation {rid} ends")


def tokens_of(item: pb.SessionItem) -> list[pb.TokenChunk]:
    event = item.event
    if event.WhichOneof("event") == "token":
        return [event.token]
    return list(event.tokens.chunks) if event.WhichOneof("event") == "tokens" else []


async def test_one_event_per_decode_step_carries_every_running_generation() -> None:
    """Eight generations on the batched clock: each step's tokens of all eight
    leave in one SessionEvent (a wire that sent one message per token would
    carry one generation per event), and each generation's tokens arrive
    complete and in order, accepted first and finished last."""
    generations, tokens = 8, 12
    async with engine() as running, stub_to(running.port) as stub:
        session = Session(stub)
        for call in range(1, generations + 1):
            session.send(pb.SessionRequest(call=call, open=generate(
                f"step-{call}-{uuid.uuid4().hex[:6]}", tokens, gap_ms=30)))
        indexes: dict[int, list[int]] = {c: [] for c in range(1, generations + 1)}
        accepted: set[int] = set()
        finished: set[int] = set()
        widest = 0
        while len(finished) < generations:
            event = await session.event()
            with_tokens = set()
            for item in event.items:
                assert item.call not in finished, "nothing after a call's finish"
                if item.WhichOneof("kind") == "accepted":
                    accepted.add(item.call)
                    continue
                assert item.WhichOneof("kind") == "event", item
                assert item.call in accepted, "accepted before any event"
                if item.event.WhichOneof("event") == "finish":
                    finished.add(item.call)
                    continue
                chunks = tokens_of(item)
                assert chunks, item
                indexes[item.call] += [chunk.index for chunk in chunks]
                with_tokens.add(item.call)
            widest = max(widest, len(with_tokens))
        session.close()
    assert all(got == list(range(tokens)) for got in indexes.values()), indexes
    assert widest >= generations // 2, f"at most {widest} generations in one event"


async def test_an_abort_stops_its_generation_at_the_next_step_and_no_other() -> None:
    async with engine() as running, stub_to(running.port) as stub:
        session = Session(stub)
        rids = {call: f"abort-{call}-{uuid.uuid4().hex[:6]}" for call in (1, 2, 3)}
        for call, rid in rids.items():
            session.send(pb.SessionRequest(call=call, open=generate(rid, 60, gap_ms=20)))
        seen = {call: 0 for call in rids}
        finished: set[int] = set()
        aborted_at = 0.0
        after_abort = {call: 0 for call in rids}
        while finished != {1, 3}:
            for item in (await session.event()).items:
                if item.WhichOneof("kind") != "event":
                    continue
                if item.event.WhichOneof("event") == "finish":
                    finished.add(item.call)
                count = len(tokens_of(item))
                seen[item.call] += count
                if aborted_at:
                    after_abort[item.call] += count
            if not aborted_at and seen[2] >= 5:
                session.send(pb.SessionRequest(call=2, abort=pb.SessionAbort()))
                aborted_at = time.monotonic()
        stopped = await ended(stub, rids[2], AT_ONCE_S)
        others = [await record(stub, rids[c]) for c in (1, 3)]
        session.close()
    assert stopped.state == pb.GENERATION_STATE_CANCELLED
    assert stopped.tokens_after_cancel <= 1
    assert stopped.tokens_generated < 60
    assert [o.state for o in others] == [pb.GENERATION_STATE_COMPLETED] * 2
    assert all(after_abort[c] > 0 for c in (1, 3)), "the others ran on after the abort"


async def test_a_call_that_is_not_read_pauses_its_own_generation_and_no_other() -> None:
    """Per-call flow control on one session: call 1 is never credited, call 2
    credits every token it gets. Call 1's generation pauses once its window is
    spent (a wire without per-call windows would run it to its end, or stall
    call 2 behind it); call 2 runs to its finish meanwhile."""
    window, tokens = 40, 400
    async with engine() as running, stub_to(running.port) as stub:
        session = Session(stub)
        rids = {call: f"window-{call}-{uuid.uuid4().hex[:6]}" for call in (1, 2)}
        for call, rid in rids.items():
            session.send(pb.SessionRequest(call=call, window_tokens=window,
                                           open=generate(rid, tokens, gap_ms=0)))
        got = {1: 0, 2: 0}
        finished = False
        while not finished:
            for item in (await session.event()).items:
                if item.WhichOneof("kind") != "event":
                    continue
                finished |= item.call == 2 and item.event.WhichOneof("event") == "finish"
                count = len(tokens_of(item))
                got[item.call] += count
                if item.call == 2 and count:
                    session.send(pb.SessionRequest(call=2, credit=pb.SessionCredit(
                        tokens=count)))
        paused = await record(stub, rids[1])
        session.send(pb.SessionRequest(call=1, abort=pb.SessionAbort()))
        stopped = await ended(stub, rids[1], AT_ONCE_S)
        session.close()
    assert got[2] == tokens
    # A message may take the window past its end (tokens made in one step
    # travel together), and the step that made them is counted: paused there,
    # far from the end that call 2 reached in the same time.
    assert window <= got[1] <= paused.tokens_generated < tokens // 2
    assert paused.state == pb.GENERATION_STATE_RUNNING
    assert stopped.state == pb.GENERATION_STATE_CANCELLED


async def test_a_broken_session_drops_every_call_it_carried() -> None:
    """The session's stream ends (the gateway died, the hop was cut): its plain
    generations are cancelled at once, as their Generate calls would be, and
    its detachable one is orphaned, left for another caller to Attach to."""
    async with engine() as running, stub_to(running.port) as stub:
        plain = [f"broken-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
        held = f"held-{uuid.uuid4().hex[:6]}"
        before = await stub.GetStats(pb.GetStatsRequest(), timeout=5)
        async with stub_to(running.port) as doomed:
            session = Session(doomed)
            for call, rid in enumerate(plain, 1):
                session.send(pb.SessionRequest(call=call, open=generate(rid, 100_000, 10)))
            session.send(pb.SessionRequest(call=9, open=generate(held, 100_000, 10,
                                                                 detachable=True)))
            started: set[int] = set()
            while len(started) < 4:
                started |= {i.call for i in (await session.event()).items
                            if i.WhichOneof("kind") == "event"}
            session.close()
        broken_at = time.monotonic()  # the channel closed: the session's stream is gone
        records = [await ended(stub, rid, AT_ONCE_S) for rid in plain]
        after = await stub.GetStats(pb.GetStatsRequest(), timeout=5)
        still = await record(stub, held)
        attach = stub.Attach(pb.AttachRequest(request_id=held, after_index=0))
        first = await attach.read()
        attach.cancel()
        await stub.Cancel(pb.CancelRequest(request_id=held), timeout=5)
    for found in records:
        assert found.state == pb.GENERATION_STATE_CANCELLED
        assert found.cancelled_at - broken_at < AT_ONCE_S
        assert found.tokens_after_cancel <= 1
    assert still.state == pb.GENERATION_STATE_RUNNING, "orphaned, not cancelled"
    assert after.generations_orphaned - before.generations_orphaned == 1
    assert isinstance(first, pb.GenerateResponse)
    assert first.WhichOneof("event") in ("token", "tokens")


Wire = Literal["per_request", "multiplexed"]


async def read_to_the_end(reader: AsyncIterator[object]) -> None:
    async with asyncio.timeout(10):
        async for _ in reader:
            pass


async def broken_streams(wire: Wire) -> tuple[list[tuple[int, str]], int]:
    """Two streams through the gateway's EngineClient on `wire`; the engine
    stops under them. Their errors, and the tokens of a stream opened on the
    same client once an engine serves the port again."""
    async with engine() as first:
        port = first.port
        client = EngineClient(GatewaySettings(engine_target=f"127.0.0.1:{port}",
                                              engine_wire=wire))
        try:
            streams = [await client.open(generate(f"{wire}-{i}-{uuid.uuid4().hex[:6]}",
                                                  100_000, 10)) for i in range(2)]
            readers = [stream.__aiter__() for stream in streams]
            for reader in readers:
                assert isinstance(await anext(reader), pb.TokenChunk)
            await first.stop(0)
            errors = []
            for reader in readers:
                with pytest.raises(EngineError) as failed:
                    await read_to_the_end(reader)
                errors.append((failed.value.status_code, failed.value.code))
            async with engine(port):
                async def reopened() -> int | None:
                    try:
                        stream = await client.open(generate(f"again-{uuid.uuid4().hex[:6]}",
                                                            5, 0))
                    except EngineError:
                        return None  # the channel is still reconnecting
                    return sum([1 async for e in stream if isinstance(e, pb.TokenChunk)])
                tokens = await wait_until_async(reopened, timeout_s=10, interval_s=0.1,
                                                what=f"a new stream on the {wire} wire")
        finally:
            await client.close()
    return errors, tokens


async def test_a_broken_session_fails_its_streams_as_broken_calls_fail_then_reconnects() -> None:
    per_request, per_request_tokens = await broken_streams("per_request")
    multiplexed, multiplexed_tokens = await broken_streams("multiplexed")
    assert multiplexed == per_request, "the same errors on both wires"
    assert all(status >= 500 for status, _ in multiplexed)
    assert multiplexed_tokens == per_request_tokens == 5


def test_bench_cancel_measures_both_wires_side_by_side(lab: LabTarget) -> None:
    """`streamlab bench cancel --wire both`: the same abandonment on each wire
    (the lab's gateways restarted on it, then put back), every cancel reaching
    the engine on each, and the latencies in one table."""
    if lab.pids is None:
        pytest.skip("--wire restarts the gateways: local labs only")
    out = subprocess.run(
        [sys.executable, "-m", "streamlab.cli", "bench", "cancel", "--run-dir", str(lab.run_dir),
         "--streams", "12", "--concurrency", "4", "--wire", "both", "--json"],
        capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["as_expected"], report["checks"]
    figures = report["figures"]
    for wire in ("per_request", "multiplexed"):
        assert figures[f"{wire}_streams"] == figures[f"{wire}_cancelled"] == 12
        assert figures[f"{wire}_still_running"] == 0
        assert 0 <= figures[f"{wire}_cancel_latency_p50_ms"] < 2000
    assert [row[0] for row in report["tables"][0]["rows"]] == ["per_request", "multiplexed"]
    assert {c["figure"] for c in report["checks"]} == {
        f"{wire}_{name}" for wire in ("per_request", "multiplexed")
        for name in ("cancelled", "still_running")}
