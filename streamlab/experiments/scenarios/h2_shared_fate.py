"""HTTP/2's shared fate: one TCP connection carries every tab's stream, so one
cut on the edge ends all of them at the same instant; resume brings each back.

    broken  seven streams on the resume surface over one HTTP/2 connection
            (edge-h2), read by clients that do not come back: one `reset_peer`
            on the edge-h2 hop truncates all seven at once
    fixed   the same seven and the same one cut, read EventSource's way
            (`retry:`, then Last-Event-ID): every stream comes back on a new
            connection and gets every token exactly once

Each reader creates its stream (`POST /v1/streams`) and follows it at once;
the seven share one httpx client limited to one connection, as a browser's
tabs share one per origin. The cut waits until every stream has CUT_AFTER
tokens (a progress callback, not a sleep), then the toxic stays until the
first reconnection removes it: one cut, however many streams it hits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import anyio
import httpx

from services.client.openai_stream import chat_body
from services.client.resume_stream import ResumeResult, create_stream, follow_stream
from services.engine.backends.fake import token_text
from streamlab.experiments.report import JSON, Check, Figures
from streamlab.experiments.scenarios.model import Scenario, ScenarioUnavailable, Setup, Variant
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.scenarios.seventh_tab import ConnectionCounter
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability, LabTarget
from streamlab.lab.toxiproxy import Toxic

STREAMS = 7
CUT_AFTER = 3  # tokens every stream has before the cut
# Long enough that no stream ends before the cut, however slowly the seven are
# created on a loaded machine (each starts generating at its POST).
STREAM_TOKENS = 100
RETRY_MS = 100
HOP = "edge-h2"
CUT = Toxic("reset_peer", {"timeout": 0}, name="shared_fate_cut")


def _body(timing: Timing) -> dict[str, JSON]:
    body: dict[str, JSON] = chat_body("shared fate", prefill_ms=timing.prefill_ms,
                                      token_gap_ms=timing.gap_ms, answer_tokens=STREAM_TOKENS)
    body["resume"] = {"retry_ms": RETRY_MS}
    return body


class Cut:
    """One reset_peer on the hop once every stream has CUT_AFTER tokens; the first
    reconnection takes it off again."""

    def __init__(self, lab: LabTarget, counter: ConnectionCounter) -> None:
        self.lab = lab
        self.counter = counter
        self.progress: Counter[str] = Counter()
        self.ready = asyncio.Event()
        self.lock = asyncio.Lock()
        self.applied_at: float | None = None
        self.removed = False
        self.connections_at_cut = 0
        self.tokens_at_cut: list[int] = []

    def on_token(self, stream_id: str) -> None:
        self.progress[stream_id] += 1
        if len(self.progress) == STREAMS and min(self.progress.values()) >= CUT_AFTER:
            self.ready.set()

    async def apply_when_ready(self) -> None:
        await self.ready.wait()
        self.counter.sample()
        self.connections_at_cut = self.counter.peak
        self.tokens_at_cut = sorted(self.progress.values())
        await asyncio.to_thread(self._toxiproxy, "add")
        self.applied_at = time.monotonic()

    async def remove(self) -> None:
        async with self.lock:
            if not self.removed and self.applied_at is not None:
                await asyncio.to_thread(self._toxiproxy, "remove")
                self.removed = True

    def _toxiproxy(self, action: str) -> None:
        with self.lab.toxiproxy() as toxiproxy:
            if action == "add":
                toxiproxy.add_toxic(HOP, CUT)
            else:
                toxiproxy.remove_toxic(HOP, CUT.as_json()["name"])


async def shared_fate(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    if not await asyncio.to_thread(lab.h2_ready):
        raise ScenarioUnavailable(f"no HTTP/2 edge answers at {lab.edge_h2_url} with the lab "
                                  f"CA in {lab.tls.dir} (compose: `streamlab compose tls`)")
    resume = bool(setup.knobs.get("resume"))
    context = lab.tls.ssl_context()
    timeout = httpx.Timeout(10.0, connect=5.0)
    counter = ConnectionCounter(lab.ports.host, lab.ports.edge_h2_port)
    cut = Cut(lab, counter)
    cut_seen: dict[str, float] = {}
    results: dict[str, ResumeResult] = {}

    created: list[dict[str, JSON]] = []
    # The tabs: one client, at most one connection, every stream on it; each
    # creates its stream and follows it at once.
    one = httpx.Limits(max_connections=1)
    sampler = asyncio.create_task(counter.run())
    try:
        async with httpx.AsyncClient(http2=True, verify=context, timeout=timeout,
                                     limits=one) as http:

            async def follow() -> None:
                stream = await create_stream(http, lab.edge_h2_url, _body(timing))
                created.append(stream)
                sid = stream["id"]

                async def before_connect(attempt: int) -> None:
                    if attempt:
                        cut_seen.setdefault(sid, time.monotonic())
                        await cut.remove()

                results[sid] = await follow_stream(
                    http, lab.edge_h2_url, stream, resume=resume, max_connections=10,
                    before_connect=before_connect, default_retry_ms=RETRY_MS,
                    on_token=lambda _i, _t: cut.on_token(sid))
                cut_seen.setdefault(sid, time.monotonic())

            with anyio.fail_after(30 + STREAM_TOKENS * timing.gap_s):
                async with anyio.create_task_group() as group:
                    group.start_soon(cut.apply_when_ready)
                    for _ in range(STREAMS):
                        group.start_soon(follow)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await cut.remove()
        async with httpx.AsyncClient(http2=True, verify=context, timeout=timeout) as http:
            for stream in created:  # the un-resumed ones would run on until their grace
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(f"{lab.edge_h2_url}{stream['status_url']}")
    return figures_of(list(results.values()), cut, cut_seen, counter)


def figures_of(results: list[ResumeResult], cut: Cut, cut_seen: dict[str, float],
               counter: ConnectionCounter) -> Figures:
    expected = [(i, token_text(i)) for i in range(STREAM_TOKENS)]
    missing = duplicates = 0
    for result in results:
        counts = Counter(result.indexes)
        missing += sum(1 for i, _ in expected if i not in counts)
        duplicates += sum(n - 1 for n in counts.values() if n > 1)
    cut_times = [cut_seen[r.stream_id] for r in results if r.stream_id in cut_seen
                 and r.connections and r.connections[0].ended in ("transport", "eof")]
    return {
        "streams": len(results),
        "tcp_connections_at_cut": cut.connections_at_cut,
        "tcp_connections_seen": len(counter.seen),
        "tokens_before_cut_min": cut.tokens_at_cut[0] if cut.tokens_at_cut else None,
        "streams_cut": sum(1 for r in results
                           if r.connections and r.connections[0].ended in ("transport", "eof")),
        # When each stream noticed the cut (its reader's reconnect, or its end).
        "cut_spread_s": round(max(cut_times) - min(cut_times), 3) if cut_times else None,
        "reconnections": sum(len(r.connections) - 1 for r in results),
        "streams_exact": sum(1 for r in results if r.tokens == expected),
        "missing_total": missing,
        "duplicates_total": duplicates,
        "streams_done": sum(1 for r in results if r.terminal == "done"),
    }


ALL_AT_ONCE = (
    Check("tcp_connections_at_cut", "==", 1, "seven streams, one TCP connection"),
    Check("streams_cut", "==", STREAMS, "one cut hit every stream"),
    Check("cut_spread_s", "<=", lambda t: t.tolerance_s, "all at the same moment"),
)
H2_SHARED_FATE = Scenario(
    name="h2-shared-fate",
    summary="HTTP/2 puts every tab on one TCP connection: one reset on the edge cuts all "
            "seven at once; resume (Last-Event-ID) brings each back exactly once",
    measure=shared_fate,
    broken=Variant(
        Setup(knobs={"resume": False}),
        (*ALL_AT_ONCE,
         Check("streams_exact", "==", 0, "not one stream is whole"),
         Check("missing_total", ">", 0, "everything after the cut is lost, on every stream")),
        "readers that do not come back: one cut truncates every tab"),
    fixed=Variant(
        Setup(knobs={"resume": True}),
        (*ALL_AT_ONCE,
         Check("streams_exact", "==", STREAMS, "every stream has every token, in order"),
         Check("missing_total", "==", 0, "none lost"),
         Check("duplicates_total", "==", 0, "none twice"),
         Check("streams_done", "==", STREAMS)),
        "EventSource's way: retry:, then Last-Event-ID, replay, live"),
    needs=frozenset({Capability.TOGGLE_HOPS}),
    shown=("streams", "tcp_connections_at_cut", "tcp_connections_seen", "tokens_before_cut_min",
           "streams_cut", "cut_spread_s", "reconnections", "streams_exact", "missing_total",
           "duplicates_total", "streams_done"),
)
register(H2_SHARED_FATE)
