"""A gateway replica dies and nothing is lost: the engine keeps
a detachable generation whose caller vanished running for its orphan grace,
and another caller re-attaches to it by request id.

Real parts: the engine is its own process on a TCP port; the caller that dies is
another process (tests/integration/detachable_caller.py, using the gateway's
EngineClient) that the test SIGKILLs, so the engine sees what it would see of
a crashed gateway: a connection gone, no Cancel. The re-attaching side is the
gateway's EngineClient on a channel of its own. Waits are polls of the engine's
GetStats with deadlines.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.engine.backends.fake import token_text
from services.gateway.engine_client import EngineClient
from services.gateway.errors import EngineError
from services.gateway.settings import GatewaySettings
from streamlab.lab import processes
from streamlab.lab.processes import ServiceSpec, free_ports
from streamlab.lab.topology import REPO_ROOT
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# Long enough for a test to re-attach after the kill on a busy machine, short
# enough that waiting one out costs a few seconds; the "at once" checks allow
# well under it, so a stop that waited for the grace fails them.
GRACE_S = 4.0
AT_ONCE_S = 1.5


@contextmanager
def engine_process(log_dir: Path, grace_s: float) -> Iterator[str]:
    """A fake-model engine process on a free port, ready; its target."""
    port = free_ports(1)[0]
    target = f"127.0.0.1:{port}"

    def healthy() -> bool:
        with grpc.insecure_channel(target) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    spec = ServiceSpec(
        "engine", [sys.executable, "-m", "services.engine"],
        env={"STREAMLAB_ENGINE_HOST": "127.0.0.1", "STREAMLAB_ENGINE_PORT": str(port),
             "STREAMLAB_ENGINE_BACKEND": "fake",
             "STREAMLAB_ENGINE_ORPHAN_GRACE_S": str(grace_s),
             "STREAMLAB_ENGINE_MAX_TOKENS_LIMIT": "100000"},
        ready=healthy, cwd=REPO_ROOT)
    running = processes.start(spec, log_dir)
    try:
        processes.wait_ready(running)
        yield target
    finally:
        processes.stop(running, grace_s=5.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with engine_process(tmp_path_factory.mktemp("engine-logs"), GRACE_S) as target:
        yield target


@asynccontextmanager
async def client(target: str) -> AsyncIterator[tuple[EngineClient, pb_grpc.EngineServiceStub]]:
    """The gateway's EngineClient, and a stub for GetStats, each on its own channel."""
    engine_client = EngineClient(GatewaySettings(engine_target=target))
    channel = grpc.aio.insecure_channel(target)
    try:
        yield engine_client, pb_grpc.EngineServiceStub(channel)
    finally:
        await channel.close()
        await engine_client.close()


async def stats(stub: pb_grpc.EngineServiceStub, request_id: str) -> pb.GetStatsResponse:
    response: pb.GetStatsResponse = await stub.GetStats(
        pb.GetStatsRequest(request_id=request_id), timeout=5)
    return response


async def ended(stub: pb_grpc.EngineServiceStub, request_id: str, timeout_s: float
                ) -> pb.GenerationRecord:
    async def done() -> bool:
        found = (await stats(stub, request_id)).generations
        return bool(found) and found[0].state != pb.GENERATION_STATE_RUNNING
    await wait_until_async(done, timeout_s=timeout_s, what=f"generation {request_id} ends",
                           interval_s=0.01)
    return (await stats(stub, request_id)).generations[0]


@asynccontextmanager
async def caller(target: str, request_id: str, tokens: int, gap_ms: int,
                 detachable: bool = True) -> AsyncIterator[Callable[[int], Awaitable[float]]]:
    """A caller process; yields `killed_after(k)`: waits until it printed the
    token with index k, SIGKILLs it, and returns the monotonic time of the kill."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.detachable_caller", target, request_id,
        str(tokens), str(gap_ms), "1" if detachable else "0",
        stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT, start_new_session=True)

    async def killed_after(k: int) -> float:
        assert process.stdout is not None
        async with asyncio.timeout(15):
            while True:
                line = await process.stdout.readline()
                assert line, "the caller exited before its token " + str(k)
                if json.loads(line).get("index") == k:
                    break
        process.kill()  # SIGKILL: no Cancel, no goodbye, as a crashed gateway
        at = time.monotonic()
        await process.wait()
        return at

    try:
        yield killed_after
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def reference(tokens: int) -> str:
    return "".join(token_text(i) for i in range(tokens))


async def test_a_killed_callers_generation_is_reattached_from_the_last_index_exactly_once(
        engine: str) -> None:
    tokens, k = 60, 9
    rid = f"reattach-{uuid.uuid4().hex[:8]}"
    async with client(engine) as (engine_client, stub):
        before = await stats(stub, rid)
        async with caller(engine, rid, tokens, gap_ms=30) as killed_after:
            await killed_after(k)
        stream = await engine_client.attach(rid, after_index=k)
        indexes: list[int] = []
        texts = [token_text(i) for i in range(k + 1)]  # what the dead caller had passed on
        finish: pb.Finish | None = None
        async for event in stream:
            if isinstance(event, pb.TokenChunk):
                indexes.append(event.index)
                texts.append(event.text)
            elif isinstance(event, pb.Finish):
                finish = event
        assert indexes == list(range(k + 1, tokens)), "each token after k once, in order"
        assert "".join(texts) == reference(tokens)
        assert finish is not None
        assert finish.usage.completion_tokens == tokens
        after = await stats(stub, rid)
        assert after.generations[0].state == pb.GENERATION_STATE_COMPLETED
        assert after.generations_orphaned - before.generations_orphaned == 1
        assert after.generations_reattached - before.generations_reattached == 1


async def test_with_no_grace_a_killed_callers_generation_is_gone(tmp_path: Path) -> None:
    """The broken thing the test above guards against: an engine that ends a
    generation with its caller (grace 0, as before detachable generations)
    leaves the new caller nothing to attach to."""
    tokens, k = 60, 9
    rid = f"nograce-{uuid.uuid4().hex[:8]}"
    with engine_process(tmp_path, grace_s=0) as target:
        async with client(target) as (engine_client, stub):
            async with caller(target, rid, tokens, gap_ms=30) as killed_after:
                await killed_after(k)
            record = await ended(stub, rid, AT_ONCE_S + 3)
            assert record.state == pb.GENERATION_STATE_CANCELLED
            with pytest.raises(EngineError) as refused:
                await engine_client.attach(rid, after_index=k)
            assert refused.value.status_code == 404
            assert "no detachable generation" in refused.value.message


async def test_nobody_attaches_and_the_engine_cancels_at_grace_end(engine: str) -> None:
    rid = f"expire-{uuid.uuid4().hex[:8]}"
    async with client(engine) as (_, stub):
        before = await stats(stub, rid)
        async with caller(engine, rid, tokens=100_000, gap_ms=10) as killed_after:
            killed_at = await killed_after(4)
        record = await ended(stub, rid, GRACE_S + 10)
        after = await stats(stub, rid)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    # It ran on through the grace (not stopped with its caller), then stopped.
    assert record.cancelled_at - killed_at >= GRACE_S
    assert record.tokens_generated > 5
    assert record.tokens_after_cancel <= 1
    assert after.generations_orphan_expired - before.generations_orphan_expired == 1
    assert after.generations_cancelled - before.generations_cancelled == 1


async def test_an_explicit_cancel_stops_a_detachable_generation_at_once(engine: str) -> None:
    rid = f"cancel-{uuid.uuid4().hex[:8]}"
    async with client(engine) as (engine_client, stub):
        before = await stats(stub, rid)
        stream = await engine_client.open(pb.GenerateRequest(
            request_id=rid, prompt="stop me", max_tokens=100_000, detachable=True,
            timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=10, answer_tokens=100_000)))
        assert stream.detachable
        async for event in stream:
            assert isinstance(event, pb.TokenChunk)
            if event.index == 4:
                break
        stopped_at = time.monotonic()
        stream.stop()  # what EngineLease.close() does: Cancel, then the call
        record = await ended(stub, rid, GRACE_S + 10)
        after = await stats(stub, rid)
        with pytest.raises(EngineError) as refused:
            await engine_client.attach(rid, after_index=4)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.cancelled_at - stopped_at < AT_ONCE_S, "stopped by the Cancel, not the grace"
    assert record.tokens_after_cancel <= 1
    assert after.generations_orphaned == before.generations_orphaned
    assert refused.value.status_code == 404


async def test_a_dropped_call_that_is_not_detachable_is_cancelled_as_before(engine: str) -> None:
    rid = f"plain-{uuid.uuid4().hex[:8]}"
    async with client(engine) as (engine_client, stub):
        before = await stats(stub, rid)
        async with caller(engine, rid, tokens=100_000, gap_ms=10,
                          detachable=False) as killed_after:
            killed_at = await killed_after(4)
        record = await ended(stub, rid, GRACE_S + 10)
        after = await stats(stub, rid)
        with pytest.raises(EngineError) as refused:
            await engine_client.attach(rid, after_index=4)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    assert record.cancelled_at - killed_at < AT_ONCE_S, "cancelled with its call, no grace"
    assert record.tokens_after_cancel <= 1
    assert after.generations_orphaned == before.generations_orphaned
    assert refused.value.status_code == 404


async def test_an_attach_after_the_finish_was_sent_gets_the_tail_and_the_finish(
        engine: str) -> None:
    """The rolling-deploy loss: the engine wrote the last tokens and the
    finish on a draining owner's call, the drain cancelled the call before the
    owner stored them, and the replica taking the stream over Attaches from the
    last index its log has. The engine must still hold the ended generation."""
    tokens = 12
    rid = f"ended-{uuid.uuid4().hex[:8]}"
    async with client(engine) as (engine_client, stub):
        before = await stats(stub, rid)
        stream = await engine_client.open(pb.GenerateRequest(
            request_id=rid, prompt="finish me", max_tokens=tokens, detachable=True,
            timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=1, answer_tokens=tokens)))
        first = [event.index async for event in stream if isinstance(event, pb.TokenChunk)]
        assert first == list(range(tokens)), "the first call got it all, finish included"
        stored = tokens - 3  # the owner's log had up to here when the drain cut it
        replay = await engine_client.attach(rid, after_index=stored)
        indexes: list[int] = []
        finishes: list[pb.Finish] = []
        async for event in replay:
            if isinstance(event, pb.TokenChunk):
                indexes.append(event.index)
            elif isinstance(event, pb.Finish):
                finishes.append(event)
        assert indexes == [tokens - 2, tokens - 1], "the tail after the stored index, once"
        assert len(finishes) == 1
        assert finishes[0].usage.completion_tokens == tokens
        after = await stats(stub, rid)
        assert after.generations[0].state == pb.GENERATION_STATE_COMPLETED
        assert after.generations_orphaned == before.generations_orphaned
        await engine_client.cancel(rid)  # an explicit Cancel forgets it at once
        with pytest.raises(EngineError) as refused:
            await engine_client.attach(rid, after_index=stored)
        assert refused.value.status_code == 404
