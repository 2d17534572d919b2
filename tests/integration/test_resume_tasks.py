"""Redis SIGKILLed and restarted under many streams: no background task of
the resume path dies, and no reader is left waiting on a stream nobody
advances.

The broken behaviour this guards against: a connection of the gateway's
Redis pool whose transport the kill reset was handed out again, and under
uvloop the write on it raised `RuntimeError('unable to perform operation on
<TCPTransport closed=True ...>; the handler is closed')`, which no handler
of the resume path caught. The owner's log writer (`LogMirror._run`) died
with it, silently: the owner finished the stream in memory, Redis kept it
`running` with the events written before the kill, the owner kept its alive
key fresh (so no replica took the stream over), and the readers on the other
gateway got `: ping` until their client gave up.

The restart: real redis-server with the lab's persistence (the append-only
file) behind a Toxiproxy hop as in the lab, gateways "a" (the owner of every
stream) and "b", one real engine (tests/integration/redis_fixtures.py); the
readers are the scenarios' EventSource-like readers, one per stream on each
gateway. Then each half of the fix on its own, against a real redis-server:
the store's client remakes a connection its peer reset (under uvloop, where
the plain client raises that RuntimeError), and the log writer outlives an
exception that is not a store error, writes everything, the end included,
and counts and logs it once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx
import pytest
import redis
import uvloop
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from services.gateway.resume.redis_client import CancelSafeRedis
from services.gateway.resume.redis_keys import StreamMeta, stream_keys
from services.gateway.resume.redis_log import LogMirror, StoreMetrics
from services.gateway.resume.redis_store import KEY_PREFIX
from services.gateway.resume.replay_log import Entry
from services.gateway.resume.tasks import TaskFailures
from streamlab.experiments.scenarios.resuming_readers import (
    TERMINAL_EVENTS,
    Reader,
    readers_done,
)
from streamlab.lab.endpoints import REDIS_PERSISTENCE
from streamlab.lab.own_toxiproxy import own_toxiproxy
from streamlab_protocol.generation import GenerationState
from tests.integration.redis_fixtures import (
    RedisServer,
    StartReplicas,
    create_stream,
)
from tests.integration.test_store_restart import Store, started_store
from tests.wait import wait_until, wait_until_async

pytestmark = pytest.mark.integration

STREAMS = 50  # the probe: 50 streams, a reader on each gateway
TOKENS, GAP_MS = 200, 100  # 20 s a stream: three kills and restarts land mid-stream
KILLS = 3
DOWN_S = 3.0  # how long Redis stays down (the probe: restarted 3 s later)
# Between kills, every reader still going on b (which reads the shared log)
# gets this many more tokens: the log moves again before the next kill.
PROGRESS_BETWEEN_KILLS = 5
# Every reader, on either gateway, has its terminal event within this after
# Redis is back: the streams end ~2 s later; the rest is the owner's writer
# reconnecting (its backoff is at most 2 s), a reader's `retry:` and slack
# for a loaded 2-core machine. The broken gateway left readers waiting ~1 h.
READERS_END_WITHIN_S = 25.0
# Redis holds the end of every stream (no stream left `running`) within this.
LOG_ENDS_WITHIN_S = 10.0
ENV = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": "1",
       # No stream is cancelled for want of readers while the store is down.
       "STREAMLAB_GATEWAY_RESUME_GRACE_S": "30",
       # Room for them all (the suite's caps are 25 a client, 30 on the engine).
       "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": str(2 * STREAMS),
       "STREAMLAB_GATEWAY_MAX_STREAMS": str(2 * STREAMS)}
ENGINE_ENV = {"STREAMLAB_ENGINE_MAX_RUNNING_GENERATIONS": str(2 * STREAMS)}
BODY = {"messages": [{"role": "user", "content": "outlive a redis restart"}],
        "streamlab": {"prefill_ms": 10, "token_gap_ms": GAP_MS, "answer_tokens": TOKENS},
        "resume": {"retry_ms": 100}}
UNRETRIEVED = "Task exception was never retrieved"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with started_store(tmp_path, REDIS_PERSISTENCE) as server:
        yield server


@pytest.fixture
def store_hop(store: Store, tmp_path: Path) -> Iterator[str]:
    """The gateways' Redis URL: through a Toxiproxy hop, as the lab's gateways
    reach it (its `store` hop). The hop outlives Redis: while Redis is down it
    accepts a connection and drops it at once, which a direct connection
    (refused) never shows the client."""
    with own_toxiproxy({"store": f"127.0.0.1:{store.port}"}, tmp_path / "store-hop") as hop:
        yield f"redis://127.0.0.1:{hop.listen['store']}/0"


def open_streams(store_url: str, ids: list[str]) -> list[str]:
    """The streams whose log in Redis does not end with a terminal event, or
    whose meta says `running` (a meta gone with its TTL counts as ended)."""
    client = redis.Redis.from_url(store_url, decode_responses=True, socket_timeout=2.0)
    try:
        left = []
        for stream_id in ids:
            keys = stream_keys(KEY_PREFIX, stream_id)
            state = client.hget(keys.meta, "state")
            last: list[tuple[str, dict[str, str]]] = client.xrevrange(  # type: ignore[assignment]
                keys.events, "+", "-", count=1)
            kind = last[0][1]["k"] if last else None
            if state == "running" or kind not in TERMINAL_EVENTS:
                left.append(f"{stream_id[:8]}: state {state}, last event {kind}")
        return left
    finally:
        client.close()


def metric(text: str, name: str) -> float:
    """The sum of a counter's samples in a /metrics page (0 when absent)."""
    return sum(float(m.group(1)) for m in
               re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.MULTILINE))


@pytest.mark.anyio
async def test_a_redis_restart_leaves_no_stream_running_and_no_reader_waiting(
        store: Store, store_hop: str, start_replicas: StartReplicas) -> None:
    replicas = start_replicas(store_hop, ENGINE_ENV, **ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        ids = [create_stream(http, a, BODY) for _ in range(STREAMS)]
    readers = {name: [Reader("127.0.0.1", httpx.URL(url).port or 80,
                             f"/v1/streams/{stream_id}/events", retry_ms=100,
                             watchdog_s=READERS_END_WITHIN_S)
                      for stream_id in ids]
               for name, url in (("a", a), ("b", b))}
    everyone = [reader for group in readers.values() for reader in group]
    reading = asyncio.gather(*(reader.run() for reader in everyone))
    try:
        for kill in range(KILLS):
            # Every reader on b (which reads the shared log) has moved on since
            # the last restart: each kill lands mid-stream, the writers busy.
            seen = [len(r.tokens) for r in readers["b"]]
            def moved(seen: list[int] = seen) -> bool:
                return all(len(r.tokens) >= n + PROGRESS_BETWEEN_KILLS or r.terminal is not None
                           for r, n in zip(readers["b"], seen, strict=True))

            try:
                await anyio.to_thread.run_sync(functools.partial(
                    wait_until, moved, timeout_s=20.0,
                    what=f"every reader on b moving before kill {kill + 1}"))
            except AssertionError:
                break  # some stream froze at the last restart: the asserts below say which
            store.kill()  # SIGKILL
            await anyio.sleep(DOWN_S)  # the outage itself, not a wait for something
            await anyio.to_thread.run_sync(store.start)
        await readers_done(reading, READERS_END_WITHIN_S + TOKENS * GAP_MS / 1000)
    finally:
        if not reading.done():
            reading.cancel()
    hung = {name: [f"{r.path.split('/')[3][:8]}: {len(r.tokens)} tokens, ends {r.ends[-3:]}"
                   for r in group if r.terminal is None]
            for name, group in readers.items()}
    try:  # the owner's writers have their bound to write the ends
        await anyio.to_thread.run_sync(lambda: wait_until(
            lambda: not open_streams(store.url, ids), timeout_s=LOG_ENDS_WITHIN_S,
            what="every stream's end in Redis"))
        left_running: list[str] = []
    except AssertionError:
        left_running = await anyio.to_thread.run_sync(open_streams, store.url, ids)
    with httpx.Client(timeout=5.0) as http:
        failures = {name: metric(http.get(f"{url}/metrics").text,
                                 "streamlab_gateway_resume_task_failures_total")
                    for name, url in replicas.gateways.items()}
    logs = {name: replicas.processes[name].log.read_text(errors="replace")
            for name in ("a", "b")}
    unretrieved = {name: text.count(UNRETRIEVED) for name, text in logs.items()}
    terminals = sum(r.terminal is not None for r in everyone)
    print(f"\n{terminals}/{len(everyone)} readers ended with a terminal event; "
          f"hung on a: {len(hung['a'])}, on b: {len(hung['b'])}; "
          f"streams left running in Redis: {len(left_running)}/{STREAMS}; "
          f"'{UNRETRIEVED}' in the logs: {unretrieved}; task failures counted: {failures}")
    assert unretrieved == {"a": 0, "b": 0}, [
        line for text in logs.values() for line in text.splitlines() if UNRETRIEVED in line][:5]
    assert hung == {"a": [], "b": []}, f"readers with no terminal event: {hung}"
    assert left_running == [], "streams whose log in Redis never ended"


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    # Either side reset or closed: the link is over (uvloop raises
    # RuntimeError for a write on a closed transport).
    with contextlib.suppress(OSError, RuntimeError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()


class ResettingHop:
    """A TCP hop to Redis that resets (RST) every client connection it holds
    when told: what a Redis SIGKILLed with requests unread, or a hop in front
    of it, does to a client's idle pooled connections."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self._links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        self._links.append((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
            writer.close()

    def reset(self) -> None:
        for client, upstream in self._links:
            client.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.transport.abort()  # linger 0: the close is a reset
            upstream.close()
        self._links.clear()

    async def close(self) -> None:
        self.reset()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.gather(*self._handlers, return_exceptions=True)


def test_a_connection_its_peer_reset_is_made_again_not_written_to(
        redis_server: RedisServer) -> None:
    """A reset leaves the connection's reader holding the error, not at EOF,
    so redis-py's check before it hands a pooled connection out passes it;
    under uvloop (the gateway's loop) the write on it raises RuntimeError. The
    store's client makes the connection again and answers."""
    async def get_after_a_reset(client_class: type[Redis]) -> str:
        hop = ResettingHop(redis_server.port)
        client = client_class.from_url(f"redis://127.0.0.1:{await hop.start()}/0",
                                       socket_timeout=1.0, decode_responses=True)
        try:
            await client.set("reset-me", "still here")  # one connection, back in the pool
            # redis-py's private pool list: the one connection to watch.
            pooled = client.connection_pool._available_connections[0]
            hop.reset()
            await wait_until_async(
                lambda: pooled._writer is not None and pooled._writer.transport.is_closing(),
                timeout_s=5.0, what="the reset seen by the client's transport")
            try:
                return f"answered {await client.get('reset-me')!r}"
            except Exception as exc:  # what the plain client does is the point
                return f"raised {type(exc).__name__}"
        finally:
            await client.aclose()
            await hop.close()

    plain = uvloop.run(get_after_a_reset(Redis))
    ours = uvloop.run(get_after_a_reset(CancelSafeRedis))
    print(f"\nafter a reset under uvloop: redis-py's client {plain}; the store's {ours}")
    assert plain == "raised RuntimeError", "the test reaches what broke the log writer"
    assert ours == "answered 'still here'"


@pytest.mark.anyio
async def test_the_log_writer_outlives_an_exception_that_is_not_a_store_error(
        redis_server: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Its first two attempts fail with a RuntimeError (a stand-in for any
    bug on the way to the store): the writer retries, writes every event and
    the end, counts both failures and logs the first."""
    registry = CollectorRegistry()
    metrics = StoreMetrics(registry, TaskFailures(registry))
    client = CancelSafeRedis.from_url(redis_server.url, socket_timeout=1.0,
                                      decode_responses=True)
    keys = stream_keys("test-resume-tasks", uuid.uuid4().hex)
    stream = SimpleNamespace(state=GenerationState.RUNNING, last_seq=0, failures_left=2)

    def meta() -> StreamMeta:
        if stream.failures_left:
            stream.failures_left -= 1
            raise RuntimeError("not a store error")
        return StreamMeta(owner=None, replica="a", state=stream.state, cancel_reason=None,
                          last_seq=stream.last_seq, grace_s=1.0, ttl_s=60.0, retry_ms=100,
                          max_events=100, created=time.time())

    mirror = LogMirror(client, keys, meta, running_ttl_s=60.0, pending_max=100,
                       metrics=metrics)
    try:
        with caplog.at_level(logging.DEBUG, logger="streamlab.gateway"):
            writer = mirror.start(tombstone_s=60.0)
            for seq, kind in enumerate(("token", "token", "token", "done"), start=1):
                data = json.dumps({"index": seq - 1, "text": "x"} if kind == "token" else {})
                mirror.add(Entry(seq, kind, data, len(data)))
                stream.last_seq = seq
            stream.state = GenerationState.COMPLETED
            await wait_until_async(writer.done, timeout_s=10.0, what="the writer to finish")
        assert writer.exception() is None
        entries = await client.xrange(keys.events, "-", "+")
        assert [fields["k"] for _, fields in entries] == ["token", "token", "token", "done"]
        assert await client.hget(keys.meta, "state") == "completed"
        assert registry.get_sample_value("streamlab_gateway_resume_task_failures_total",
                                          {"task": "log_writer"}) == 2
        logged = [r for r in caplog.records
                  if r.levelno >= logging.ERROR and "log_writer" in r.getMessage()]
        assert len(logged) == 1, logged
        assert logged[0].exc_info is not None, "logged with its traceback"
    finally:
        await client.delete(keys.events, keys.meta, keys.followers, keys.attaches,
                            keys.readers, keys.gone)
        await client.aclose()
