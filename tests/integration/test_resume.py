"""Resume with Last-Event-ID on the real chain, cut on purpose by Toxiproxy.

Every cut is deterministic: a `limit_data` toxic lets exactly N bytes of one
connection through and then closes it, on `edge` (client ↔ nginx) or on
`upstream` (nginx ↔ gateway). The resuming client must end with every token
exactly once, in order, and the same text as an uncut run.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.client.resume_stream import ResumeResult, create_stream, follow_stream
from services.engine.backends.fake import token_text
from streamlab.lab.local import Lab
from streamlab.lab.toxiproxy import Toxic, Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.sse import Comment, SSEDecoder
from tests.integration.conftest import TEST_HEARTBEAT_S
from tests.integration.engine_probe import wait_for_generation_end
from tests.integration.wire import capture, header_length, offset_after
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOKENS, GAP_MS, PREFILL_MS, RETRY_MS = 30, 10, 20, 50
EXPECTED = "".join(token_text(i) for i in range(TOKENS))  # has "naïve", "café", "—"


def stream_body(tokens: int = TOKENS, gap_ms: int = GAP_MS, prefill_ms: int = PREFILL_MS,
                **resume: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "resume me"}],
            "streamlab": {"prefill_ms": prefill_ms, "token_gap_ms": gap_ms,
                          "answer_tokens": tokens},
            "resume": {"retry_ms": RETRY_MS, **resume}}


async def follow(client: httpx.AsyncClient, base_url: str, created: dict[str, Any],
                 **options: Any) -> ResumeResult:
    # A cut before the first `retry:` would otherwise wait a browser's 3 s.
    return await follow_stream(client, base_url, created, default_retry_ms=RETRY_MS, **options)


@pytest.fixture
async def fresh() -> AsyncIterator[httpx.AsyncClient]:
    """A client that opens a new connection per request: each GET is its own
    Toxiproxy link, so a toxic's byte count starts at that response."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0),
                                 limits=httpx.Limits(max_keepalive_connections=0)) as client:
        yield client


@pytest.fixture
def toxiproxy(lab: Lab) -> Iterator[Toxiproxy]:
    client = lab.toxiproxy()
    try:
        yield client
    finally:
        client.close()


def cut_connections(toxiproxy: Toxiproxy, hops: tuple[str, ...], cuts: list[int]
                    ) -> Callable[[int], Awaitable[None]]:
    """before_connect hook: connection n is cut after cuts[n] bytes on each of
    `hops` (`lab.hops_of(kind)`: with replicas a connection may go through any
    gateway's upstream hop); later ones run clean. (Toxiproxy's API answers in
    a millisecond or two, so the sync client is fine here: no stream is open
    while it runs.)"""
    async def before(attempt: int) -> None:
        toxiproxy.reset()
        if attempt < len(cuts):
            for hop in hops:
                toxiproxy.add_toxic(hop, Toxic("limit_data", {"bytes": cuts[attempt]}))
    return before


def cut_first_connection(toxiproxy: Toxiproxy, hops: tuple[str, ...], at_byte: int
                         ) -> Callable[[int], Awaitable[None]]:
    return cut_connections(toxiproxy, hops, [at_byte])


_reference: dict[tuple[int, str], bytes] = {}


async def reference_wire(lab: Lab, client: httpx.AsyncClient, hop: str) -> bytes:
    """The bytes an uncut stream of the standard shape puts on `hop` (captured
    once per lab and hop: every such stream has the same layout)."""
    key = (lab.ports.edge_port, hop)
    if key not in _reference:
        created = await create_stream(client, lab.edge_url, stream_body())
        port = lab.ports.edge_port if hop == "edge" else lab.ports.upstream_port
        _reference[key] = await capture(lab.ports.host, port, created["events_url"])
    return _reference[key]


def ends_mid_character(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data"
    return False


async def test_uncut_stream_has_ids_retry_and_the_same_text_as_the_openai_route(
    lab: Lab, fresh: httpx.AsyncClient
) -> None:
    created = await create_stream(fresh, lab.edge_url, stream_body())
    result = await follow(fresh, lab.edge_url, created)

    assert result.terminal == "done", result.error
    assert result.text == EXPECTED
    assert result.indexes == list(range(TOKENS))
    (conn,) = result.connections
    assert conn.status == 200
    assert conn.response_last_event_id == f"{created['id']}:0"
    body = bytes(conn.raw).decode()
    assert body.startswith(f"retry: {RETRY_MS}\n\n")
    assert f"id: {created['id']}:1\nevent: token\n" in body
    assert f"id: {created['id']}:{TOKENS + 1}\nevent: done\n" in body

    whole = await fresh.post(f"{lab.edge_url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "resume me"}],
        "streamlab": stream_body()["streamlab"]})
    assert whole.json()["choices"][0]["message"]["content"] == result.text


# Where the first connection is cut, as a marker in the reference bytes.
CUTS: dict[str, Callable[[bytes], int]] = {
    "in_headers": lambda w: header_length(w) - 10,
    "after_retry": lambda w: offset_after(w, f"retry: {RETRY_MS}\n\n".encode()),
    "after_id_line": lambda w: offset_after(w, b":5\n"),
    "mid_data": lambda w: offset_after(w, b'"index":3,'),
    "before_blank_line": lambda w: w.index(b"\n", offset_after(w, b'"index":7,')) + 1,
    "mid_utf8_naive": lambda w: offset_after(w, b"na\xc3"),
    "mid_utf8_cafe": lambda w: offset_after(w, b"caf\xc3"),
    "mid_utf8_dash": lambda w: offset_after(w, b"\xe2\x80"),
    # Well inside the terminal event: through nginx the last token and `done`
    # may share one chunk or not, which moves later offsets by a chunk header.
    "in_terminal": lambda w: offset_after(w, b'event: done\ndata: {"finish_reason":'),
}
MID_EVENT = {"after_id_line", "mid_data", "before_blank_line", "mid_utf8_naive",
             "mid_utf8_cafe", "mid_utf8_dash", "in_terminal"}


# Left out: ("upstream", "in_headers"): nginx answers it with a 502, and an
# EventSource gives up on any status but 200 (as it should: there is nothing
# to resume yet). ("edge", "in_terminal"): nginx re-chunks what it reads, and
# on a busy machine several events share a chunk, so offsets through nginx
# drift by a few bytes per event; near the very end that can run past the
# stream. On `upstream` the aim is exact, and that case runs there.
CUT_CASES = [(hop, where) for hop in ("edge", "upstream") for where in sorted(CUTS)
             if (hop, where) not in {("upstream", "in_headers"), ("edge", "in_terminal")}]


@pytest.mark.parametrize(("hop", "where"), CUT_CASES)
async def test_a_cut_anywhere_resumes_every_token_exactly_once(
    lab: Lab, fresh: httpx.AsyncClient, toxiproxy: Toxiproxy, hop: str, where: str
) -> None:
    wire = await reference_wire(lab, fresh, hop)
    at_byte = CUTS[where](wire)

    created = await create_stream(fresh, lab.edge_url, stream_body())
    result = await follow(fresh, lab.edge_url, created,
                                 before_connect=cut_first_connection(
                                     toxiproxy, lab.hops_of(hop), at_byte))

    assert result.terminal == "done", result.error
    assert result.text == EXPECTED
    assert result.indexes == list(range(TOKENS)), "every token once, in order"
    assert result.gaps == []
    first, second = result.connections
    assert first.ended == "transport", first
    # It resumed after the last event it had *completely* received.
    seen = first.events
    assert second.sent_last_event_id == (f"{created['id']}:{seen}" if seen else None)
    assert second.response_last_event_id == f"{created['id']}:{seen}"
    if hop == "upstream" and where in MID_EVENT:
        # uvicorn writes one chunk per event, so on this hop the aim is exact.
        assert not bytes(first.raw).endswith(b"\n\n")
        assert ends_mid_character(bytes(first.raw)) == where.startswith("mid_utf8")


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hop=st.sampled_from(["edge", "upstream"]),
       cuts=st.lists(st.integers(min_value=0, max_value=2400), min_size=1, max_size=4))
async def test_any_cuts_on_any_hop_still_give_the_uncut_text(
    lab: Lab, fresh: httpx.AsyncClient, toxiproxy: Toxiproxy, hop: str, cuts: list[int]
) -> None:
    """`cuts[n]` is where connection n is cut, in bytes after its headers."""
    # The autouse reset runs per test, not per example: start each one clean.
    await cut_connections(toxiproxy, lab.hops_of(hop), [])(0)
    wire = await reference_wire(lab, fresh, hop)
    # A little under the headers' length: resumed responses carry a longer
    # Last-Event-ID header, and on `upstream` a cut inside headers is a 502.
    headers = header_length(wire) + 4
    created = await create_stream(fresh, lab.edge_url, stream_body())
    result = await follow(
        fresh, lab.edge_url, created,
        before_connect=cut_connections(toxiproxy, lab.hops_of(hop),
                                       [headers + cut for cut in cuts]))

    assert result.terminal == "done", (result.error, cuts)
    assert result.text == EXPECTED
    assert result.indexes == list(range(TOKENS))
    assert len(result.connections) <= len(cuts) + 1
    if headers + cuts[0] < len(wire) - 200:  # well before the end: a cut really happened
        assert result.connections[0].ended != "terminal", (cuts, result.connections[0])
        assert len(result.connections) >= 2


async def test_no_reconnect_within_grace_cancels_at_the_engine_then_reconnect_is_told(
    lab: Lab, fresh: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    grace_s = 2.0
    created = await create_stream(fresh, lab.edge_url,
                                  stream_body(tokens=400, gap_ms=20, grace_s=grace_s))
    stream_id = created["id"]
    cut = await follow(fresh, lab.edge_url, created, resume=False,
                              before_connect=cut_first_connection(
                                  toxiproxy, lab.hops_of("edge"), 700))
    assert cut.error is not None
    assert cut.error["code"] == "truncated"
    assert cut.connections[0].ended == "transport"
    received = len(cut.tokens)

    # Within the grace the generation keeps running for the client to come back.
    record = lab.engine_stats(stream_id).generations[0]
    assert record.state == pb.GENERATION_STATE_RUNNING
    # Nobody comes back: cancelled at the engine, as a closed tab would be.
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, stream_id,
                                            grace_s + 5.0)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    # The cut came after the start, and the cancel at least a grace after the cut.
    assert record.cancelled_at - record.started_at >= grace_s
    assert record.tokens_generated < 400
    status = (await fresh.get(f"{lab.edge_url}/v1/streams/{stream_id}")).json()
    assert status["state"] == "cancelled"
    assert status["cancel_reason"] == "resume_grace_expired"

    # Reconnecting after expiry: what was buffered since, then the explicit end.
    await cut_connections(toxiproxy, lab.hops_of("edge"), [])(0)  # no more cuts
    late = await follow(fresh, lab.edge_url, created, max_connections=1,
                               last_event_id=f"{stream_id}:{received}" if received else None)
    assert late.terminal == "cancelled"
    assert late.terminal_data == {"reason": "resume_grace_expired"}
    assert late.indexes == list(range(received, received + len(late.tokens)))
    # Every token the gateway had buffered before the cancel (its log holds
    # them and then the terminal event), and no more than the engine made.
    buffered = status["last_seq"] - 1
    assert received + len(late.tokens) == buffered <= record.tokens_generated
    # And after the terminal event: 204, which makes an EventSource stop.
    again = await fresh.get(f"{lab.edge_url}{created['events_url']}",
                            headers={"Last-Event-ID": f"{stream_id}:{status['last_seq']}"})
    assert again.status_code == 204


async def test_grace_zero_cancels_as_soon_as_the_client_is_cut(
    lab: Lab, fresh: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    created = await create_stream(fresh, lab.edge_url,
                                  stream_body(tokens=400, gap_ms=20, grace_s=0))
    created_at = time.monotonic()
    cut = cut_first_connection(toxiproxy, lab.hops_of("upstream"), 900)
    connected_at = 0.0

    async def before_connect(attempt: int) -> None:
        nonlocal connected_at
        await cut(attempt)
        connected_at = time.monotonic()

    # resume=False: a client that is cut and never comes back.
    await follow(fresh, lab.edge_url, created, resume=False, before_connect=before_connect)
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, created["id"], 3.0)
    # With the default grace (10 s) the 8 s answer would end COMPLETED.
    assert record.state == pb.GENERATION_STATE_CANCELLED
    # "As soon as": the generation had run at least (connected_at - created_at)
    # when the client connected, and the cut came after that, so the cancel
    # reached the engine within this much of the cut. Timed from the connect,
    # not from the start: a loaded machine may take a second or two to get
    # there (CI once did, and 101 tokens came before the cut).
    ran_s = record.cancelled_at - record.started_at
    after_cut_s = ran_s - (connected_at - created_at)
    assert after_cut_s < 1.0, (ran_s, connected_at - created_at)


async def test_reconnect_within_grace_after_an_outage_completes_the_generation(
    lab: Lab, fresh: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    """The edge refuses connections for a few reconnect attempts; the generation
    keeps running meanwhile and the client resumes once the edge is back."""
    created = await create_stream(fresh, lab.edge_url, stream_body(tokens=60, grace_s=10))

    async def outage(attempt: int) -> None:
        if attempt == 0:
            toxiproxy.add_toxic("edge", Toxic("limit_data", {"bytes": 900}))
        elif attempt == 1:
            toxiproxy.reset()
            toxiproxy.set_enabled("edge", False)
        elif attempt == 4:
            toxiproxy.set_enabled("edge", True)

    result = await follow(fresh, lab.edge_url, created, before_connect=outage)
    assert result.terminal == "done", result.error
    assert result.text == "".join(token_text(i) for i in range(60))
    assert result.indexes == list(range(60))
    assert [c.ended for c in result.connections[:4]] == [
        "transport", "transport", "transport", "transport"]
    record = lab.engine_stats(created["id"]).generations[0]
    assert record.state == pb.GENERATION_STATE_COMPLETED


async def test_a_replay_that_cannot_be_complete_says_so(
    lab: Lab, fresh: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    """A log of 5 events and a client back long after: the response header and
    a `gap` event name what was lost; nothing is duplicated."""
    created = await create_stream(fresh, lab.edge_url,
                                  stream_body(tokens=TOKENS, gap_ms=5, max_events=5))
    stream_id = created["id"]
    first = await follow(fresh, lab.edge_url, created, resume=False,
                                before_connect=cut_first_connection(
                                    toxiproxy, lab.hops_of("edge"), 500))
    async def finished() -> bool:
        status = await fresh.get(f"{lab.edge_url}/v1/streams/{stream_id}")
        return bool(status.json()["state"] != "running")

    await wait_until_async(finished, timeout_s=5.0, interval_s=0.02,
                           what=f"stream {stream_id} no longer running")
    seen = len(first.tokens)
    assert seen < TOKENS - 5
    sent = f"{stream_id}:{seen}" if seen else None
    await cut_connections(toxiproxy, lab.hops_of("edge"), [])(0)  # no more cuts
    lost_to = TOKENS + 1 - 5  # the log holds the last 5 of TOKENS + 1 events

    response = await fresh.get(f"{lab.edge_url}{created['events_url']}",
                               headers={"Last-Event-ID": sent} if sent else {})
    assert response.status_code == 200
    assert response.headers["last-event-id"] == f"{stream_id}:{lost_to}" != sent
    events = [i for i in SSEDecoder().feed(response.content) if not isinstance(i, Comment)]
    assert events[0].event == "gap"
    assert json.loads(events[0].data) == {"missed_from": f"{stream_id}:{seen + 1}",
                                          "missed_to": f"{stream_id}:{lost_to}",
                                          "missed_events": lost_to - seen}
    assert [json.loads(e.data)["index"] for e in events[1:-1]] == list(range(TOKENS - 4, TOKENS))
    assert events[-1].event == "done"


async def test_unknown_expired_and_bad_ids_get_answers_that_stop_an_event_source(
    lab: Lab, fresh: httpx.AsyncClient
) -> None:
    created = await create_stream(fresh, lab.edge_url, stream_body(tokens=3, ttl_s=3.0))
    stream_id, events_url = created["id"], f"{lab.edge_url}{created['events_url']}"
    done = await follow(fresh, lab.edge_url, created)
    assert done.terminal == "done"

    async def status_of(headers: dict[str, str] | None = None, query: str = "") -> int:
        response = await fresh.get(events_url + query, headers=headers or {})
        return response.status_code

    assert await status_of({"Last-Event-ID": "nonsense"}) == 400
    assert await status_of({"Last-Event-ID": f"{'0' * 32}:1"}) == 400  # another stream's
    assert await status_of({"Last-Event-ID": f"{stream_id}:99"}) == 400  # from the future
    assert await status_of({"Last-Event-ID": f"{stream_id}:4"}) == 204  # has the end
    assert await status_of(query=f"?last_event_id={stream_id}:4") == 204
    # The header wins over the query parameter.
    assert await status_of({"Last-Event-ID": f"{stream_id}:2"},
                           query=f"?last_event_id={stream_id}:4") == 200
    missing = await fresh.get(f"{lab.edge_url}/v1/streams/{'f' * 32}/events")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_stream"

    # After the TTL the stream is evicted, and its id says so.
    async def evicted() -> bool:
        return await status_of() == 410

    await wait_until_async(evicted, timeout_s=10.0, interval_s=0.02,
                           what=f"stream {stream_id} evicted (410) after its TTL")
    gone = await fresh.get(events_url, headers={"Last-Event-ID": f"{stream_id}:2"})
    assert gone.status_code == 410
    assert gone.json()["error"]["code"] == "stream_expired"


async def test_delete_stops_the_generation_now(lab: Lab, fresh: httpx.AsyncClient) -> None:
    created = await create_stream(fresh, lab.edge_url, stream_body(tokens=400, gap_ms=20))
    response = await fresh.delete(f"{lab.edge_url}/v1/streams/{created['id']}")
    assert response.status_code == 200
    record = await anyio.to_thread.run_sync(wait_for_generation_end, lab, created["id"], 3.0)
    assert record.state == pb.GENERATION_STATE_CANCELLED
    result = await follow(fresh, lab.edge_url, created, max_connections=1)
    assert result.terminal == "cancelled"
    assert result.terminal_data == {"reason": "client_cancelled"}


async def test_heartbeats_fill_a_silent_prefill(lab: Lab, fresh: httpx.AsyncClient) -> None:
    prefill_ms = int(4 * TEST_HEARTBEAT_S * 1000)
    created = await create_stream(fresh, lab.edge_url, stream_body(tokens=2, prefill_ms=prefill_ms))
    pings = 0
    decoder = SSEDecoder()
    async with fresh.stream("GET", f"{lab.edge_url}{created['events_url']}") as response:
        async for chunk in response.aiter_bytes():
            for item in decoder.feed(chunk):
                if isinstance(item, Comment) and item.text.startswith("ping"):
                    pings += 1
                elif not isinstance(item, Comment) and item.event == "done":
                    break
    assert pings >= 4 - 2
