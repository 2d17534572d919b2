"""Resume through trouble that passes: a private lab of 2 gateways sharing
Redis and 2 engines (streamlab/experiments/scenarios/replica_lab.py).

owner-killed-storm   hundreds of resumable streams live through the edge
                     (150 in the catalogue, `--streams 500` for the full
                     storm); the edge is cut for 2 s, and 0.5 s into the cut
                     the gateway that owns most of them is SIGKILLed. The
                     clients (reconnect_storm.py's cheap EventSource-like
                     ones, jittered `retry:`) come back to the survivor.
        broken   no re-attach (STREAMLAB_GATEWAY_REATTACH=false) and the
                 terminal answer to trouble: the lost owner's streams end
                 `cancelled` `owner_lost`
        fixed    the survivor takes every stream over and re-attaches to its
                 generation: every stream whole, each token once, one
                 generation per stream

transient-blip       a few streams owned by one gateway, read half on it and
                     half on the other; the store hop off 2 s, then both
                     engine hops off 2 s.
        broken   STREAMLAB_GATEWAY_RESUME_TRANSIENT=terminal: readers
                 elsewhere get a terminal `error` (`resume_store_unavailable`)
                 or a 503 an EventSource stops at, and the engine-hop blip
                 fails every stream `error`
        fixed    `event: retry` (the reader reconnects with its Last-Event-ID)
                 and a re-attach to the same generation when the engine hop
                 is back: every reader ends `done` with every token once

Both count what the engines say of the generations whose clients were told
`cancelled` or `error`: with the fix none of them completed for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter

import httpx
import redis

from services.client.openai_stream import chat_body
from services.engine.backends.fake import token_text
from services.gateway.resume.redis_keys import stream_keys
from services.gateway.resume.redis_store import KEY_PREFIX
from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios.history import judge
from streamlab.experiments.scenarios.model import Scenario, Setup, Variant
from streamlab.experiments.scenarios.reconnect_storm import Client, Storm
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.scenarios.replica_lab import private_lab, say
from streamlab.experiments.scenarios.resuming_readers import Reader, readers_done, tally
from streamlab.experiments.timing import Timing
from streamlab.lab.local import Lab
from streamlab.lab.target import LabTarget
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# ---- owner-killed-storm --------------------------------------------------------------
CATALOGUE_STREAMS = 150  # what 2 shared cores run beside the lab; --streams for more
STORM_TOKENS, STORM_GAP_MS = 100, 200  # 20 s: live through the ramp, the cut, the take-over
RAMP_S = 5.0
CUT_AFTER_RAMP_S = 0.5
CUT_S = 2.0
KILL_INTO_CUT_S = 0.5
GIVE_UP_AFTER_S = 60.0


def storm_env(reattach: bool) -> dict[str, str]:
    """Fixed: the shipped settings (jittered `retry:`, resumes first, the 10 s
    grace and attach timeout). Broken: no re-attach, and the terminal answer
    to trouble."""
    if reattach:
        return {}
    return {"STREAMLAB_GATEWAY_REATTACH": "false",
            "STREAMLAB_GATEWAY_RESUME_TRANSIENT": "terminal"}


def metas(lab: Lab, ids: list[str]) -> dict[str, dict[str, str]]:
    """Each stream's metadata, read straight from the lab's Redis in one
    pipeline (not a status GET per stream through the edge: hundreds of those
    are load the storm does not need)."""
    with redis.Redis.from_url(lab.redis_url, decode_responses=True,
                              socket_timeout=10.0) as direct:
        pipe = direct.pipeline(transaction=False)
        for stream_id in ids:
            pipe.hgetall(stream_keys(KEY_PREFIX, stream_id).meta)
        return dict(zip(ids, pipe.execute(), strict=True))


def owner_name(lab: Lab, meta: dict[str, str]) -> str:
    by_port = {lab.port_of(name): name for name in lab.gateway_names}
    port = meta.get("replica", "?").rsplit(":", 1)[-1]
    return by_port.get(int(port), "?") if port.isdigit() else "?"


def completed_for_nobody(stats: pb.GetStatsResponse, told_over: set[str]) -> int:
    """Generations the engines completed whose clients were told the stream
    ended without its text (`cancelled`, `error`)."""
    return sum(1 for record in stats.generations if record.request_id in told_over
               and record.state == pb.GENERATION_STATE_COMPLETED)


def whole(client: Client) -> bool:
    return (client.terminal == "done" and client.tokens == STORM_TOKENS
            and client.seqs == list(range(1, STORM_TOKENS + 2)))


async def owner_killed_storm(target: LabTarget, setup: Setup, timing: Timing) -> Figures:
    reattach = bool(setup.knobs["reattach"])
    # The suite's smaller storm (storm_streams) when it asks for one.
    n = timing.streams or min(CATALOGUE_STREAMS, timing.storm_streams)
    async with private_lab(target, "owner-killed-storm", gateways=2, engines=2,
                           gateway_env=storm_env(reattach)) as lab:
        body = chat_body("owner killed mid-storm", prefill_ms=timing.prefill_ms,
                         token_gap_ms=STORM_GAP_MS, answer_tokens=STORM_TOKENS)
        run = Storm(lab.ports.host, lab.ports.edge_port, body)
        clients = [Client() for _ in range(n)]
        give_up_at = RAMP_S + CUT_AFTER_RAMP_S + CUT_S + GIVE_UP_AFTER_S
        tasks, created = run.launch(clients, give_up_at)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(created.wait(), RAMP_S + 20)
        ids = [c.stream_id for c in clients if c.stream_id]
        owned = {i: owner_name(lab, meta)
                 for i, meta in (await asyncio.to_thread(metas, lab, ids)).items()}
        victim = Counter(owned.values()).most_common(1)[0][0]
        with lab.toxiproxy() as toxiproxy:
            await asyncio.sleep(CUT_AFTER_RAMP_S)
            live_at_cut = sum(1 for c in clients if owned.get(c.stream_id) == victim
                              and c.tokens > 0 and c.terminal is None)
            toxiproxy.set_enabled("edge", False)  # closes every connection through it
            await asyncio.sleep(KILL_INTO_CUT_S)
            say("owner-killed-storm", f"SIGKILL {victim}, owner of "
                f"{sum(o == victim for o in owned.values())} of {n} streams, mid-cut")
            killed_at = time.monotonic()
            await asyncio.to_thread(lab.kill_service, victim)
            await asyncio.sleep(max(0.0, CUT_S - KILL_INTO_CUT_S - (time.monotonic() - killed_at)))
            toxiproxy.set_enabled("edge", True)
        await asyncio.gather(*tasks)
        stats = await asyncio.to_thread(lab.engine_stats)
        # Why the streams that did not end whole ended (their metadata says).
        lost = [c.stream_id or "?" for c in clients if not whole(c)]
        reasons = Counter(
            f"{meta.get('state', 'not created')} {meta.get('cancel_reason', '')}".strip()
            for meta in (await asyncio.to_thread(metas, lab, lost)).values())
    victims = [c for c in clients if owned.get(c.stream_id) == victim]
    ends = Counter(c.terminal or "none" for c in clients if not whole(c))
    told_over = {c.stream_id for c in clients if c.terminal in ("cancelled", "error")}
    return {
        "streams": n,
        "created": run.creates[201],
        "owner_killed": victim,
        "owned_by_killed": len(victims),
        "live_at_cut": live_at_cut,
        "streams_whole": sum(whole(c) for c in clients),
        "killed_owners_streams_whole": sum(whole(c) for c in victims),
        "streams_lost": sum(not whole(c) for c in clients),
        # Every client's events (history.py): duplicates, order, silent gaps, an end.
        **judge([c.history for c in clients], STORM_TOKENS),
        "ends_other_than_done": ", ".join(f"{k} {v}" for k, v in ends.most_common(3)) or "none",
        "end_reasons": ", ".join(f"{k} {v}" for k, v in reasons.most_common(3)) or "none",
        "engine_generations_started": stats.generations_started,
        "engine_generations_reattached": stats.generations_reattached,
        "completed_for_nobody": completed_for_nobody(stats, told_over),
    }


OWNER_KILLED_STORM = Scenario(
    name="owner-killed-storm",
    summary="the edge cut under a storm of resumable streams and their owning gateway "
            "SIGKILLed mid-cut: does every stream still end whole, exactly once?",
    measure=owner_killed_storm,
    broken=Variant(
        Setup(knobs={"reattach": False}),
        (Check("owned_by_killed", ">=", 1, "the killed gateway owned streams"),
         Check("live_at_cut", ">=", 1, "cut and killed mid-stream"),
         Check("killed_owners_streams_whole", "==", 0,
               "none of the lost owner's streams ends whole"),
         Check("ends_other_than_done", "!=", "none", "they end owner_lost, not silently")),
        "STREAMLAB_GATEWAY_REATTACH=false: the survivor can only end the lost owner's "
        "streams (owner_lost)"),
    fixed=Variant(
        Setup(knobs={"reattach": True}),
        (Check("owned_by_killed", ">=", 1, "the killed gateway owned streams"),
         Check("live_at_cut", ">=", 1, "cut and killed mid-stream"),
         Check("streams_lost", "==", 0, "every stream whole, ending done"),
         Check("duplicates", "==", 0, "each token once"),
         Check("histories_sound", "==", True, "no silent gap, no reader left waiting"),
         Check("engine_generations_reattached", ">=", 1, "the survivor re-attached"),
         Check("completed_for_nobody", "==", 0,
               "no generation completed for a client told it ended")),
        "the shipped settings: re-attach; the take-over waits out only a store outage seen by "
        "the survivor's own heartbeat (not its readers' timeouts under load); the engine "
        "holds an orphan 60 s"),
    shown=("streams", "owner_killed", "owned_by_killed", "live_at_cut", "streams_whole",
           "killed_owners_streams_whole", "streams_lost", "duplicates", "silent_gaps",
           "readers_hung", "retries_told", "ends_other_than_done",
           "end_reasons",
           "engine_generations_started", "engine_generations_reattached",
           "completed_for_nobody"),
)

# ---- transient-blip ----------------------------------------------------------------------
BLIP_STREAMS = 8
BLIP_TOKENS, BLIP_GAP_MS = 80, 100  # 8 s: live through both blips
BLIP_S = 2.0
OWNER, OTHER = "gateway", "gateway-2"
ENGINE_HOPS = ("engine", "engine-2")


def blip_env(transient: str) -> dict[str, str]:
    return {"STREAMLAB_GATEWAY_RESUME_TRANSIENT": transient,
            "STREAMLAB_GATEWAY_RESUME_RETRY_MS": "250"}


async def blip_both(lab: Lab) -> None:
    """The store hop off, back; then both engine hops off, back."""
    with lab.toxiproxy() as toxiproxy:
        for hops in (lab.hops_of("store"), ENGINE_HOPS):
            for hop in hops:
                toxiproxy.set_enabled(hop, False)
            await asyncio.sleep(BLIP_S)
            for hop in hops:
                toxiproxy.set_enabled(hop, True)
            await asyncio.sleep(0.5)


async def transient_blip(target: LabTarget, setup: Setup, timing: Timing) -> Figures:
    transient = str(setup.knobs["transient"])
    async with private_lab(target, "transient-blip", gateways=2, engines=2,
                           gateway_env=blip_env(transient)) as lab:
        body = chat_body("transient blip", prefill_ms=timing.prefill_ms,
                         token_gap_ms=BLIP_GAP_MS, answer_tokens=BLIP_TOKENS)
        readers: list[Reader] = []
        ids: list[str] = []
        async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
            for k in range(BLIP_STREAMS):
                created = await http.post(f"{lab.url_of(OWNER)}/v1/streams", json=body)
                created.raise_for_status()
                stream = created.json()
                ids.append(str(stream["id"]))
                on = lab.port_of(OWNER if k % 2 else OTHER)  # half elsewhere
                readers.append(Reader(lab.ports.host, on, str(stream["events_url"]),
                                      retry_ms=250, watchdog_s=15.0, max_connections=200))
        reading = asyncio.gather(*(r.run() for r in readers))
        deadline = time.monotonic() + 20
        while min(len(r.tokens) for r in readers) < 5 and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        tokens_at_blip = min(len(r.tokens) for r in readers)
        await blip_both(lab)
        await readers_done(reading, BLIP_TOKENS * BLIP_GAP_MS / 1000 + 40)
        stats = await asyncio.to_thread(lab.engine_stats)
    reference = "".join(token_text(i) for i in range(BLIP_TOKENS))
    told_over = {i for i, r in zip(ids, readers, strict=True)
                 if r.terminal in ("cancelled", "error") or r.error}
    return {
        **tally(readers, reference, BLIP_TOKENS),
        "tokens_at_blip": tokens_at_blip,
        "engine_generations_started": stats.generations_started,
        "engine_generations_reattached": stats.generations_reattached,
        "completed_for_nobody": completed_for_nobody(stats, told_over),
    }


TRANSIENT_BLIP = Scenario(
    name="transient-blip",
    summary="the store hop off 2 s, then both engine hops off 2 s, under live resumable "
            "streams: is trouble that passes ever an end?",
    measure=transient_blip,
    broken=Variant(
        Setup(knobs={"transient": "terminal"}),
        (Check("tokens_at_blip", ">=", 1, "the blips came mid-stream"),
         Check("streams_lost", ">=", 1, "a blip ended streams for good"),
         Check("ends_other_than_done", "!=", "none", "as a terminal error")),
        "STREAMLAB_GATEWAY_RESUME_TRANSIENT=terminal: a store blip is an `error` event or a "
        "503, an engine-hop blip fails the stream"),
    fixed=Variant(
        Setup(knobs={"transient": "retry"}),
        (Check("tokens_at_blip", ">=", 1, "the blips came mid-stream"),
         Check("streams_lost", "==", 0, "every reader ends done with the whole text"),
         Check("tokens_lost", "==", 0),
         Check("tokens_duplicated", "==", 0, "each token once"),
         Check("engine_generations_started", "==", BLIP_STREAMS,
               "one generation per stream: re-attached, not restarted"),
         Check("engine_generations_reattached", ">=", 1, "re-attached after the engine hop"),
         Check("completed_for_nobody", "==", 0)),
        "`event: retry` for a store blip (the reader reconnects with its Last-Event-ID), a "
        "re-attach to the same generation after an engine-hop blip"),
    shown=("streams", "tokens_at_blip", "streams_whole", "streams_lost", "tokens_lost",
           "tokens_duplicated", "reconnects", "ends_other_than_done", "longest_stall_s",
           "engine_generations_started", "engine_generations_reattached",
           "completed_for_nobody"),
)
register(OWNER_KILLED_STORM, TRANSIENT_BLIP)
