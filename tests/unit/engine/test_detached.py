"""Detachable generations (services/engine/detached.py) without a server: the
buffer's bound, re-attach from an index, the newest Attach winning, the grace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from services.engine.backends.base import ACCEPTED, Accepted
from services.engine.detached import (
    Attachment,
    AttachRefused,
    Detachables,
    DetachedGeneration,
    Replaced,
)
from services.engine.stats import EngineStats
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.wait import wait_until_async

pytestmark = pytest.mark.anyio


class Events:
    """A generation of `count` tokens, as the servicer's event stream yields them."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.made = 0
        self.closed_early = False

    async def run(self) -> AsyncGenerator[pb.GenerateResponse | Accepted, None]:
        yield ACCEPTED
        try:
            for index in range(self.count):
                self.made += 1
                yield pb.GenerateResponse(token=pb.TokenChunk(index=index, text=f"t{index} "))
                await asyncio.sleep(0)
            yield pb.GenerateResponse(finish=pb.Finish(reason=pb.FINISH_REASON_STOP))
        except GeneratorExit:
            self.closed_early = True
            raise
        except asyncio.CancelledError:
            self.closed_early = True
            raise


def start(count: int, grace_s: float = 30.0, buffer_tokens: int = 8
          ) -> tuple[Detachables, DetachedGeneration, Events]:
    registry = Detachables(EngineStats(16), grace_s, buffer_tokens)
    events = Events(count)
    held = registry.start("r", registry.stats.begin("r"), events.run(), lambda: None)
    return registry, held, events


async def read(held: DetachedGeneration, attachment: Attachment, tokens: int | None = None
               ) -> list[int]:
    """Token indexes one consumer gets: `tokens` of them, or all until the finish."""
    indexes: list[int] = []
    async for message in held.follow(attachment, batches=False):
        assert isinstance(message, pb.GenerateResponse)
        if message.WhichOneof("event") == "token":
            indexes.append(message.token.index)
            if tokens is not None and len(indexes) == tokens:
                break
    return indexes


async def made(held: DetachedGeneration, tokens: int) -> None:
    """Let the loop turn until the generation has made `tokens` (bounded: no hang)."""
    for _ in range(10_000):
        if held.produced >= tokens:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"only {held.produced} of {tokens} tokens made")


async def orphan_after(held: DetachedGeneration, tokens: int) -> int:
    """A first consumer reads until `tokens` are made, then its call dies (no
    Cancel); how many it had taken."""
    attachment = held.attach(None)
    consumer = asyncio.create_task(read(held, attachment, tokens + 1000))
    await made(held, tokens)
    consumer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await consumer
    return attachment.next_index


async def still(held: DetachedGeneration) -> int:
    """Spin the loop until the producer stops producing; how many it made."""
    last = -1
    for _ in range(200):
        await asyncio.sleep(0)
        if held.produced == last:
            break
        last = held.produced
    return held.produced


async def test_an_orphan_holds_where_its_reader_left_it() -> None:
    # A buffer far above what the reader left unread: what bounds the orphan
    # is that it is an orphan. One that ran on into its buffer finished short
    # generations for nobody when a gateway's Cancel was lost (the gateway had
    # told its clients `cancelled`).
    registry, held, events = start(30, buffer_tokens=64)
    taken = await orphan_after(held, 3)
    at_orphaning = held.produced
    made = await still(held)
    assert registry.stats.orphaned == 1
    assert made <= max(at_orphaning, taken + 1), "it generated on, orphaned"
    assert held.terminal is None, "it ran to its finish for nobody"
    assert not events.closed_early
    # Re-attached, it goes on from where it held, to the finish.
    assert await read(held, held.attach(taken - 1)) == list(range(taken, 30))
    held.stop()


async def test_reattach_gets_each_token_after_the_index_once_then_the_finish() -> None:
    registry, held, _ = start(40, buffer_tokens=8)
    await orphan_after(held, 5)
    await still(held)
    _, attachment = registry.attach("r", 4)
    assert await read(held, attachment) == list(range(5, 40))
    assert registry.stats.reattached == 1


async def test_a_newer_attach_replaces_the_attached_consumer() -> None:
    registry, held, _ = start(40)
    first = asyncio.create_task(read(held, held.attach(None)))
    await made(held, 3)
    _, second = registry.attach("r", 1)
    with pytest.raises(Replaced):
        await first
    assert await read(held, second) == list(range(2, 40))


async def test_attach_refuses_an_unknown_id_and_an_index_out_of_range() -> None:
    registry, held, _ = start(100, buffer_tokens=8)
    await orphan_after(held, 20)
    await still(held)
    with pytest.raises(AttachRefused) as unknown:
        registry.attach("nobody", None)
    assert unknown.value.status == "NOT_FOUND"
    with pytest.raises(AttachRefused) as ahead:
        registry.attach("r", held.produced + 5)
    assert ahead.value.status == "OUT_OF_RANGE"
    with pytest.raises(AttachRefused) as evicted:
        registry.attach("r", 0)  # tokens the dead consumer took, long trimmed
    assert evicted.value.status == "OUT_OF_RANGE"
    held.stop()


async def test_with_no_grace_the_orphan_is_cancelled_at_once() -> None:
    registry, held, events = start(100, grace_s=0.0)
    await orphan_after(held, 3)
    await asyncio.gather(held.task, return_exceptions=True)
    assert events.closed_early
    assert registry.stats.orphan_expired == 1
    assert registry.get("r") is None


async def messages(held: DetachedGeneration, attachment: Attachment) -> list[str]:
    """What one consumer gets, as `token <index>` and `finish`, until its stream ends."""
    got: list[str] = []
    async for message in held.follow(attachment, batches=False):
        assert isinstance(message, pb.GenerateResponse)
        kind = message.WhichOneof("event")
        got.append(f"token {message.token.index}" if kind == "token" else kind)
    return got


async def test_a_delivered_generation_replays_its_tail_and_finish_to_an_attach() -> None:
    # A draining gateway's call wrote the last tokens and the finish, then was
    # cancelled before its owner stored them: the replica taking over Attaches
    # from the last index it has and must get the rest, not NOT_FOUND.
    registry, held, _ = start(20, grace_s=30.0, buffer_tokens=8)
    first = await messages(held, held.attach(None))
    assert first == [f"token {i}" for i in range(20)] + ["finish"]
    assert "r" not in registry, "ended: a new generation of the id may start"
    _, attachment = registry.attach("r", 16)
    assert await messages(held, attachment) == ["token 17", "token 18", "token 19", "finish"]
    _, again = registry.attach("r", 19)  # everything stored but the finish
    assert await messages(held, again) == ["finish"]
    assert registry.stats.orphaned == 0
    assert registry.stats.orphan_expired == 0
    assert held.stop() is False, "ended already: nothing to cancel"
    with pytest.raises(AttachRefused) as cancelled:
        registry.attach("r", 16)
    assert cancelled.value.status == "NOT_FOUND", "an explicit Cancel forgets it at once"


async def test_a_delivered_generation_is_forgotten_when_the_grace_ends() -> None:
    registry, held, _ = start(5, grace_s=0.05)
    await messages(held, held.attach(None))
    await wait_until_async(lambda: registry.get("r") is None, timeout_s=5.0, interval_s=0.01,
                           what="the generation forgotten after its 0.05 s grace")
    with pytest.raises(AttachRefused) as gone:
        registry.attach("r", 3)
    assert gone.value.status == "NOT_FOUND"
