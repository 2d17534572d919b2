"""A real browser resumes on its own: chromium's native EventSource, through the
edge, while Toxiproxy takes the edge down in the middle of the stream.

The demo page (services/gateway/static/demo.html, served at /demo) appends every
token as it arrives with no de-duplication, so a replay that repeats or skips
anything shows in its text. Nothing here tells the browser to reconnect or
what to send: EventSource does it itself, with the `retry:` and the ids the
gateway sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from services.engine.backends.fake import token_text
from streamlab.experiments.browser import Page, chromium_page, find_chromium
from streamlab.lab.local import Lab
from tests.wait import wait_until_async

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TOKENS, GAP_MS, RETRY_MS = 60, 50, 200
CUT_AFTER_TOKENS = 5


async def page_state(page: Page) -> dict[str, Any] | None:
    """The demo page's state, or None while the page (its `demo`) is not there yet:
    Page.navigate returns before the new document runs its script."""
    state: dict[str, Any] | None = await page.evaluate(
        "typeof demo === 'undefined' ? null : "
        "JSON.parse(JSON.stringify({status: demo.status, streamId: demo.streamId,"
        " text: demo.text, indexes: demo.indexes, opens: demo.opens, errors: demo.errors,"
        " gaps: demo.gaps, lastEventId: demo.lastEventId,"
        " shown: document.getElementById('text').textContent}))")
    return state


async def wait_for(page: Page, check: Callable[[dict[str, Any]], bool], timeout_s: float,
                   what: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        state = await page_state(page)
        return state if state is not None and check(state) else None
    try:
        return await wait_until_async(reached, timeout_s=timeout_s, interval_s=0.02,
                                      what=f"the page to reach: {what}")
    except AssertionError as exc:
        # The state that failed the check says more than its None.
        raise AssertionError(f"{exc}; the page's state: {await page_state(page)}") from None


async def test_browser_event_source_resumes_after_a_mid_stream_cut(lab: Lab) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/install.sh installs it as root)")
    url = (f"{lab.edge_url}/demo?tokens={TOKENS}&gap_ms={GAP_MS}&prefill_ms=100"
           f"&retry_ms={RETRY_MS}&grace_s=10")
    toxiproxy = lab.toxiproxy()
    try:
        async with chromium_page(chromium) as page:
            await page.navigate(url)
            before = await wait_for(page, lambda s: len(s["indexes"]) >= CUT_AFTER_TOKENS, 15,
                                    f"{CUT_AFTER_TOKENS} tokens")
            # The cut: Toxiproxy closes the browser's connection and refuses new
            # ones until the page has seen the error, then lets them through.
            toxiproxy.set_enabled("edge", False)
            cut = await wait_for(page, lambda s: s["errors"] >= 1, 10, "a connection error")
            toxiproxy.set_enabled("edge", True)
            assert cut["status"] == "reconnecting"  # EventSource will try again by itself
            assert len(cut["indexes"]) < TOKENS, "the cut must land mid-stream"

            end = await wait_for(page, lambda s: s["status"] in {"done", "failed", "cancelled"},
                                 30, "the end of the stream")
    finally:
        toxiproxy.reset()
        toxiproxy.close()

    expected = "".join(token_text(i) for i in range(TOKENS))
    assert end["status"] == "done"
    assert end["indexes"] == list(range(TOKENS)), "every token once, in order"
    assert end["text"] == expected
    assert end["shown"] == expected  # what the DOM shows
    assert end["gaps"] == []
    assert end["opens"] >= 2

    # The gateway saw the browser come back with Last-Event-ID set by itself,
    # at (or after) the point the page had reached when the edge went down.
    stream_id = before["streamId"]
    async with httpx.AsyncClient(timeout=5.0) as http:
        status = (await http.get(f"{lab.edge_url}/v1/streams/{stream_id}")).json()
    resumed = [a for a in status["attaches"] if a["last_event_id"]]
    assert resumed, status["attaches"]
    assert status["attaches"][0]["last_event_id"] is None
    owner, seq = resumed[0]["last_event_id"].split(":")
    assert owner == stream_id
    assert int(seq) == len(cut["indexes"])  # the last event it had, no more, no less
    assert status["state"] == "completed"

