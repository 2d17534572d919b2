"""A take-over's claim is never left half done (redis_store.RedisStore):
once this replica has claimed a lost owner's stream, the adoption runs in a
task of its own that the reader who caused it cannot cancel by leaving, and
a stream it cannot run is ended `owner_lost` even through store errors.

The store's Redis calls are replaced here (no Redis: the claim and its
adoption's order is the logic under test); tests/integration/test_replica_loss.py
and the storms run the take-over on real Redis."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError

from services.gateway.resume.redis_keys import StreamKeys, StreamMeta, stream_keys
from services.gateway.resume.redis_store import KEY_PREFIX, RedisStore
from services.gateway.settings import GatewaySettings
from streamlab_protocol.generation import GenerationState

STREAM = "s" * 32


def meta(replica: str = "lost:1") -> StreamMeta:
    return StreamMeta(owner=None, replica=replica, state=GenerationState.RUNNING,
                      cancel_reason=None, last_seq=5, grace_s=10.0, ttl_s=120.0,
                      retry_ms=1000, max_events=1000, created=0.0)


def store() -> RedisStore:
    return RedisStore(GatewaySettings(resume_store="redis", replica_id="here:1"),
                      CollectorRegistry())


async def test_a_reader_that_leaves_mid_take_over_does_not_abandon_the_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = store()
    started, release = asyncio.Event(), asyncio.Event()
    adopted: list[tuple[str, int]] = []

    async def adopt(stream_id: str, _: StreamMeta, last_seq: int) -> None:
        started.set()
        await release.wait()
        adopted.append((stream_id, last_seq))

    monkeypatch.setattr(shared, "_adopt", adopt)
    keys = stream_keys(KEY_PREFIX, STREAM)
    reader = asyncio.create_task(shared._run_claimed(STREAM, keys, meta(), 5, 5))
    await started.wait()
    reader.cancel()  # its client left
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    assert STREAM in shared._adopting, "the adoption goes on without the reader"
    # A second reader (or the sweep) meanwhile waits on the same adoption.
    second = asyncio.create_task(shared._run_claimed(STREAM, keys, meta(), 5, 5))
    release.set()
    assert await asyncio.wait_for(second, 5.0) is True
    assert adopted == [(STREAM, 5)]
    assert STREAM not in shared._adopting


async def test_a_claimed_stream_that_cannot_run_is_ended_through_store_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = store()
    ends: list[str] = []

    async def adopt(*_: object) -> None:
        raise RuntimeError("a lease the gateway refused")

    async def end_orphaned(keys: StreamKeys, _: StreamMeta, reason: str, after: int = 0) -> None:
        ends.append(reason)
        if len(ends) < 3:
            raise RedisConnectionError("Connection reset by peer")

    monkeypatch.setattr(shared, "_adopt", adopt)
    monkeypatch.setattr(shared, "_end_orphaned", end_orphaned)
    keys = stream_keys(KEY_PREFIX, STREAM)
    assert await asyncio.wait_for(shared._run_claimed(STREAM, keys, meta(), 5, 5), 5.0)
    assert ends == ["owner_lost"] * 3, "tried again until the end was written"
