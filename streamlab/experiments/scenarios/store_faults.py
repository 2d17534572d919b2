"""store-faults: latency, then a black hole, on the `store` hop (gateways →
Redis), under live resumable streams on 2 gateways.

    phases   a completed stream is read whole; live streams are following;
             300 ms latency on the store for LATENCY_S; then the store stops
             answering (Toxiproxy `timeout` 0: a black hole, the harsh kind of
             cut: a refused connection fails fast on its own) for CUT_S, and
             during it a client resumes a live stream; then the store is back,
             and the completed stream is read again from the start
    broken   STREAMLAB_GATEWAY_REDIS_TIMEOUT_S=30: the resume during the cut
             hangs (the client gives up after PATIENCE_S with nothing at all)
    fixed    the default bound (1 s): within the bound the resume gets a
             200 whose one event is `event: retry` (`resume_store_unavailable`:
             come back, not an end; a 503 would stop an EventSource for
             good), works again after, and no text is lost

Both modes: the live streams end whole, exactly once (the owner's readers
read its memory; a reader on the other gateway is late while the store is
down and catches up), and the completed stream's text is there after.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time

import httpx

from services.client.openai_stream import chat_body
from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios.model import Scenario, Setup, Variant
from streamlab.experiments.scenarios.reconnect_storm import Client, Storm
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.scenarios.replica_lab import private_lab
from streamlab.experiments.timing import Timing
from streamlab.lab.target import LabTarget
from streamlab.lab.toxiproxy import Toxic

LIVE_STREAMS = 10
LIVE_TOKENS, LIVE_GAP_MS = 60, 200  # 12 s: live through both faults, with room
LATENCY_MS, LATENCY_S = 300, 1.5
CUT_S = 4.0
PATIENCE_S = 3.0  # a resume unanswered this long during the cut is a hang
BROKEN_REDIS_TIMEOUT_S = 30
FIXED_REDIS_TIMEOUT_S = 1.0
RETRY_MS = 200  # the live readers come back quickly after any cut
AFTER_DEADLINE_S = 10.0  # the store is back: a resume must work again within this


def _complete(client: Client, tokens: int) -> bool:
    return (client.terminal == "done" and client.tokens == tokens
            and sorted(client.seqs) == list(range(1, len(client.seqs) + 1)))


def _max_stall(clients: list[Client], start: float, end: float) -> float:
    """The longest gap between tokens of any live stream within [start, end)."""
    worst = 0.0
    for client in clients:
        times = [t for t in client.token_times if start <= t < end]
        worst = max([worst, *(b - a for a, b in itertools.pairwise(times))])
    return worst


async def store_faults(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    mode = str(setup.knobs.get("mode", "fixed"))
    redis_timeout = FIXED_REDIS_TIMEOUT_S if mode == "fixed" else BROKEN_REDIS_TIMEOUT_S
    env = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": f"{redis_timeout:g}",
           "STREAMLAB_GATEWAY_RESUME_RETRY_MS": str(RETRY_MS),
           "STREAMLAB_GATEWAY_RESUME_GRACE_S": "30"}
    async with private_lab(lab, "store-faults", gateways=2, gateway_env=env) as private:
        host, port = private.ports.host, private.ports.edge_port
        short = Storm(host, port, chat_body("store faults, done", prefill_ms=timing.prefill_ms,
                                            token_gap_ms=timing.gap_ms,
                                            answer_tokens=timing.tokens))
        completed = Client()
        await short.create(completed)
        await short.follow(completed, short.now() + 30)
        live_run = Storm(host, port, chat_body("store faults, live", prefill_ms=timing.prefill_ms,
                                               token_gap_ms=LIVE_GAP_MS,
                                               answer_tokens=LIVE_TOKENS))
        live = [Client() for _ in range(LIVE_STREAMS)]
        await asyncio.gather(*(live_run.create(c) for c in live))
        tasks = [asyncio.create_task(live_run.follow(c, live_run.now() + 60)) for c in live]
        figures: Figures = {"mode_redis_timeout_s": redis_timeout}
        async with httpx.AsyncClient(base_url=private.edge_url,
                                     timeout=httpx.Timeout(PATIENCE_S, connect=5.0)) as http:
            with private.toxiproxy() as toxiproxy:
                await asyncio.sleep(1.0)  # every live stream under way
                status = (await http.get(f"/v1/streams/{live[0].stream_id}")).json()
                # A replica's id is hostname:port by default.
                urls = {str(private.port_of(g)): private.url_of(g)
                        for g in private.gateway_names}
                owner = urls.pop(str(status["replica"]).rsplit(":", 1)[-1])
                other = next(iter(urls.values()))
                latency_from = time.perf_counter()
                for hop in private.hops_of("store"):  # every gateway's: the store is slow
                    toxiproxy.add_toxic(hop, Toxic("latency", {"latency": LATENCY_MS}))
                await asyncio.sleep(LATENCY_S)
                latency_to = time.perf_counter()
                toxiproxy.reset()
                for hop in private.hops_of("store"):
                    toxiproxy.add_toxic(hop, Toxic("timeout", {"timeout": 0}, "upstream"))
                cut_from = time.perf_counter()
                await asyncio.sleep(0.5)
                # Straight to each gateway: the owner serves its readers from
                # memory; the other one needs the store.
                figures["cut_stream_live"] = live[0].terminal is None
                figures.update(await _resume(http, live[0], "cut_resume", other),
                               **await _resume(http, live[0], "cut_owner_resume", owner))
                await asyncio.sleep(max(0.0, CUT_S - (time.perf_counter() - cut_from)))
                toxiproxy.reset()
                cut_to = time.perf_counter()
                resumed_at = live[0].last_event_id
            # After: the store is back; a resume works, and the completed stream reads whole.
            # The shared log catches up on its writer's backoff: resume until it
            # works, and say what was answered first and how long it took.
            back_from = time.perf_counter()
            first = after = await _resume(http, live[0], "after_resume", other, resumed_at)
            while (not _works(after) and time.perf_counter() - back_from < AFTER_DEADLINE_S):
                await asyncio.sleep(0.2)
                after = await _resume(http, live[0], "after_resume", other, resumed_at)
            figures.update(after, after_works=_works(after),
                           after_first_status=first["after_resume_status"],
                           after_first_error=first["after_resume_error"],
                           after_works_s=round(time.perf_counter() - back_from, 2))
            again = Client(stream_id=completed.stream_id)
            await short.follow(again, short.now() + 30)
        await asyncio.gather(*tasks)
    figures.update(
        live_streams=len(live),
        live_complete=sum(_complete(c, LIVE_TOKENS) for c in live),
        # What each stream that did not end whole ended with, so a failed
        # verdict says how (its end event or none, tokens, events seen).
        live_incomplete="; ".join(
            f"{c.terminal or 'no end'}, {c.tokens} tokens, {len(c.seqs)} events"
            f"{', cut' if c.cut else ''}" for c in live if not _complete(c, LIVE_TOKENS)),
        live_duplicates=sum(len(c.seqs) - len(set(c.seqs)) for c in live),
        latency_max_stall_s=round(_max_stall(live, latency_from, latency_to), 2),
        cut_max_stall_s=round(_max_stall(live, cut_from, cut_to + 2), 2),
        completed_first=_complete(completed, timing.tokens),
        completed_text_intact=_complete(again, timing.tokens) and again.data == completed.data,
    )
    return figures


def _works(resume: Figures) -> bool:
    """A resume that gets the stream (200 with events, or 204 when it ended)."""
    status, code = resume["after_resume_status"], str(resume["after_resume_error"])
    return status == 204 or (status == 200 and not code.startswith(("retry", "error")))


async def _resume(http: httpx.AsyncClient, client: Client, name: str, gateway: str,
                  last_event_id: str | None = None) -> Figures:
    """One resume of a live stream on one gateway from its last event (or
    `last_event_id`): status, time, error code."""
    started = time.perf_counter()
    headers = {"Last-Event-ID": last_event_id or client.last_event_id or "",
               "Accept": "text/event-stream"}
    status, code, hung = 0, "", False
    try:
        async with http.stream("GET", f"{gateway}/v1/streams/{client.stream_id}/events",
                               headers=headers) as response:
            status = response.status_code
            if status != 200:
                body = (await response.aread()).decode(errors="replace")
                code = str(httpx.Response(status, content=body).json()
                           .get("error", {}).get("code", "")) if body.startswith("{") else ""
            else:
                # A 200 during an outage must still say so in-band (`event:
                # retry`: come back; `event: error`: the old, terminal answer).
                code = "ended_without_a_word"  # unless an event says otherwise
                async for line in response.aiter_lines():
                    if line.startswith(("event: error", "event: retry")):
                        code = line.removeprefix("event: ")
                    elif line.startswith("data:") and code in ("error", "retry"):
                        data = line[5:].strip()
                        with contextlib.suppress(ValueError, AttributeError):
                            data = str(json.loads(data).get("code") or json.loads(data)
                                       .get("error", {}).get("code"))
                        code = f"{code}: {data[:80]}"
                        break
                    elif line.startswith("event: token"):
                        code = ""
                        break
    except httpx.ReadTimeout:
        hung = True
    except httpx.HTTPError as exc:
        code = type(exc).__name__
    return {f"{name}_status": status, f"{name}_error": code, f"{name}_hung": hung,
            f"{name}_s": round(time.perf_counter() - started, 2)}


WHOLE = (
    Check("live_complete", "==", LIVE_STREAMS, "every live stream ends whole"),
    Check("live_duplicates", "==", 0, "exactly once"),
    Check("completed_text_intact", "==", True, "the completed stream's text is all there after"),
)

STORE_FAULTS = Scenario(
    name="store-faults",
    summary="latency and a black hole on the store hop (Redis): live streams keep "
            "flowing, a resume during the outage is told to come back (event: retry) "
            "within the Redis bound, and works again after",
    measure=store_faults,
    broken=Variant(
        Setup(knobs={"mode": "broken"}),
        (Check("cut_stream_live", "==", True, "the resumed stream was still running"),
         Check("cut_resume_hung", "==", True,
               f"the resume during the outage has no answer after {PATIENCE_S:g} s"),),
        f"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S={BROKEN_REDIS_TIMEOUT_S}: every store call "
        "waits that long"),
    fixed=Variant(
        Setup(knobs={"mode": "fixed"}),
        (Check("cut_stream_live", "==", True, "the resumed stream was still running"),
         Check("cut_resume_hung", "==", False),
         Check("cut_resume_status", "==", 200, "an answer an EventSource retries"),
         Check("cut_resume_error", "==", "retry: resume_store_unavailable",
               "come back (event: retry), not a hang and not an end"),
         Check("cut_resume_s", "<=", lambda t: FIXED_REDIS_TIMEOUT_S + 1 + t.tolerance_s,
               "within the Redis bound"),
         Check("cut_owner_resume_status", "==", 200, "the owner still serves from memory"),
         Check("after_works", "==", True, "works again once the store is back (200, or "
               "204 when the stream has ended)"),
         Check("after_works_s", "<=", AFTER_DEADLINE_S),
         *WHOLE),
        f"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S={FIXED_REDIS_TIMEOUT_S:g} (the default)"),
    shown=("cut_resume_status", "cut_resume_error", "cut_resume_s", "cut_resume_hung",
           "cut_owner_resume_status", "after_first_status", "after_first_error",
           "after_works", "after_works_s", "latency_max_stall_s", "cut_max_stall_s",
           "live_complete", "live_duplicates", "completed_text_intact"),
)
register(STORE_FAULTS)
