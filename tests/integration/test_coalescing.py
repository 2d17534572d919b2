"""Coalescing without delay: a reader that pauses and resumes catches up with
fewer writes than tokens, and the text is identical.

Real parts, in this process: the engine's gRPC server (the fake model on its
batched clock) and, for the gateway, its real app and gRPC client against that
engine, driven through ASGI with a `send` that can stop (what uvicorn's send
does when the client's socket is full); each `http.response.body` message is
one socket write in uvicorn. The reader stops, waits until the engine has
paused (flow control reached it), then reads on. No sleeps: the engine's own
counters say when it stands still.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from services.engine.backends.fake import token_text
from services.engine.server import create_server
from services.engine.settings import EngineSettings
from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc
from tests.integration.engine_inproc import stats

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOKENS = 3000
# A small read-ahead, as the gateway's own (16 KiB): the engine feels a stopped
# reader after a few hundred tokens instead of thousands.
READ_AHEAD = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 4096)]


@asynccontextmanager
async def engine_and_stub(settings: EngineSettings
                          ) -> AsyncIterator[tuple[int, pb_grpc.EngineServiceStub]]:
    engine = await create_server(settings.model_copy(update={"host": "127.0.0.1", "port": 0}))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}", options=READ_AHEAD)
    try:
        yield engine.port, pb_grpc.EngineServiceStub(channel)
    finally:
        await channel.close()
        await engine.stop(0)


async def paused(stub: pb_grpc.EngineServiceStub, rid: str) -> int:
    """Wait until the generation stands still (its reader's flow control reached
    the engine); return how many tokens it had made by then."""
    last = -1
    async with asyncio.timeout(20):
        while True:
            found = (await stats(stub, rid)).generations
            made = found[0].tokens_generated if found else 0
            if made == last and made > 0:
                return made
            last = made
            await asyncio.sleep(0.1)  # a sample interval: "still" means unchanged across it


def expected_text() -> str:
    return "".join(token_text(i) for i in range(TOKENS))


async def test_engine_hop_a_stopped_reader_gets_what_piled_up_in_fewer_messages() -> None:
    async with engine_and_stub(EngineSettings(max_tokens_limit=TOKENS)) as (_, stub):
        rid = f"coalesce-{uuid.uuid4().hex[:8]}"
        call = stub.Generate(pb.GenerateRequest(
            request_id=rid, prompt="flood", max_tokens=TOKENS, accept_token_batches=True,
            timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=0, answer_tokens=TOKENS)))
        chunks: list[pb.TokenChunk] = []
        messages = 0
        async for response in call:
            kind = response.WhichOneof("event")
            if kind == "finish":
                break
            messages += 1
            chunks += [response.token] if kind == "token" else list(response.tokens.chunks)
            if messages == 1:  # stop reading until the engine feels it, then read on
                made = await paused(stub, rid)
                assert made < TOKENS, "the engine never felt the stopped reader"
    print(f"{TOKENS} tokens in {messages} gRPC messages (paused at {made})")
    assert [c.index for c in chunks] == list(range(TOKENS))
    assert "".join(c.text for c in chunks) == expected_text()
    assert messages < TOKENS


async def test_gateway_a_stopped_reader_catches_up_in_fewer_writes_than_tokens() -> None:
    async with engine_and_stub(EngineSettings(max_tokens_limit=TOKENS)) as (port, stub):
        app = create_app(GatewaySettings(engine_target=f"127.0.0.1:{port}",
                                         engine_read_ahead_bytes=4096))
        rid = f"coalesce-{uuid.uuid4().hex[:8]}"
        payload = chat_payload("flood", TOKENS, gap_ms=0)
        receive = body_once(payload)
        writes: list[bytes] = []
        first_write = asyncio.Event()
        resume = asyncio.Event()

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                writes.append(message["body"])
                first_write.set()
                await resume.wait()  # a socket that stops taking bytes until the reader reads

        async with app.router.lifespan_context(app):
            exchange = asyncio.ensure_future(app(scope(payload, rid), receive, send))
            try:
                async with asyncio.timeout(60):
                    await first_write.wait()
                    made = await paused(stub, rid)
                    resume.set()
                    await exchange
            finally:
                exchange.cancel()
    data = [line[6:] for line in b"".join(writes).decode().splitlines()
            if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1])
    print(f"{TOKENS} tokens in {len(writes)} socket writes (engine paused at {made})")
    assert text == expected_text()
    assert made < TOKENS
    assert len(writes) < TOKENS


async def test_gateway_a_streams_last_token_leaves_with_its_finish_in_one_write() -> None:
    """On the multiplexed wire a step's last token and the finish arrive in one
    SessionEvent: the gateway writes them, [DONE] and the body's end as one
    chunk (one syscall, one read on every hop in front), not the token and
    then the tail. Broken: a last write that carries no token, only the tail."""
    tokens = 5
    async with engine_and_stub(EngineSettings()) as (port, _):
        app = create_app(GatewaySettings(engine_target=f"127.0.0.1:{port}",
                                         engine_wire="multiplexed"))
        rid = f"last-{uuid.uuid4().hex[:8]}"
        payload = chat_payload("short", tokens, gap_ms=5)
        receive = body_once(payload)
        writes: list[tuple[bytes, bool]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body":
                writes.append((message.get("body", b""), message.get("more_body", False)))

        async with app.router.lifespan_context(app):
            async with asyncio.timeout(30):
                await app(scope(payload, rid), receive, send)

    def contents(body: bytes) -> list[str]:
        return [json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                for line in body.decode().splitlines()
                if line.startswith("data: {") and '"choices":[{' in line.replace(" ", "")]

    print(f"{tokens} tokens in {len(writes)} body writes")
    *before, (last, more) = writes
    assert not more, "the last chunk ends the body"
    assert all(more for _, more in before)
    assert b"data: [DONE]" in last
    assert all(b"[DONE]" not in body for body, _ in before)
    assert contents(last)[0] == token_text(tokens - 1), "the last token left on its own"
    assert "".join(t for body, _ in writes for t in contents(body)) == "".join(
        token_text(i) for i in range(tokens))
    assert len(writes) <= tokens


def chat_payload(content: str, tokens: int, gap_ms: int) -> bytes:
    return json.dumps({
        "messages": [{"role": "user", "content": content}], "stream": True,
        "max_tokens": tokens,
        "streamlab": {"prefill_ms": 0, "token_gap_ms": gap_ms, "answer_tokens": tokens,
                      "heartbeat_s": 0}}).encode()


def body_once(payload: bytes) -> Callable[[], Awaitable[MutableMapping[str, Any]]]:
    """An ASGI receive: the request's body, then nothing (the client never
    leaves; the wait is cancelled when the response ends)."""
    requested = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await asyncio.Future()
        raise AssertionError("unreachable")

    return receive


def scope(payload: bytes, rid: str) -> dict[str, Any]:
    path = "/v1/chat/completions"
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "server": ("gateway", 80),
            "client": ("127.0.0.1", 1234),
            "headers": [(b"content-type", b"application/json"),
                        (b"content-length", str(len(payload)).encode()),
                        (b"x-request-id", rid.encode())]}
