"""Trouble that passes is not an end: a resumable stream's reader gets every
token exactly once and `done` through a store blip, its own gateway paused,
and an engine-hop blip. Real processes: a private lab of 2 gateways sharing
Redis (behind the `store` hop), 2 engines (each behind its `engine` hop),
Toxiproxy, for this module alone.

The client is the project's own resume client (services/client/
resume_stream.py), reading one gateway directly. Each fault is set once the
reader is a few tokens in.

The broken thing each verdict guards against is the gateway's old answer to
the same fault, still reachable as `STREAMLAB_GATEWAY_RESUME_TRANSIENT=terminal`
(run this module with it set and every test fails): a reader on a gateway
that does not own the stream got a terminal `error` (`resume_store_unavailable`)
when the store blipped or when its gateway was paused past its store
timeouts, and an engine-hop blip ended the stream `error` for good while the
engine finished the generation for nobody.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest

from services.client.resume_stream import ResumeResult, create_stream, follow_stream
from services.engine.backends.fake import token_text
from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.sse import Event, SSEDecoder
from tests.integration.conftest import replica_test_lab
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.local_only(
    "a private lab of its own (2 gateways, 2 engines): nothing of the compose lab's")]

OWNER, OTHER = "gateway", "gateway-2"
ENGINE_HOPS = ("engine", "engine-2")
TOKENS, GAP_MS = 40, 100  # 4 s of tokens: live through each fault
FAULT_AFTER_TOKENS = 5
EXPECTED = "".join(token_text(i) for i in range(TOKENS))
# The reader's own watchdog: longer than the 10 s pause, so only the gateway's
# answer decides how the reader ends, and no test hangs.
READ_TIMEOUT_S = 30.0
# A stream nobody attaches to within this is cancelled `never_attached` (the
# default is 10 s). Longer than the first attempt takes to be noted through the
# slow store: the first resume's 1 s bound, then a new connection's and a
# script's round trips (about 5 of SLOW_STORE_MS each).
ATTACH_TIMEOUT_S = 10.0
# Slower than the other gateway's store bound (1 s: each of its resumes answers
# `retry`), well within the bound of its background write of the attempt (10 s).
SLOW_STORE_MS = 1200
# Whatever the environment says (the module docstring's broken run sets it).
TRANSIENT = os.environ.get("STREAMLAB_GATEWAY_RESUME_TRANSIENT", "retry")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with replica_test_lab(
            tmp_path_factory.mktemp("resume-transient"),
            {"STREAMLAB_GATEWAY_RESUME_TRANSIENT": TRANSIENT,
             "STREAMLAB_GATEWAY_RESUME_ATTACH_TIMEOUT_S": str(ATTACH_TIMEOUT_S)},
            gateways=2, engines=2) as private:
        yield private


def body() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "through the blip"}],
            "streamlab": {"prefill_ms": 10, "token_gap_ms": GAP_MS, "answer_tokens": TOKENS},
            "resume": {"retry_ms": 200}}


async def read_through(lab: Lab, reader_on: str, fault: Callable[[], None]) -> ResumeResult:
    """Create a stream on the owner, read it on `reader_on`, and run `fault`
    (blocking, in a thread) once the reader has FAULT_AFTER_TOKENS tokens."""
    started = anyio.Event()

    def on_token(index: int, _text: str) -> None:
        if index + 1 >= FAULT_AFTER_TOKENS:
            started.set()

    async with httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=5.0)) as client:
        created = await create_stream(client, lab.url_of(OWNER), body())
        result: ResumeResult | None = None

        async def read() -> None:
            nonlocal result
            result = await follow_stream(client, lab.url_of(reader_on), created,
                                         on_token=on_token, max_connections=200)

        async with anyio.create_task_group() as group:
            group.start_soon(read)
            with anyio.fail_after(20):
                await started.wait()
            await anyio.to_thread.run_sync(fault)
    assert result is not None
    return result


def assert_whole(result: ResumeResult) -> None:
    assert result.terminal == "done", (result.terminal, result.terminal_data, result.error,
                                       [c.ended for c in result.connections])
    assert result.indexes == list(range(TOKENS)), "every token exactly once, in order"
    assert result.text == EXPECTED


@pytest.fixture
def hops(lab: Lab) -> Iterator[None]:
    """Whatever a test turned off is on again after it."""
    yield
    with lab.toxiproxy() as toxiproxy:
        for hop in (*lab.hops_of("store"), *ENGINE_HOPS):
            toxiproxy.set_enabled(hop, True)


async def test_a_store_blip_is_retried_and_the_reader_elsewhere_ends_whole(
        lab: Lab, hops: None) -> None:
    def blip() -> None:
        with lab.toxiproxy() as toxiproxy:
            for hop in lab.hops_of("store"):  # every gateway's: the store itself blips
                toxiproxy.set_enabled(hop, False)  # refused, and every connection closed
            time.sleep(2.0)
            for hop in lab.hops_of("store"):
                toxiproxy.set_enabled(hop, True)

    result = await read_through(lab, OTHER, blip)
    assert_whole(result)
    assert result.retries, "the reader met the blip (it was told to come back)"
    assert {r["code"] for r in result.retries} == {"resume_store_unavailable"}


async def test_a_paused_gateways_reader_comes_back_and_ends_whole(lab: Lab) -> None:
    """SIGSTOP for 10 s the gateway the reader is on (not the owner): Redis is
    healthy, but the paused process's store calls outlive their timeouts."""
    pid = lab.pids[OTHER]

    def pause() -> None:
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(10.0)
        finally:
            os.kill(pid, signal.SIGCONT)

    assert_whole(await read_through(lab, OTHER, pause))


async def test_an_engine_hop_blip_reattaches_and_the_reader_ends_whole(
        lab: Lab, hops: None) -> None:
    """Both engine hops off for 2 s under a stream the reader follows on its
    owner: the owner attaches to the same generation again when the hop is
    back (no second generation), and the reader sees only a pause."""
    before = lab.engine_stats()

    def blip() -> None:
        with lab.toxiproxy() as toxiproxy:
            for hop in ENGINE_HOPS:
                toxiproxy.set_enabled(hop, False)
            time.sleep(2.0)
            for hop in ENGINE_HOPS:
                toxiproxy.set_enabled(hop, True)

    result = await read_through(lab, OWNER, blip)
    assert_whole(result)
    after = lab.engine_stats()
    assert after.generations_started - before.generations_started == 1, "one generation"
    assert after.generations_reattached - before.generations_reattached >= 1, "re-attached"


async def test_a_killed_owners_stream_nobody_reads_is_taken_over_by_the_sweep(
        lab: Lab) -> None:
    """The owner SIGKILLed while its stream's client is away (no reader
    anywhere): the other gateway's sweep takes the stream over within the
    alive key's expiry plus a sweep, not when a reader happens to come back
    and look; the client resuming later gets the rest exactly once. Without
    the sweep nothing takes it over until a reader comes (and in a storm that
    came after the engine's orphan grace: `owner_lost`)."""
    owner, survivor = lab.url_of(OTHER), lab.url_of(OWNER)
    async with httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=5.0)) as client:
        created = await create_stream(client, owner, {**body(), "streamlab": {
            "prefill_ms": 10, "token_gap_ms": 200, "answer_tokens": TOKENS}})
        first: list[int] = []  # the token indexes read before the client went away
        decoder = SSEDecoder()
        async with client.stream("GET", f"{owner}{created['events_url']}") as response:
            async for chunk in response.aiter_bytes():
                first += [json.loads(e.data)["index"] for e in decoder.feed(chunk)
                          if isinstance(e, Event) and e.event == "token"]
                if len(first) >= FAULT_AFTER_TOKENS:
                    break
        taken_from = (await client.get(f"{survivor}/v1/streams/{created['id']}")).json()
        await anyio.to_thread.run_sync(lab.kill_service, OTHER)
        try:
            killed_at = time.monotonic()

            async def taken_over() -> bool:
                status = (await client.get(f"{survivor}/v1/streams/{created['id']}")).json()
                return bool(status["replica"] != taken_from["replica"])

            await wait_until_async(taken_over, timeout_s=15.0, interval_s=0.1,
                                   what="the survivor's sweep taking the stream over")
            print(f"\ntaken over {time.monotonic() - killed_at:.2f} s after the kill, "
                  "nobody reading")
            rest = await follow_stream(client, survivor, created,
                                       last_event_id=f"{created['id']}:{len(first)}")
        finally:
            await anyio.to_thread.run_sync(lab.start_service, OTHER)
    assert rest.terminal == "done", (rest.terminal, rest.terminal_data)
    assert first + rest.indexes == list(range(TOKENS)), "each token once"


async def test_a_reader_told_to_retry_before_it_ever_attached_keeps_its_stream(
        lab: Lab, hops: None) -> None:
    """The other gateway's store is slow (its reads time out; Redis is up, as
    under a reconnect storm on a loaded machine): its answer to the reader's
    first GETs is `event: retry`, so no reader ever attaches while the
    owner's attach timeout passes. The gateway notes each attempt in the
    stream's record, the owner finds a reader came and gives it its grace,
    and the reader, once the store answers again, reads the whole text. The
    broken behaviour (no attempt noted): the owner cancelled the stream
    `never_attached` while its reader kept retrying."""
    other_store = lab.hops_of("store")[1]
    async with httpx.AsyncClient(timeout=httpx.Timeout(READ_TIMEOUT_S, connect=5.0)) as client:
        with lab.toxiproxy() as toxiproxy:
            toxiproxy.add_toxic(other_store, Toxic("latency", {"latency": SLOW_STORE_MS}))
            created = await create_stream(client, lab.url_of(OWNER), body())
            created_at = time.monotonic()
            result: ResumeResult | None = None

            async def read() -> None:
                nonlocal result
                result = await follow_stream(client, lab.url_of(OTHER), created,
                                             max_connections=200)

            async with anyio.create_task_group() as group:
                group.start_soon(read)

                async def attempt_noted() -> bool:
                    status = (await client.get(
                        f"{lab.url_of(OWNER)}/v1/streams/{created['id']}")).json()
                    return any(a["at"] < 0 for a in status["attaches"])

                await wait_until_async(attempt_noted, timeout_s=15.0, interval_s=0.2,
                                       what="the retried reader's attempt in the record")
                # The slow store outlasts the attach timeout: the owner decides
                # meanwhile (the fault's length, not a wait for something).
                await anyio.sleep(max(0.0, created_at + ATTACH_TIMEOUT_S + 1.0 - time.monotonic()))
                toxiproxy.reset()
    assert result is not None
    assert result.retries, "the reader was told to come back before it attached"
    assert_whole(result)
