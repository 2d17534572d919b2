"""The seventh tab: seven browser tabs, each with an EventSource on a long,
slow stream from the edge, in one real (headless) chromium.

    broken  the HTTP/1.1 origin (edge): a browser holds at most six
            connections per origin and each open SSE stream keeps one, so six
            tabs stream and the seventh waits, queued inside the browser,
            until another tab closes and frees its connection
    fixed   the HTTP/2 origin (edge-h2, TLS): every tab's stream is one HTTP/2
            stream of one TCP connection; all seven stream at once

The streams are the resume surface's (`POST /v1/streams`, created here once
the tabs are open, then each tab's `new EventSource(events_url)`: a GET, as
EventSource must). The tabs are opened and loaded first (a tiny same-origin
page, /nginx-health), so only the streams compete for connections. After HOLD_S, or as soon as all
seven stream, another tab is closed; the seventh's wait (the tab still
waiting, whichever the browser queued) is from its EventSource's creation to
its first event. Connections are counted on the
hop's listening port in /proc/net/tcp (the browser's sockets to Toxiproxy):
this host's network namespace, so the browser must run here.

Chromium trusts the lab CA's server key only, by
--ignore-certificate-errors-spki-list (the key's SPKI hash): narrower than
--ignore-certificate-errors (which would accept any certificate from
anywhere) and no NSS database to build (docs/http2.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass

import httpx

from services.client.openai_stream import chat_body
from services.client.resume_stream import create_stream
from streamlab.experiments import socket_queues
from streamlab.experiments.browser import Browser, Page, chromium, find_chromium, trust_spki_flag
from streamlab.experiments.report import JSON, Check, Figures
from streamlab.experiments.scenarios.model import Scenario, ScenarioUnavailable, Setup, Variant
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.timing import Timing
from streamlab.lab.target import LabTarget

TABS = 7
HTTP1_CONNECTIONS_PER_ORIGIN = 6  # chromium's (and every browser's) limit per origin
HOLD_S = 2.0  # how long the six stream while the seventh waits, before a tab closes
STREAM_GAP_MS = 200  # a slow stream: five tokens a second
STREAM_OUTLASTS_S = HOLD_S + 12.0  # the streams outlast every step of the scenario
SAMPLE_S = 0.05


@dataclass(frozen=True)
class TabState:
    """What a tab's EventSource saw (_start_script's `tab`), page clock in ms;
    all None before the script ran."""

    t0: float | None = None
    first: float | None = None  # the first token
    errors: int | None = None
    protocol: str | None = None  # the navigation's: "http/1.1" or "h2"

    @classmethod
    def of(cls, value: JSON) -> TabState:
        if not isinstance(value, dict):
            return cls()
        t0, first, errors, protocol = (value.get(k) for k in ("t0", "first", "errors",
                                                               "protocol"))
        return cls(t0=float(t0) if isinstance(t0, int | float) else None,
                   first=float(first) if isinstance(first, int | float) else None,
                   errors=errors if isinstance(errors, int) else None,
                   protocol=protocol if isinstance(protocol, str) else None)


async def _tab_state(page: Page) -> TabState:
    value: JSON = await page.evaluate(
        "typeof tab === 'undefined' ? null : JSON.parse(JSON.stringify(tab))")
    return TabState.of(value)


def _start_script(events_url: str) -> str:
    """An EventSource in the page, and what it saw (page clock, ms since the epoch)."""
    return f"""(() => {{
      const s = {{t0: Date.now(), first: null, events: 0, errors: 0, opened: null,
                 protocol: performance.getEntriesByType('navigation')[0]?.nextHopProtocol}};
      window.tab = s;
      const es = new EventSource({json.dumps(events_url)});
      es.onopen = () => {{ if (s.opened === null) s.opened = Date.now(); }};
      es.addEventListener('token', () => {{
        s.events += 1; if (s.first === null) s.first = Date.now(); }});
      es.onerror = () => {{ s.errors += 1; }};
      window.es = es;
      return true;
    }})()"""


class ConnectionCounter:
    """The browser's TCP connections to one listening port, sampled from /proc/net/tcp."""

    def __init__(self, host: str, port: int) -> None:
        self.remote = (host, port)
        self.seen: set[tuple[str, int]] = set()
        self.peak = 0

    def sample(self) -> None:
        sockets = socket_queues.read() or []
        now = {s.local for s in sockets if s.remote == self.remote}
        self.seen |= now
        self.peak = max(self.peak, len(now))

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_S)


async def _open_tabs(browser: Browser, origin: str) -> list[Page]:
    pages = []
    for _ in range(TABS):
        page = await browser.new_page()
        await page.navigate(f"{origin}/nginx-health")
        await page.wait_loaded()
        pages.append(page)
    return pages


async def _states(pages: list[Page]) -> list[TabState]:
    return list(await asyncio.gather(*(_tab_state(p) for p in pages)))


def _streaming(states: list[TabState]) -> int:
    return sum(1 for s in states if s.first is not None)


async def _create_streams(lab: LabTarget, timing: Timing) -> list[dict[str, JSON]]:
    tokens = math.ceil(STREAM_OUTLASTS_S * 1000 / STREAM_GAP_MS)
    body: dict[str, JSON] = chat_body("seventh tab", prefill_ms=timing.prefill_ms,
                                      token_gap_ms=STREAM_GAP_MS, answer_tokens=tokens)
    # Grace: a tab that has not attached yet (the seventh, in the broken mode)
    # must find its stream still there; DELETE ends them all at the end.
    body["resume"] = {"grace_s": STREAM_OUTLASTS_S}
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        return [await create_stream(http, lab.edge_url, body) for _ in range(TABS)]


async def _cancel_streams(lab: LabTarget, streams: list[dict[str, JSON]]) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as http:
        for stream in streams:
            with contextlib.suppress(httpx.HTTPError):
                await http.delete(f"{lab.edge_url}{stream['status_url']}")


async def seventh_tab(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    h2 = setup.knobs.get("origin") == "h2"
    executable = find_chromium()
    if executable is None:
        raise ScenarioUnavailable("chromium is not installed (scripts/install.sh installs "
                                  "Debian's as root)")
    if h2 and not await asyncio.to_thread(lab.h2_ready):
        raise ScenarioUnavailable(f"no HTTP/2 edge answers at {lab.edge_h2_url} with the lab "
                                  f"CA in {lab.tls.dir} (compose: `streamlab compose tls`)")
    origin = lab.edge_h2_url if h2 else lab.edge_url
    port = lab.ports.edge_h2_port if h2 else lab.ports.edge_port
    flags = [trust_spki_flag([lab.tls.server_spki_sha256()])] if h2 else []
    counter = ConnectionCounter(lab.ports.host, port)

    async with chromium(executable, flags) as browser:
        pages = await _open_tabs(browser, origin)
        # Created once the tabs are open (starting a browser and seven tabs can
        # take longer than a stream lasts on a loaded machine), before the count
        # starts: this client's connections are closed by then.
        streams = await _create_streams(lab, timing)
        sampler = asyncio.create_task(counter.run())
        try:
            figures = await _race(browser, pages, streams, timing)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            await _cancel_streams(lab, streams)
    return {**figures, "edge_connections_peak": counter.peak,
            "edge_connections_seen": len(counter.seen)}


async def _race(browser: Browser, pages: list[Page], streams: list[dict[str, JSON]],
                timing: Timing) -> Figures:
    """Start the seven EventSources, hold, close a streaming tab, wait for the seventh.

    "The seventh" is the tab still waiting when the hold ends (whichever one
    the browser queued: it need not be the last one started), or the last
    one started when none waits."""
    for page, stream in zip(pages, streams, strict=True):
        await page.evaluate(_start_script(str(stream["events_url"])))
    started = time.monotonic()
    states = await _states(pages)
    while _streaming(states) < TABS and time.monotonic() - started < HOLD_S:
        await asyncio.sleep(SAMPLE_S)
        states = await _states(pages)
    at_once = _streaming(states)

    waiting = [p for p, s in zip(pages, states, strict=True) if s.first is None]
    seventh = waiting[0] if waiting else pages[-1]
    closed_at_ms = time.time() * 1000
    await browser.close_page(next(p for p in pages if p is not seventh))
    deadline = time.monotonic() + HOLD_S + 10 * timing.tolerance_s + 5.0
    state = await _tab_state(seventh)
    while state.first is None and time.monotonic() < deadline:
        await asyncio.sleep(SAMPLE_S)
        state = await _tab_state(seventh)
    first, t0 = state.first, state.t0
    return {
        "tabs": TABS,
        "protocol": state.protocol,
        "streaming_at_once": at_once,
        "pending_tabs": TABS - at_once,
        "seventh_streamed": first is not None,
        "seventh_wait_s": None if first is None or t0 is None else round((first - t0) / 1000, 3),
        # Negative: it streamed before any tab closed.
        "seventh_after_close_s": None if first is None
        else round((first - closed_at_ms) / 1000, 3),
        "seventh_errors": state.errors,
    }


SEVENTH_TAB = Scenario(
    name="seventh-tab",
    summary="seven tabs each with an EventSource: over HTTP/1.1 the seventh waits for a free "
            "connection (six per origin); over HTTP/2 all seven share one",
    measure=seventh_tab,
    broken=Variant(
        Setup(knobs={"origin": "http1"}),
        (Check("protocol", "==", "http/1.1"),
         Check("streaming_at_once", "==", HTTP1_CONNECTIONS_PER_ORIGIN,
               "six tabs stream: one connection each, six per origin"),
         Check("edge_connections_peak", ">=", HTTP1_CONNECTIONS_PER_ORIGIN,
               "Toxiproxy held six connections from the one browser"),
         Check("seventh_wait_s", ">=", 0.9 * HOLD_S,
               "the seventh waited for the whole hold, queued inside the browser"),
         Check("seventh_after_close_s", ">=", 0.0, "it started only once a tab closed"),
         Check("seventh_streamed", "==", True, "then it streams, on the freed connection")),
        "the HTTP/1.1 origin (edge): one connection per open stream"),
    fixed=Variant(
        Setup(knobs={"origin": "h2"}),
        (Check("protocol", "==", "h2"),
         Check("streaming_at_once", "==", TABS, "all seven stream at once"),
         # One connection carries all seven; chromium may hold a second, spare
         # one for a moment (seen once in CI: peak 2), still far from six.
         Check("edge_connections_peak", "<=", 2,
               "over one TCP connection (a spare at most), not one per tab"),
         Check("seventh_wait_s", "<=", lambda t: HOLD_S / 2 + t.tolerance_s,
               "the seventh starts as fast as the first"),
         Check("seventh_streamed", "==", True)),
        "the HTTP/2 origin (edge-h2, TLS): one stream per tab on one connection"),
    shown=("protocol", "streaming_at_once", "pending_tabs", "seventh_wait_s",
           "seventh_after_close_s", "edge_connections_peak", "edge_connections_seen",
           "seventh_streamed"),
)
register(SEVENTH_TAB)
