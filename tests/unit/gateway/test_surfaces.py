"""Every surface against a scripted in-process engine: what a client sees, and
that the engine call, the slot and the drain's tracking are released on every
way out (the full topology repeats the important ones over real sockets)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.unit.gateway.inprocess import Exchange, chat, leave_midway, running, sse_data, until
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"


async def test_sse_relays_every_token_then_the_finish_and_done() -> None:
    async with running(ScriptedEngine(Script(tokens=3))) as gw:
        response = await gw.http.post(CHAT, json=chat())
        assert response.status_code == 200
        data = sse_data(response.content)
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        assert text == "t0 t1 t2 "
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert (gw.gateway.limiter.open, gw.gateway.drain.live) == (0, 0)


async def test_not_streaming_answers_one_completion() -> None:
    async with running(ScriptedEngine(Script(tokens=2))) as gw:
        response = await gw.http.post(CHAT, json=chat(stream=False))
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "t0 t1 "


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_leaves_cancels_the_engine_call(stream: bool) -> None:
    """Streaming or not: a `stream: false` client that leaves used to leave its
    generation running to the end, holding its slot."""
    engine = ScriptedEngine(Script(tokens=10, hold_after=2))
    async with running(engine) as gw:
        # Leave once the generation is in flight (the held call has sent 2 tokens).
        def in_flight(_: Exchange) -> bool:
            return bool(engine.calls) and engine.last.sent == 2

        await leave_midway(gw.app, CHAT, chat(stream=stream), in_flight)
        await until(lambda: engine.last.cancelled)
        assert engine.last.sent == 2
        await until(lambda: (gw.gateway.limiter.open, gw.gateway.drain.live) == (0, 0))


async def test_an_engine_error_mid_stream_is_an_error_event_and_no_done() -> None:
    async with running(ScriptedEngine(Script(tokens=2, end="error"))) as gw:
        data = sse_data((await gw.http.post(CHAT, json=chat())).content)
        assert "[DONE]" not in data
        assert json.loads(data[-1])["error"]["code"] == "engine_failed"


async def test_broken_mode_swallow_ends_a_failed_stream_like_a_whole_one() -> None:
    engine = ScriptedEngine(Script(tokens=2, end="error"))
    async with running(engine, allow_broken_modes=True) as gw:
        data = sse_data((await gw.http.post(CHAT, json=chat(engine_errors="swallow"))).content)
        assert data[-1] == "[DONE]"
        assert not any('"error"' in d for d in data)
    async with running(ScriptedEngine(Script(tokens=2, end="error"))) as gw:
        refused = await gw.http.post(CHAT, json=chat(engine_errors="swallow"))
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "broken_mode_disabled"


async def test_broken_mode_detached_leaves_the_call_running_for_nobody() -> None:
    """The contrast to the test above: the client leaves, the engine is never cancelled."""
    engine = ScriptedEngine(Script(tokens=6, hold_after=2))
    async with running(engine, allow_broken_modes=True) as gw:
        await leave_midway(gw.app, CHAT, chat(relay="detached_unbounded"),
                           lambda _: bool(engine.calls) and engine.last.sent == 2)
        engine.last.release()
        await until(lambda: engine.last.sent == 6)  # read to the end, for nobody
        assert not engine.last.cancelled
        assert gw.gateway.limiter.open == 0  # the slot went; the generation did not


async def test_stream_caps_answer_429_with_the_configured_retry_after() -> None:
    engine = ScriptedEngine(Script(tokens=5, hold_after=1))
    async with running(engine, max_streams_per_client=1, retry_after_s=9,
                       trust_client_id_header=True) as gw:
        first = asyncio.ensure_future(gw.http.post(CHAT, json=chat()))
        await until(lambda: bool(engine.calls))
        second = await gw.http.post(CHAT, json=chat())
        assert second.status_code == 429
        assert second.headers["retry-after"] == "9"
        assert second.json()["error"]["code"] == "too_many_streams"
        # Another client has its own cap.
        other = asyncio.ensure_future(gw.http.post(CHAT, json=chat(),
                                                   headers={"X-Client-Id": "b"}))
        await until(lambda: len(engine.calls) == 2)
        for call in engine.calls:
            call.release()
        assert (await first).status_code == (await other).status_code == 200


async def test_auth_guards_the_api_but_not_the_probes() -> None:
    async with running(api_keys=["sk-lab"]) as gw:
        assert (await gw.http.post(CHAT, json=chat())).status_code == 401
        wrong = await gw.http.post(CHAT, json=chat(), headers={"Authorization": "Bearer no"})
        assert wrong.status_code == 401
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        ok = await gw.http.post(CHAT, json=chat(), headers={"Authorization": "Bearer sk-lab"})
        assert ok.status_code == 200
        assert (await gw.http.get("/healthz")).status_code == 200
        assert len(gw.engine.calls) == 1  # refusals cost nothing


async def test_drain_refuses_new_streams_and_cancels_the_rest_with_a_retry() -> None:
    engine = ScriptedEngine(Script(tokens=5, hold_after=1))
    async with running(engine, drain_grace_s=0.05, drain_retry_ms=250) as gw:
        live = asyncio.ensure_future(gw.http.post(CHAT, json=chat()))
        await until(lambda: gw.gateway.drain.live == 1)
        await gw.gateway.drain.run()
        body = (await live).content.decode()
        assert "retry: 250" in body
        assert json.loads(sse_data(body.encode())[-1])["error"]["code"] == "server_draining"
        assert engine.last.cancelled
        refused = await gw.http.post(CHAT, json=chat())
        assert refused.status_code == 503
        assert (await gw.http.get("/readyz")).status_code == 503


async def test_a_polling_job_is_cancelled_at_the_engine_when_deleted() -> None:
    engine = ScriptedEngine(Script(tokens=5, hold_after=2))
    async with running(engine) as gw:
        created = await gw.http.post("/v1/jobs", json=chat())
        assert created.status_code == 201
        job = created.json()["id"]
        polled = await gw.http.get(f"/v1/jobs/{job}", params={"since": 0, "wait_s": 1})
        assert polled.json()["tokens"][:1] == ["t0 "]  # the first token, and maybe more
        assert gw.gateway.limiter.open == 1  # engine work: its client's slot, while it runs
        assert (await gw.http.delete(f"/v1/jobs/{job}")).status_code == 204
        await until(lambda: engine.last.cancelled and gw.gateway.drain.live == 0)
        assert gw.gateway.limiter.open == 0
        assert (await gw.http.get(f"/v1/jobs/{job}")).status_code == 404


async def test_a_resumable_stream_nobody_reads_is_cancelled_after_the_attach_timeout(
) -> None:
    engine = ScriptedEngine(Script(tokens=5, hold_after=1))
    async with running(engine, resume_attach_timeout_s=0.05) as gw:
        created = await gw.http.post("/v1/streams", json=chat())
        assert created.status_code == 201
        stream_id = created.json()["id"]
        assert gw.gateway.limiter.open == 1  # held by the generation, not a connection
        await until(lambda: engine.last.cancelled)
        status = (await gw.http.get(f"/v1/streams/{stream_id}")).json()
        assert (status["state"], status["cancel_reason"]) == ("cancelled", "never_attached")
        assert (gw.gateway.limiter.open, gw.gateway.drain.live) == (0, 0)


async def test_a_draining_gateway_serves_the_streams_it_runs_and_refuses_the_others() -> None:
    """A resume of a stream this gateway does not run (another replica's, one
    handed off, an unknown id) gets 503 while it drains, before any byte, so
    nginx retries it on another gateway; taking it on here would end it with
    `gateway_shutdown` when this one exits (rolling-deploy lost streams so)."""
    async with running(ScriptedEngine(Script(tokens=3)), drain_grace_s=0.05) as gw:
        stream_id = (await gw.http.post("/v1/streams", json=chat())).json()["id"]
        await until(lambda: gw.gateway.streams.local(stream_id) is not None
                    and gw.gateway.streams.local(stream_id).ended)  # type: ignore[union-attr]
        gw.gateway.drain.draining = True
        own = await gw.http.get(f"/v1/streams/{stream_id}/events")
        assert own.status_code == 200
        assert "event: done" in own.content.decode()
        elsewhere = await gw.http.get(f"/v1/streams/{'0' * 32}/events",
                                      headers={"Last-Event-ID": f"{'0' * 32}:3"})
        assert elsewhere.status_code == 503
        assert elsewhere.json()["error"]["code"] == "server_draining"
        assert "retry-after" in elsewhere.headers


async def test_a_resumable_stream_replays_after_last_event_id_and_ends_with_done() -> None:
    async with running(ScriptedEngine(Script(tokens=3))) as gw:
        stream_id = (await gw.http.post("/v1/streams", json=chat())).json()["id"]
        await until(lambda: gw.gateway.streams.local(stream_id) is not None
                    and gw.gateway.streams.local(stream_id).ended)  # type: ignore[union-attr]
        replay = await gw.http.get(f"/v1/streams/{stream_id}/events",
                                   headers={"Last-Event-ID": f"{stream_id}:1"})
        events = replay.content.decode()
        assert f"id: {stream_id}:1\n" not in events
        assert f"id: {stream_id}:2\n" in events
        assert "event: done" in events
        assert replay.headers["last-event-id"] == f"{stream_id}:1"
        assert gw.gateway.limiter.open == 0
