"""One client identity (services/gateway/identity.py): the caps count every
kind of work against it, and streams and jobs belong to it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from starlette.testclient import TestClient

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.unit.gateway.inprocess import Running, chat, running, until
from tests.unit.gateway.scripted_engine import Script, ScriptedEngine

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"


def held_engine() -> ScriptedEngine:
    """Every call stops after its first token until released: work in flight."""
    return ScriptedEngine(Script(tokens=3, hold_after=1))


@asynccontextmanager
async def from_address(gw: Running, host: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=gw.app, client=(host, 4321))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        yield http


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("spelling", ["Bearer  sk-a", "bearer sk-a", "BEARER sk-a ",
                                      "Bearer \tsk-a"])
async def test_one_key_is_one_client_however_its_header_is_spelled(spelling: str) -> None:
    """The cap was keyed by the raw header: `Bearer  sk-a` was a new client."""
    engine = held_engine()
    async with running(engine, api_keys=["sk-a", "sk-b"], max_streams_per_client=1) as gw:
        job = await gw.http.post("/v1/jobs", json=chat(), headers=bearer("sk-a"))
        assert job.status_code == 201
        again = await gw.http.post("/v1/jobs", json=chat(), headers={"Authorization": spelling})
        assert again.status_code == 429
        assert again.json()["error"]["type"] == "rate_limit_error"
        other = await gw.http.post("/v1/jobs", json=chat(), headers=bearer("sk-b"))
        assert other.status_code == 201


async def test_without_auth_the_address_is_the_client_and_x_client_id_is_not_trusted(
) -> None:
    async with running(held_engine(), max_streams_per_client=1) as gw:
        assert (await gw.http.post("/v1/jobs", json=chat(),
                                   headers={"X-Client-Id": "a"})).status_code == 201
        # Any client can claim any id: a new one does not buy a new cap.
        claimed = await gw.http.post("/v1/jobs", json=chat(), headers={"X-Client-Id": "b"})
        assert claimed.status_code == 429
        async with from_address(gw, "10.0.0.2") as elsewhere:
            assert (await elsewhere.post("/v1/jobs", json=chat())).status_code == 201


async def test_x_client_id_names_the_client_when_the_gateway_trusts_it() -> None:
    async with running(held_engine(), max_streams_per_client=1,
                       trust_client_id_header=True) as gw:
        assert (await gw.http.post("/v1/jobs", json=chat(),
                                   headers={"X-Client-Id": "a"})).status_code == 201
        assert (await gw.http.post("/v1/jobs", json=chat(),
                                   headers={"X-Client-Id": "b"})).status_code == 201
        assert (await gw.http.post("/v1/jobs", json=chat(),
                                   headers={"X-Client-Id": "a"})).status_code == 429


async def test_a_polling_job_holds_its_client_s_slot_until_its_generation_ends() -> None:
    """Jobs took no slot: one client held 128 jobs and starved the others."""
    engine = held_engine()
    async with running(engine, max_streams_per_client=1) as gw:
        job = (await gw.http.post("/v1/jobs", json=chat())).json()["id"]
        refused = await gw.http.post(CHAT, json=chat(stream=False))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "too_many_streams"
        engine.calls[0].release()  # the job's generation runs to its end ...
        await until(lambda: gw.gateway.limiter.open == 0)
        # ... and gives the slot back, though the job stays readable for its TTL.
        assert (await gw.http.get(f"/v1/jobs/{job}")).json()["done"]
        engine.script = Script(tokens=2)  # no hold this time
        assert (await gw.http.post(CHAT, json=chat(stream=False))).status_code == 200


async def test_resumable_streams_count_against_the_same_cap() -> None:
    async with running(held_engine(), max_streams_per_client=1) as gw:
        assert (await gw.http.post("/v1/streams", json=chat())).status_code == 201
        assert (await gw.http.post("/v1/jobs", json=chat())).status_code == 429
        assert (await gw.http.post(CHAT, json=chat())).status_code == 429


def test_a_websocket_counts_against_the_cap_and_is_closed_1013() -> None:
    app = create_app(GatewaySettings(max_streams_per_client=1), engine=held_engine())
    with TestClient(app) as client:
        assert client.post("/v1/jobs", json=chat()).status_code == 201
        with client.websocket_connect("/ws") as ws:
            ws.send_text("hi")
            error = json.loads(ws.receive_text())
            closed = ws.receive()
        assert error["error"]["code"] == "too_many_streams"
        assert (closed["code"], json.loads(closed["reason"])["type"]) == (1013,
                                                                         "rate_limit_error")


async def test_jobs_belong_to_their_key_another_key_gets_404() -> None:
    """One key could read and DELETE another key's job."""
    async with running(held_engine(), api_keys=["sk-a", "sk-b"]) as gw:
        job = (await gw.http.post("/v1/jobs", json=chat(), headers=bearer("sk-a"))).json()["id"]
        for method in ("GET", "DELETE"):
            stranger = await gw.http.request(method, f"/v1/jobs/{job}", headers=bearer("sk-b"))
            assert stranger.status_code == 404
            assert stranger.json()["error"]["code"] == "job_not_found"
        assert not gw.engine.last.cancelled
        assert (await gw.http.get(f"/v1/jobs/{job}", headers=bearer("sk-a"))).status_code == 200
        assert (await gw.http.delete(f"/v1/jobs/{job}",
                                     headers=bearer("sk-a"))).status_code == 204


async def test_streams_belong_to_their_creator_another_gets_404() -> None:
    async with running(held_engine(), api_keys=["sk-a", "sk-b"]) as gw:
        created = await gw.http.post("/v1/streams", json=chat(), headers=bearer("sk-a"))
        stream = created.json()["id"]
        for method, path in [("GET", f"/v1/streams/{stream}"),
                             ("GET", f"/v1/streams/{stream}/events"),
                             ("DELETE", f"/v1/streams/{stream}")]:
            stranger = await gw.http.request(method, path, headers=bearer("sk-b"))
            assert stranger.status_code == 404, (method, path)
            assert stranger.json()["error"]["code"] == "unknown_stream"
        assert not gw.engine.last.cancelled
        mine = await gw.http.delete(f"/v1/streams/{stream}", headers=bearer("sk-a"))
        assert mine.json()["state"] == "cancelled"


async def test_without_auth_another_address_cannot_see_a_job_or_a_stream() -> None:
    async with running(held_engine()) as gw:
        job = (await gw.http.post("/v1/jobs", json=chat())).json()["id"]
        stream = (await gw.http.post("/v1/streams", json=chat())).json()["id"]
        async with from_address(gw, "10.9.9.9") as elsewhere:
            assert (await elsewhere.get(f"/v1/jobs/{job}")).status_code == 404
            assert (await elsewhere.get(f"/v1/streams/{stream}")).status_code == 404
        assert (await gw.http.get(f"/v1/jobs/{job}")).status_code == 200
        await asyncio.gather(*(gw.http.delete(p) for p in (f"/v1/jobs/{job}",
                                                           f"/v1/streams/{stream}")))


async def test_an_evicted_stream_is_gone_only_to_its_owner_another_gets_404() -> None:
    """A 410 told a stranger that the id had existed; to them it never did."""
    async with running(held_engine(), api_keys=["sk-a", "sk-b"], resume_ttl_s=0) as gw:
        stream = (await gw.http.post("/v1/streams", json=chat(),
                                     headers=bearer("sk-a"))).json()["id"]
        await gw.http.delete(f"/v1/streams/{stream}", headers=bearer("sk-a"))
        await until(lambda: gw.gateway.streams.local(stream) is None)  # TTL 0: evicted
        for method, path in [("GET", f"/v1/streams/{stream}"),
                             ("GET", f"/v1/streams/{stream}/events"),
                             ("DELETE", f"/v1/streams/{stream}")]:
            mine = await gw.http.request(method, path, headers=bearer("sk-a"))
            assert mine.status_code == 410, (method, path)
            assert mine.json()["error"]["code"] == "stream_expired"
            stranger = await gw.http.request(method, path, headers=bearer("sk-b"))
            assert stranger.status_code == 404, (method, path)
            assert stranger.json()["error"]["code"] == "unknown_stream"
