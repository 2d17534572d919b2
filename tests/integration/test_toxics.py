"""Fault toggles on the real Toxiproxy: the CLI, the official toxiproxy-cli, and
the quirks of the toxics that docs/toxics.md warns about, shown with real traffic."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import httpx
import pytest
from typer.testing import CliRunner

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.cli import app
from streamlab.lab.local import Lab, find_toxiproxy
from streamlab.lab.toxiproxy import TOXIC_TYPES, Toxic, Toxiproxy
from tests.integration.conftest import AddToxic
from tests.wait import wait_until_async

pytestmark = pytest.mark.integration

HOPS = ("edge", "upstream", "engine")
# One value per attribute of every toxic type (all of TOXIC_TYPES).
SAMPLES: dict[str, dict[str, int]] = {
    "latency": {"latency": 100, "jitter": 10},
    "bandwidth": {"rate": 32},
    "slow_close": {"delay": 50},
    "timeout": {"timeout": 500},
    "reset_peer": {"timeout": 20},
    "slicer": {"average_size": 16, "size_variation": 8, "delay": 100},
    "limit_data": {"bytes": 4096},
}


def cli(lab: Lab, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*args, "--run-dir", str(lab.run_dir)])
    return result.exit_code, result.output


def completions(lab: Lab, location: str = "/") -> str:
    return f"{lab.edge_url}{location.rstrip('/')}/v1/chat/completions"


def test_samples_cover_every_toxic_type() -> None:
    assert {t: set(a) for t, a in SAMPLES.items()} == {t: set(a) for t, a in
                                                       TOXIC_TYPES.items()}


# Every type, and every hop more than once (the full 7 × 3 product adds nothing
# but time: a hop is a name in the same API call).
@pytest.mark.parametrize(("toxic_type", "hop"),
                         [(t, HOPS[i % len(HOPS)]) for i, t in enumerate(SAMPLES)])
def test_cli_adds_updates_and_removes_every_toxic_on_every_hop(
    lab: Lab, toxiproxy: Toxiproxy, hop: str, toxic_type: str
) -> None:
    attributes = SAMPLES[toxic_type]
    args = [f"-a{k}={v}" for k, v in attributes.items()]
    code, out = cli(lab, "toxic", "add", hop, toxic_type, *args, "--stream", "upstream",
                    "--toxicity", "0.5", "--name", "t1")
    assert code == 0, out
    (added,) = toxiproxy.toxics(hop)
    assert (added["name"], added["type"], added["stream"], added["toxicity"]) == (
        "t1", toxic_type, "upstream", 0.5)
    assert added["attributes"] == attributes

    key = next(iter(attributes))
    code, out = cli(lab, "toxic", "update", hop, "t1", "-a", f"{key}=7", "--toxicity", "1")
    assert code == 0, out
    (updated,) = toxiproxy.toxics(hop)
    assert updated["attributes"] == {**attributes, key: 7}
    assert updated["toxicity"] == 1.0

    code, out = cli(lab, "toxic", "list", hop, "--json")
    assert code == 0, out
    assert json.loads(out)[hop]["toxics"][0]["name"] == "t1"

    code, out = cli(lab, "toxic", "remove", hop, "t1")
    assert code == 0, out
    assert toxiproxy.toxics(hop) == []


def test_cli_refuses_what_toxiproxy_would_silently_ignore(lab: Lab, toxiproxy: Toxiproxy) -> None:
    code, out = cli(lab, "toxic", "add", "edge", "latency", "-a", "latncy=100")
    assert code == 2  # usage: an attribute the toxic does not have (docs/cli.md)
    assert "latncy" in out
    assert "it has: latency, jitter" in out
    code, out = cli(lab, "toxic", "add", "nginx", "latency")
    assert code == 2
    assert "unknown hop" in out
    code, out = cli(lab, "toxic", "add", "edge", "latency", "-a", "latency=100", "--name", "x")
    assert code == 0
    code, out = cli(lab, "toxic", "add", "edge", "latency", "-a", "latency=100", "--name", "x")
    assert code == 1
    assert "409" in out  # Toxiproxy's own refusal, as one readable line
    assert [t["name"] for t in toxiproxy.toxics("edge")] == ["x"]


def test_reset_removes_every_toxic_and_enables_every_hop(lab: Lab, toxiproxy: Toxiproxy) -> None:
    for hop in HOPS:
        assert cli(lab, "toxic", "add", hop, "latency", "-a", "latency=10")[0] == 0
    assert cli(lab, "proxy", "disable", "upstream")[0] == 0
    assert toxiproxy.proxy("upstream")["enabled"] is False

    code, out = cli(lab, "toxic", "reset")
    assert code == 0, out
    proxies = toxiproxy.proxies()
    assert all(proxies[h]["enabled"] and not proxies[h]["toxics"] for h in HOPS)


def test_proxy_disable_refuses_requests_and_enable_restores_them(lab: Lab) -> None:
    code, out = cli(lab, "proxy", "disable", "edge")
    assert code == 0, out
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{lab.edge_url}/readyz", timeout=2.0)
    code, out = cli(lab, "proxy", "enable", "edge")
    assert code == 0, out
    assert httpx.get(f"{lab.edge_url}/readyz", timeout=5.0).status_code == 200


def test_the_installed_command_runs_as_a_real_process(lab: Lab, toxiproxy: Toxiproxy) -> None:
    streamlab = Path(sys.executable).parent / "streamlab"
    done = subprocess.run(
        [str(streamlab), "toxic", "add", "engine", "latency", "-a", "latency=42",
         "--run-dir", str(lab.run_dir)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert toxiproxy.toxics("engine")[0]["attributes"]["latency"] == 42


def test_official_toxiproxy_cli_works_against_the_lab(lab: Lab, toxiproxy: Toxiproxy) -> None:
    cli_path = find_toxiproxy("toxiproxy-cli")

    def official(*args: str, api: str = lab.toxiproxy_url) -> str:
        done = subprocess.run([cli_path, "--host", api, *args],
                              capture_output=True, text=True, timeout=10)
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    # Two Toxiproxy processes (docs/topology.md, capacity): each hop is listed
    # by the API of the process that serves it.
    routes = lab.toxiproxy_routes()
    assert all(hop in official("list", api=routes[hop]) for hop in HOPS)
    official("toxic", "add", "-t", "latency", "-a", "latency=123", "-n", "from_official", "edge")
    assert toxiproxy.toxics("edge")[0]["attributes"]["latency"] == 123
    # ... and what streamlab adds, the official CLI sees.
    assert cli(lab, "toxic", "add", "edge", "bandwidth", "-a", "rate=9", "--name", "ours")[0] == 0
    inspected = official("inspect", "edge")
    assert "from_official" in inspected
    assert "ours" in inspected
    official("toggle", "edge")
    assert toxiproxy.proxy("edge")["enabled"] is False


# ---- The quirks, shown with real streams ----------------------------------------------
@pytest.mark.anyio
async def test_limit_data_cuts_every_stream_at_the_same_byte(
    lab: Lab, http: httpx.AsyncClient, add_toxic: AddToxic
) -> None:
    add_toxic("edge", Toxic("limit_data", {"bytes": 2500}))
    body = chat_body("cut me", prefill_ms=50, token_gap_ms=20, answer_tokens=40, heartbeat_s=0)
    identity = {"Accept-Encoding": "identity"}
    first = await stream_chat(http, completions(lab), body, headers=identity)
    second = await stream_chat(http, completions(lab), body, headers=identity)

    for result in (first, second):
        assert result.status == 200
        assert not result.done
        assert result.error is not None
        assert result.error["code"] == "transport"
        assert 0 < len(result.texts) < 40
    assert len(first.texts) == len(second.texts), "limit_data cuts at a byte count"


@pytest.mark.anyio
async def test_disabling_the_edge_cuts_an_open_stream(
    lab: Lab, http: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    body = chat_body("long", prefill_ms=50, token_gap_ms=50, answer_tokens=100)

    seen: list[str] = []

    def cut_after_third(token: str) -> None:
        seen.append(token)
        if len(seen) == 3:
            toxiproxy.set_enabled("edge", False)

    result = await stream_chat(http, completions(lab), body, on_token=cut_after_third)
    assert not result.done
    assert result.error is not None
    assert result.error["code"] == "transport"
    assert 3 <= len(result.texts) < 10


@pytest.mark.anyio
async def test_timeout_toxic_never_fires_while_bytes_keep_coming(
    lab: Lab, http: httpx.AsyncClient, add_toxic: AddToxic
) -> None:
    """Its timer restarts on every chunk it swallows: with a token every 50 ms, a
    300 ms timeout only fires 300 ms after the stream has gone quiet."""
    add_toxic("edge", Toxic("timeout", {"timeout": 300}))
    body = chat_body("swallowed", prefill_ms=50, token_gap_ms=50, answer_tokens=30,
                     heartbeat_s=0)
    result = await stream_chat(http, completions(lab), body)

    model_total_s = 0.05 + 30 * 0.05
    assert result.texts == []  # every byte was dropped on the floor...
    assert result.error is not None
    assert result.error["code"] == "transport"
    assert result.total_s >= model_total_s  # ...but the close came only after the stream


@pytest.mark.anyio
async def test_removing_a_timeout_toxic_closes_the_connection(
    lab: Lab, http: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    toxiproxy.add_toxic("edge", Toxic("timeout", {"timeout": 0}, name="hole"))
    request_id = f"hole-{uuid.uuid4().hex[:8]}"
    body = chat_body("black hole", prefill_ms=50, token_gap_ms=50, answer_tokens=100,
                     request_id=request_id)
    results: list[StreamResult] = []

    async def stream() -> None:
        results.append(await stream_chat(http, completions(lab), body))

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(stream)
        # Wait (with a deadline) until the request is through, then open the hole.
        await wait_until_async(lambda: lab.engine_stats(request_id).generations, timeout_s=5.0,
                               interval_s=0.02, what="the request to reach the engine")
        toxiproxy.remove_toxic("edge", "hole")
    (result,) = results
    assert result.texts == []  # nothing was let through: the connection was closed
    assert result.error is not None
    assert result.error["code"] == "transport"
    assert result.total_s < 0.05 + 100 * 0.05


@pytest.mark.anyio
async def test_reset_peer_waits_for_the_next_chunk(
    lab: Lab, http: httpx.AsyncClient, toxiproxy: Toxiproxy
) -> None:
    """Added during a silent think pause, reset_peer does nothing until the
    next chunk arrives after the pause, then resets the connection."""
    pause_s = 1.5
    body = chat_body("think", prefill_ms=50, token_gap_ms=50, answer_tokens=6, heartbeat_s=0,
                     pauses=[{"after_token": 2, "pause_ms": int(pause_s * 1000)}])

    seen: list[str] = []

    def arm_in_the_pause(token: str) -> None:
        seen.append(token)
        if len(seen) == 3:  # after_token counts from 0: the pause follows the third
            toxiproxy.add_toxic("edge", Toxic("reset_peer", {"timeout": 0}))

    result = await stream_chat(http, completions(lab), body, on_token=arm_in_the_pause)

    assert len(result.texts) == 3
    assert result.error is not None
    assert result.error["code"] == "transport"
    # Reset at the end of the pause, not when the toxic was added.
    assert result.total_s - result.token_times[-1] >= 0.8 * pause_s
