"""The lab console in a real browser: Debian's chromium, headless, over the
DevTools protocol (streamlab/experiments/browser.py), against the console that
`Lab.up()` starts beside the lab.

The page streams from the edge (another origin: nginx's CORS for the
console's origin is on the path) and drives hops and presets through the
console's own API, so every step below goes through the same buttons a
person presses. What the page shows is read from `window.consoleState`;
what the engine did is read from the engine itself, by the page (the
console's GetStats) and, where it matters, by the test too.

Screenshots (one per preset of a representative set, broken and fixed, and
console.png for the README) go to .run/screenshots/ (git-ignored);
STREAMLAB_CONSOLE_SCREENSHOTS=docs refreshes the committed ones in docs/,
=off takes none, =DIR writes them there instead.
STREAMLAB_CONSOLE_PRESETS=all runs every preset of the catalogue (minutes,
so not by default), =name,name those.
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from services.engine.backends.fake import token_text
from streamlab.experiments.browser import Page, chromium_page, find_chromium
from streamlab.experiments.scenarios import MODES
from streamlab.experiments.scenarios.registry import names as scenario_names
from streamlab.lab.target import LabTarget
from streamlab.lab.topology import HOP_NAMES, REPO_ROOT, console_url
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

DOCS = REPO_ROOT / "docs"
RUN_SCREENSHOTS = REPO_ROOT / ".run" / "screenshots"
VIEWPORT = {"width": 1440, "height": 1300, "deviceScaleFactor": 1, "mobile": False}
# Presets screenshotted by default: one of each kind of failure, both modes.
REPRESENTATIVE = ("buffering", "idle-cut", "websocket-upgrade", "poll-leak", "resume",
                  "engine-reset", "abandoned-tab")
# A cancel that travels page → edge → nginx → gateway → engine on a busy
# 2-core machine (measured: tens of ms).
STOP_TO_CANCEL_BOUND_S = 2.0
LATENCY_MS = 500  # not the field's placeholder (600): the typed value is used
LANE_FIELDS = ("id", "transport", "status", "ttftMs", "tokens", "indexes", "text", "bytes",
               "requests", "heartbeats", "opens", "connectionErrors", "lastEventId",
               "reconnects", "ends", "events", "stopped", "ended", "engine", "requestId",
               "streamId", "jobId", "ttlS")


@asynccontextmanager
async def console_page(url: str) -> AsyncIterator[Page]:
    """Headless chromium on the console at `url`, its page ready (the test
    skips without chromium)."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/install.sh installs it as root)")
    async with chromium_page(chromium) as page:
        await page.call("Emulation.setDeviceMetricsOverride", VIEWPORT)
        await page.navigate(f"{url}/")
        await wait_for(page, "consoleState && consoleState.ready === true", 20, "the page ready")
        yield page


@pytest.fixture
async def page(lab: LabTarget) -> AsyncIterator[Page]:
    if selected_lab_has_no_console(lab):
        pytest.skip("this lab was started without its console")
    async with console_page(console_url(lab.ports)) as ready:
        yield ready


def selected_lab_has_no_console(lab: LabTarget) -> bool:
    try:
        return httpx.get(f"{console_url(lab.ports)}/healthz", timeout=2.0).status_code != 200
    except httpx.HTTPError:
        return True


# ---- reading and driving the page ----------------------------------------------------------
async def wait_for(page: Page, expression: str, timeout_s: float, what: str) -> Any:
    """Poll a JS expression until it is truthy (its value is returned), with a deadline.
    Page.navigate returns before the new document runs, so a ReferenceError is 'not yet'."""
    guarded = f"(() => {{ try {{ return ({expression}); }} catch (e) {{ return null; }} }})()"
    try:
        return await wait_until_async(lambda: page.evaluate(guarded), timeout_s=timeout_s,
                                      what=f"the page to reach: {what}")
    except AssertionError as exc:
        errors = await page.evaluate("JSON.stringify(window.consoleState?.errors ?? null)")
        raise AssertionError(f"{exc}; page errors {errors}") from None


async def lanes(page: Page) -> list[dict[str, Any]]:
    fields = json.dumps(LANE_FIELDS)
    raw = await page.evaluate(
        f"JSON.stringify(consoleState.lanes.map((l) => Object.fromEntries("
        f"{fields}.map((k) => [k, l[k] === undefined ? null : l[k]]))))")
    result: list[dict[str, Any]] = json.loads(raw)
    return result


async def lane(page: Page, lane_id: int) -> dict[str, Any]:
    return next(entry for entry in await lanes(page) if entry["id"] == lane_id)


async def wait_lane(page: Page, lane_id: int, check: str, timeout_s: float, what: str
                    ) -> dict[str, Any]:
    """Wait until `check` (JS, over `l`, the lane) holds; return the lane as data."""
    await wait_for(page, f"(l => {check})(consoleState.lanes.find((l) => l.id === {lane_id}))",
                   timeout_s, f"lane {lane_id}: {what}")
    return await lane(page, lane_id)


async def set_options(page: Page, transports: list[str], **fields: object) -> None:
    assignments = "".join(
        f"form.elements[{json.dumps(k)}].value = {json.dumps(str(v))};" for k, v in fields.items())
    await page.evaluate(
        f"(() => {{ const form = document.getElementById('options'); {assignments}"
        f" for (const box of form.querySelectorAll('input[name=t]'))"
        f" box.checked = {json.dumps(transports)}.includes(box.value); }})()")


async def click(page: Page, selector: str) -> None:
    found = await page.evaluate(
        f"(() => {{ const b = document.querySelector({json.dumps(selector)});"
        f" if (!b || b.disabled) return false; b.click(); return true; }})()")
    assert found, f"no enabled button {selector}"


async def start(page: Page, transports: list[str], **fields: object) -> list[int]:
    """Fill the form, press Start; the new lanes' ids, in the transports' order."""
    before = {entry["id"] for entry in await lanes(page)}
    await set_options(page, transports, **fields)
    await click(page, "button[data-action=start]")
    started = [entry for entry in await lanes(page) if entry["id"] not in before]
    assert [entry["transport"] for entry in started] == transports
    return [entry["id"] for entry in started]


async def screenshot(page: Page, path: Path) -> None:
    data = await page.call("Page.captureScreenshot", {"format": "png"}, timeout_s=20)
    await anyio.Path(path.parent).mkdir(parents=True, exist_ok=True)
    await anyio.Path(path).write_bytes(base64.b64decode(str(data["data"])))


def screenshot_dir() -> Path | None:
    # Not into docs/ by default: a plain `make test` must leave the work tree as
    # it found it (the committed pictures are refreshed on purpose, with =docs).
    chosen = os.environ.get("STREAMLAB_CONSOLE_SCREENSHOTS", "")
    if chosen == "off":
        return None
    if chosen == "docs":
        return DOCS
    return Path(chosen) if chosen else RUN_SCREENSHOTS


# ---- the tests ---------------------------------------------------------------------------------
async def test_sse_and_polling_tick_stop_cancels_and_polling_leaks_until_its_ttl(
    page: Page, lab: LabTarget
) -> None:
    if len(lab.engine_names) > 1:
        pytest.skip("the console reads one engine's records (STREAMLAB_CONSOLE_ENGINE_TARGET); "
                    "with several engines the page's streams may run on another one")
    sse, poll = await start(page, ["sse-fetch", "poll"], answer_tokens=200, token_gap_ms=50,
                            prefill_ms=100, job_ttl_s=1)
    for lane_id in (sse, poll):
        ticks = await wait_lane(page, lane_id, "l.events.filter((e) => e.kind === 'token')"
                                ".length >= 3", 15, "three ticks on its timeline")
        assert ticks["ttftMs"] is not None
        assert ticks["requests"] >= 1
        assert ticks["bytes"] > 0

    await click(page, f"#lane-{sse} button[data-action=stop]")
    stopped = await wait_lane(page, sse, "l.engine && l.engine.state === 'cancelled'",
                              STOP_TO_CANCEL_BOUND_S + 2, "the engine's record cancelled")
    record = stopped["engine"]
    assert stopped["status"] == "stopped"
    assert 0 <= record["stop_to_cancel_ms"] <= STOP_TO_CANCEL_BOUND_S * 1000, record
    assert record["tokens_after_cancel"] <= 1, record
    assert record["tokens_generated"] < 200
    # The engine's own word, read by the test too.
    engine = lab.engine_stats(stopped["requestId"]).generations[0]
    assert engine.cancelled_at > 0
    assert engine.tokens_generated == record["tokens_generated"]

    # Polling's Stop only stops asking: the engine runs on (the leak) until the
    # job's TTL (1 s, asked for by the page) reaps it.
    await click(page, f"#lane-{poll} button[data-action=stop]")
    leaking = await wait_lane(page, poll, "l.engine !== null", 5, "the engine's record read")
    assert leaking["engine"]["state"] == "running", leaking["engine"]
    reaped = await wait_lane(page, poll, "l.engine.state !== 'running'", 10,
                             "the job's TTL reaping the generation")
    assert reaped["engine"]["state"] == "cancelled"
    assert reaped["engine"]["tokens_generated"] > reaped["tokens"], \
        "the engine went on generating after the page stopped polling"


async def test_a_latency_toxic_from_the_page_shifts_ttft(page: Page) -> None:
    options = {"answer_tokens": 5, "token_gap_ms": 20, "prefill_ms": 100}
    # The first stream pays for the browser's first connection and the CORS
    # preflight (then cached); the best of three is the clean reference, so a
    # busy moment on a shared machine does not hide the toxic's shift.
    clean_ttfts = []
    for _ in range(3):
        (before,) = await start(page, ["sse-fetch"], **options)
        clean = await wait_lane(page, before, "l.ended", 15, "the end")
        assert clean["status"] == "done"
        clean_ttfts.append(clean["ttftMs"])

    await page.evaluate(f"(() => {{ const field = document.querySelector("
                        f"'[data-hop-input=edge-latency]'); field.value = '{LATENCY_MS}';"
                        f" field.dispatchEvent(new Event('input')); }})()")
    await click(page, ".hop[data-hop=edge] button[data-op=latency]")
    await wait_for(page, "consoleState.hops.edge.toxics.some((t) => t.type === 'latency')", 5,
                   "the latency toxic listed on the edge")
    (after,) = await start(page, ["sse-fetch"], **options)
    slow = await wait_lane(page, after, "l.ended", 15, "the end")
    assert slow["status"] == "done"
    shift_ms = slow["ttftMs"] - min(clean_ttfts)
    assert LATENCY_MS - 100 <= shift_ms <= LATENCY_MS + 900, (clean_ttfts, slow["ttftMs"])

    await click(page, ".hop[data-hop=edge] button[data-action=remove-toxic]")
    await wait_for(page, "consoleState.hops.edge.toxics.length === 0", 5, "the toxic removed")


async def test_cut_edge_eventsource_resumes_with_last_event_id_and_ends_once(
    page: Page, lab: LabTarget
) -> None:
    tokens = 60
    # Every transport through the same cut; the EventSource is the one that resumes.
    lane_id, fetch_id, ws_id, *poll_ids = await start(
        page, ["eventsource", "sse-fetch", "websocket", "long-poll", "poll"],
        answer_tokens=tokens, token_gap_ms=50, prefill_ms=100, grace_s=10)
    await wait_lane(page, lane_id, "l.tokens >= 5", 15, "five tokens")
    await click(page, ".hop[data-hop=edge] button[data-op=disable]")
    await wait_for(page, "consoleState.hops.edge.enabled === false", 5, "the edge shown disabled")
    cut = await wait_lane(page, lane_id, "l.connectionErrors >= 1", 10, "the connection lost")
    assert cut["tokens"] < tokens, "the cut must land mid-stream"
    await click(page, ".hop[data-hop=edge] button[data-op=enable]")
    end = await wait_lane(page, lane_id, "l.ended && l.reconnects.every((r) => "
                          "r.gatewaySaw !== undefined)", 30, "the end")

    expected = "".join(token_text(i) for i in range(tokens))
    assert end["status"] == "done"
    assert end["ends"] == 1, "the terminal event arrived exactly once"
    assert end["indexes"] == list(range(tokens)), "every token once, in order"
    assert end["text"] == expected
    assert [e["kind"] for e in end["events"]].count("end") == 1
    # The reconnect sent the last id the page had, and the gateway saw that one.
    first = end["reconnects"][0]
    assert first["lastEventId"] == f"{end['streamId']}:{cut['tokens']}"
    assert first["gatewaySaw"] == first["lastEventId"]
    async with httpx.AsyncClient(timeout=5.0) as http:
        status = (await http.get(f"{lab.edge_url}/v1/streams/{end['streamId']}")).json()
    assert [a["last_event_id"] for a in status["attaches"]][:2] == [None, first["lastEventId"]]

    # The others, through the same cut: the SSE fetch and the socket end without
    # their [DONE]; a poll is a fresh request each time, so polling carries on.
    for other in (fetch_id, ws_id):
        cut_short = await wait_lane(page, other, "l.ended", 15, "its end")
        assert cut_short["status"] in {"error", "cut"}, cut_short["events"][-3:]
        assert cut_short["tokens"] < tokens
    for other in poll_ids:
        polled = await wait_lane(page, other, "l.ended", 30, "its end")
        assert polled["status"] == "done"
        assert polled["indexes"] == list(range(tokens))
    if (folder := screenshot_dir()) is not None:
        await screenshot(page, folder / "console.png")


def preset_names() -> list[str]:
    """STREAMLAB_CONSOLE_PRESETS: `all`, or names separated by commas; the
    representative set when unset."""
    chosen = os.environ.get("STREAMLAB_CONSOLE_PRESETS", "")
    if chosen == "all":
        return list(scenario_names())
    names = [name.strip() for name in chosen.split(",") if name.strip()]
    unknown = set(names) - set(scenario_names())
    assert not unknown, f"STREAMLAB_CONSOLE_PRESETS names no scenario {sorted(unknown)}"
    return names or list(REPRESENTATIVE)


# How long a preset's streams may take to end: the engine faults' 200-token
# answers end at the fault, a black hole after both keepalives, a leaking job never.
PRESET_BOUND_S = 25.0


@pytest.mark.local_only("the presets are the console's own logic (the same code on "
                        "both targets); 35 s of streams, run by the local suite")
async def test_presets_apply_their_setup_and_run_their_streams(page: Page, lab: LabTarget) -> None:
    folder = screenshot_dir()
    for name in preset_names():
        for mode in MODES:
            await click(page, f"button[data-action=preset][data-scenario='{name}']"
                              f"[data-mode={mode}]")
            preset = await wait_for(page, f"consoleState.preset && consoleState.preset.scenario"
                                          f" === '{name}' && consoleState.preset.mode === "
                                          f"'{mode}' && consoleState.lanes.length > 0 && "
                                          "JSON.stringify(consoleState.preset)", 10,
                                    f"{name} [{mode}] applied")
            preset = json.loads(preset)
            # The setup's toxics are on (and, once the page applied it, the mid-stream fault's).
            with lab.toxiproxy() as toxiproxy:
                applied = {(hop, t["type"]) for hop in HOP_NAMES for t in toxiproxy.toxics(hop)}
            setup = {(t["hop"], t["type"]) for t in preset["toxics"]}
            fault = preset["fault"] or {"hop": "", "toxics": []}
            assert setup <= applied <= setup | {(fault["hop"], t["type"])
                                                 for t in fault["toxics"]}, name
            await finish_preset(page, preset)
            if folder is not None:
                await screenshot(page, folder / "console" / f"{name}-{mode}.png")
            await forget_jobs(page, lab)


async def forget_jobs(page: Page, lab: LabTarget) -> None:
    """Mop up what a broken preset leaks on purpose (a job with TTL 0 is held
    forever), as the scenario's own harness does, so the suite's gateway does
    not carry it into the next test."""
    async with httpx.AsyncClient(base_url=lab.edge_url, timeout=5.0) as http:
        for entry in await lanes(page):
            if entry["jobId"]:
                gone = await http.delete(f"/v1/jobs/{entry['jobId']}")
                assert gone.status_code in (204, 404), gone.text


async def finish_preset(page: Page, preset: dict[str, Any]) -> None:
    """Let the preset's streams run: press Stop where the scenario is about
    leaving, and wait for every lane to end (or, stopped, for the engine's word)."""
    ids = [entry["id"] for entry in await lanes(page)]
    if preset["press_stop"]:
        after = preset["stop_after_tokens"]
        for lane_id in ids:
            await wait_lane(page, lane_id, f"l.status === 'streaming' && l.tokens >= {after}", 15,
                            f"streaming, {after} tokens in")
            await click(page, f"#lane-{lane_id} button[data-action=stop]")
        # Then what the engine did: cancelled (fixed), or wrote on for nobody to the end.
        for lane_id in ids:
            await wait_lane(page, lane_id, "l.engine && l.engine.state !== 'running'",
                            PRESET_BOUND_S, "the engine's record to end")
        return
    if preset["patience_s"] is not None:
        # A client that may wait forever (a black hole, no watchdog): watch it
        # for the scenario's own patience; a watchdog ends it well within.
        with anyio.move_on_after(preset["patience_s"]):
            for lane_id in ids:
                await wait_lane(page, lane_id, "l.ended", PRESET_BOUND_S, "the end")
        ended = [entry["ended"] for entry in await lanes(page)]
        assert all(ended) == (preset["watchdog_s"] is not None), (preset["scenario"], ended)
        return
    for lane_id in ids:
        await wait_lane(page, lane_id, "l.ended", PRESET_BOUND_S, "the end")


async def test_the_control_api_names_what_it_refuses(lab: LabTarget) -> None:
    """The console's server translates each layer's refusal (no browser needed)."""
    if selected_lab_has_no_console(lab):
        pytest.skip("this lab was started without its console")
    async with httpx.AsyncClient(base_url=console_url(lab.ports), timeout=5.0) as api:
        # The page's token, as the page sends it with every change (guard.py).
        api.headers["X-Streamlab-Console-Token"] = await page_token(api)
        bad_hop = await api.post("/api/hops/nowhere/toxics", json={"type": "latency"})
        assert bad_hop.status_code == 404
        assert "nowhere" in bad_hop.json()["error"]
        bad_attribute = await api.post("/api/hops/edge/toxics",
                                       json={"type": "latency", "attributes": {"latncy": 5}})
        assert bad_attribute.status_code == 400
        assert "latncy" in bad_attribute.json()["error"]
        assert (await api.post("/api/presets/no-such/broken")).status_code == 404
        assert (await api.post("/api/presets/buffering/sideways")).status_code == 404
        assert (await api.get("/api/engine/generations/never-seen")).status_code == 404
        # What does answer: the engine's counters and the gateway's figures.
        engine = (await api.get("/api/engine")).json()
        assert engine["running_limit"] > 0
        gateway = (await api.get("/api/gateway")).json()
        assert gateway["live_streams"] is not None


# ---- other sites: the console is driven by its own page only ------------------------------
TOKEN = re.compile(r'name="streamlab-console-token" content="([^"]+)"')
EVIL = "https://evil.example"


async def page_token(api: httpx.AsyncClient) -> str:
    """The token as the page gets it: from the page the console serves."""
    page = await api.get("/")
    assert page.status_code == 200
    found = TOKEN.search(page.text)
    assert found, "no token in the console's page"
    return found.group(1)


async def toxics_now(api: httpx.AsyncClient) -> dict[str, list[str]]:
    hops = (await api.get("/api/hops")).json()
    return {hop: [t["name"] for t in info["toxics"]] for hop, info in hops.items()
            if info["toxics"]}


async def test_another_site_cannot_change_the_lab(lab: LabTarget) -> None:
    """What a page on any site could do: a `text/plain` POST needs no
    preflight, so it reached the control API, applied a preset (toxics on the
    lab's hops) and reset the lab."""
    if selected_lab_has_no_console(lab):
        pytest.skip("this lab was started without its console")
    base = console_url(lab.ports)
    async with httpx.AsyncClient(base_url=base, timeout=5.0) as api:
        before = await toxics_now(api)
        with_toxics = next(p for p in (await api.get("/api/presets")).json() if p["toxics"])
        preset = f"/api/presets/{with_toxics['scenario']}/{with_toxics['mode']}"
        simple = {"Content-Type": "text/plain"}  # what a form or a plain fetch sends
        for headers in ({**simple, "Origin": EVIL}, {**simple, "Origin": "null"},
                        simple,  # no Origin (an old browser, a redirect): the token decides
                        {**simple, "Origin": base, "X-Streamlab-Console-Token": "guess"}):
            refused = await api.post(preset, headers=headers, content=b"x")
            assert refused.status_code == 403, (headers, refused.text)
            assert "error" in refused.json()
        assert await toxics_now(api) == before, "a refused preset still set its toxics"

        own = {"X-Streamlab-Console-Token": await page_token(api), "Origin": base}
        leaked = {**simple, "Origin": EVIL,  # a leaked token is still another site's
                  "X-Streamlab-Console-Token": own["X-Streamlab-Console-Token"]}
        assert (await api.post(preset, headers=leaked)).status_code == 403
        assert (await api.post("/api/reset", headers=own)).status_code == 200
        assert await toxics_now(api) == {}

        # The lab's own page changes it; another site cannot undo that either.
        assert (await api.post(preset, headers=own)).status_code == 200
        applied = await toxics_now(api)
        assert applied
        for method, path in (("POST", "/api/reset"), ("POST", "/api/hops/edge/enabled"),
                             ("DELETE", f"/api/hops/{next(iter(applied))}/toxics/"
                                        f"{applied[next(iter(applied))][0]}")):
            refused = await api.request(method, path, headers={**simple, "Origin": EVIL},
                                        content=b'{"enabled": false}')
            assert refused.status_code == 403
        assert await toxics_now(api) == applied
        assert (await api.post("/api/reset", headers=own)).status_code == 200
        assert await toxics_now(api) == {}


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1",
                                  "127.0.0.1:1"])
async def test_a_rebound_name_is_refused_even_for_reads(lab: LabTarget, host: str) -> None:
    """DNS rebinding: a page on evil.example, its name re-resolved to
    127.0.0.1, is same-origin with the console and could read the page (and
    its token). Its requests still say `Host: evil.example`."""
    if selected_lab_has_no_console(lab):
        pytest.skip("this lab was started without its console")
    base = console_url(lab.ports)
    async with httpx.AsyncClient(base_url=base, timeout=5.0) as api:
        rebound = {"Host": host.format(port=lab.ports.console_port)}
        for path in ("/", "/api/lab", "/api/hops"):
            refused = await api.get(path, headers=rebound)
            assert refused.status_code == 403, (path, refused.text)
            assert "streamlab-console-token" not in refused.text
        # Probes stay open; the console's own names are served.
        assert (await api.get("/healthz", headers={"Host": "evil.example"})).status_code == 200
        for name in ("127.0.0.1", "localhost"):
            own = await api.get("/api/lab", headers={"Host": f"{name}:{lab.ports.console_port}"})
            assert own.status_code == 200
