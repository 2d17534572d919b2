"""The console's waterfall (docs/console.md, docs/tracing.md): `/api/trace/{id}`
on a lab up with --tracing answers the stream's timeline as `streamlab trace
ID --json` does, with its rows; on a lab without tracing (the suite's session
lab) it is a 409 that says so; and the page draws the bars of each hop for a
stream it ran (Debian's chromium, headless; skipped without it), screenshotted
to .run/screenshots/console/waterfall*.png as test_console.py's are.

The traced lab is test_tracing.py's `traced_lab` (its module's own instance
here, on one engine wire: the console does not depend on it), started without
its console; the console runs in this process on the lab's console port, so
nginx's CORS lets its page stream from the edge.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn

from streamlab.console.app import create_app
from streamlab.experiments.browser import Page
from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.local import Lab
from streamlab.lab.target import LabTarget
from streamlab.lab.topology import console_url
from tests.integration.test_console import (
    console_page,
    screenshot,
    screenshot_dir,
    start,
    wait_for,
    wait_lane,
)
from tests.integration.test_tracing import WIRES, traced_lab  # noqa: F401 (a fixture)
from tests.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.local_only(
    "Jaeger runs beside a local lab (--tracing); the compose lab's profile is separate")]

# One wire is enough: the console reads the same timeline on either.
ONE_WIRE = pytest.mark.parametrize("traced_lab", [WIRES[0]], indirect=True)
HOPS = {"client", "proxy", "gateway", "engine"}


@pytest.fixture(scope="module")
def console(traced_lab: Lab) -> Iterator[str]:  # noqa: F811
    """The console for the traced lab, served here on the lab's console port."""
    settings = ConsoleSettings.for_ports(traced_lab.ports, traced_lab.run_dir)
    server = uvicorn.Server(uvicorn.Config(
        create_app(settings), host=settings.host, port=settings.port, log_level="warning",
        ws="none", lifespan="on", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    base = console_url(traced_lab.ports)

    def up() -> bool:
        try:
            return httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False
    try:
        wait_until(up, timeout_s=10, what="the console serving")
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@ONE_WIRE
def test_the_console_answers_a_chats_timeline(traced_lab: Lab, console: str  # noqa: F811
                                              ) -> None:
    chat = subprocess.run(
        [sys.executable, "-m", "streamlab", "chat", "hi", "--tokens", "5", "--prefill-ms", "50",
         "--gap-ms", "5", "--run-dir", str(traced_lab.run_dir), "--json"],
        capture_output=True, text=True, timeout=60, check=True)
    said = json.loads(chat.stdout)
    with httpx.Client(base_url=console, timeout=20.0) as api:
        assert api.get("/api/trace").json() == {"tracing": True, "reason": ""}
        answer = api.get(f"/api/trace/{said['request_id']}", params={"wait_s": 10})
        assert answer.status_code == 200, answer.text
        timeline = answer.json()
        assert timeline["request_id"] == said["request_id"]
        assert timeline["trace_id"] == said["trace_id"]
        assert {m["hop"] for m in timeline["marks"]} == HOPS
        assert timeline["missing"] == []
        figures = timeline["figures"]
        assert 0 <= figures["engine_to_client_s"] < 1.0, figures  # loaded CI: not held
        rows = timeline["waterfall"]["rows"]
        assert {row["hop"] for row in rows} == HOPS
        engine = next(row for row in rows if row["hop"] == "engine")
        assert {s["what"] for s in engine["segments"]} == {"queue", "prefill"}
        assert "first_token" in {m["what"] for m in engine["marks"]}
        gateway = next(row for row in rows if row["hop"] == "gateway")
        assert "first_token" in {m["what"] for m in gateway["marks"]}
        for row in rows:  # one axis: every bar within the timeline's span
            assert 0 <= row["start_s"] <= row["end_s"] <= figures["end_s"] + 1e-6, row

        unknown = api.get("/api/trace/nosuchstream0123", params={"wait_s": 0})
        assert unknown.status_code == 404
        assert "nosuchstream0123" in unknown.json()["error"]


def test_a_lab_without_tracing_is_a_409(lab: LabTarget) -> None:
    base = console_url(lab.ports)
    try:
        httpx.get(f"{base}/healthz", timeout=2.0).raise_for_status()
    except httpx.HTTPError:
        pytest.skip("this lab was started without its console")
    answer = httpx.get(f"{base}/api/trace/abc123", timeout=10.0)
    assert answer.status_code == 409
    assert "tracing" in answer.json()["error"] or "no lab" in answer.json()["error"]
    assert httpx.get(f"{base}/api/trace", timeout=10.0).json()["tracing"] is False


@pytest.fixture
async def traced_page(console: str) -> AsyncIterator[Page]:
    async with console_page(console) as page:
        yield page


@ONE_WIRE
@pytest.mark.anyio
async def test_the_page_draws_a_waterfall_beside_the_stream(traced_page: Page) -> None:
    page = traced_page
    assert await wait_for(page, "consoleState.tracing && consoleState.tracing.tracing", 5,
                          "tracing on") is True
    # A think pause with heartbeats: marks on the page's row and the gateway's.
    [lane_id] = await start(page, ["sse-fetch"], answer_tokens=5, token_gap_ms=20,
                            prefill_ms=50, pause_after=2, pause_ms=1000, heartbeat_s=0.25,
                            location="/")
    done = await wait_lane(page, lane_id, "l.status === 'done'", 15, "the stream done")
    assert done["tokens"] == 5
    await wait_for(page, f"document.querySelectorAll('#lane-{lane_id} .waterfall rect.bar')"
                         ".length >= 4", 20, "the waterfall's bars")
    hops = json.loads(await page.evaluate(
        f"JSON.stringify([...document.querySelectorAll('#lane-{lane_id} .waterfall rect.bar')]"
        ".map((r) => r.dataset.hop))"))
    assert set(hops) == HOPS, hops
    whats = json.loads(await page.evaluate(
        f"JSON.stringify([...document.querySelectorAll('#lane-{lane_id} .waterfall "
        "rect.segment, #lane-" + str(lane_id) + " .waterfall rect.mark')]"
        ".map((r) => r.dataset.what))"))
    assert {"connect", "queue", "prefill", "first_token", "headers", "heartbeat"} <= set(
        whats), whats
    heartbeat_rows = json.loads(await page.evaluate(
        f"JSON.stringify(consoleState.lanes.find((l) => l.id === {lane_id}).waterfall.rows"
        ".filter((r) => r.marks.some((m) => m.what === 'heartbeat')).map((r) => r.hop))"))
    assert {"client", "gateway"} <= set(heartbeat_rows), heartbeat_rows
    assert await page.evaluate(f"document.querySelectorAll('#lane-{lane_id} .waterfall "
                               "line.cut').length") == 0
    trace = json.loads(await page.evaluate(
        f"JSON.stringify(consoleState.lanes.find((l) => l.id === {lane_id}).trace)"))
    assert trace["request_id"] == done["requestId"]
    shots = screenshot_dir()
    if shots is not None:  # .run/screenshots/ unless STREAMLAB_CONSOLE_SCREENSHOTS says
        await screenshot(page, shots / "console" / "waterfall.png")


@ONE_WIRE
@pytest.mark.anyio
async def test_the_waterfall_marks_where_the_stream_was_cut(traced_page: Page) -> None:
    """nginx's 2 s idle timeout on /short-timeout/ cuts a silent think pause: the
    page's own timings (it has no client record) let the timeline judge the cut."""
    page = traced_page
    await wait_for(page, "consoleState.tracing && consoleState.tracing.tracing", 5, "tracing on")
    [lane_id] = await start(page, ["sse-fetch"], answer_tokens=5, token_gap_ms=20,
                            prefill_ms=50, pause_after=2, pause_ms=3500, heartbeat_s=0,
                            location="/short-timeout/")
    cut = await wait_lane(page, lane_id, "l.ended", 15, "the stream cut")
    assert cut["tokens"] < 5, cut
    await wait_for(page, f"document.querySelectorAll('#lane-{lane_id} .waterfall line.cut')"
                         ".length === 1", 20, "the cut's mark")
    waterfall = json.loads(await page.evaluate(
        f"JSON.stringify(consoleState.lanes.find((l) => l.id === {lane_id}).waterfall)"))
    assert waterfall["cut"]["hop"] == "proxy", waterfall["cut"]
    client = next(row for row in waterfall["rows"] if row["hop"] == "client")
    assert client["label"] == "page"
    # The cut comes about nginx's idle timeout (2 s) after the last token.
    last = max(m["t_s"] for m in client["marks"] if m["what"] == "last_token")
    assert 1.5 < waterfall["cut"]["t_s"] - last < 3.0, waterfall
    shots = screenshot_dir()
    if shots is not None:
        await screenshot(page, shots / "console" / "waterfall-cut.png")
