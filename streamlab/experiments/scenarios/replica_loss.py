"""replica-loss: SIGKILL the gateway that owns a stream's generation, mid-stream.

A private lab (replica_lab.py): 2 gateways behind nginx sharing the resume
log in Redis, one engine. A few resumable streams are created through the
edge and read by EventSource-like readers (resuming_readers.py); once the
readers are a few tokens in, the gateway that owns most of them (their
`GET /v1/streams/{id}` says which) is SIGKILLed: its engine calls die with
it, as on a lost host.

    broken  STREAMLAB_GATEWAY_REATTACH=false: the other gateway finds the
            owner gone (its alive key expired) and can only end the stream:
            `cancelled` `owner_lost`, the rest of the text never comes.
    fixed   re-attach: the engine kept the generation running (its caller
            vanished, not cancelled), the other gateway claims the stream and
            `Attach`es after the log's last token; each reader ends with the
            whole text, each token once, and the engine ran one generation
            per stream (no second one started).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from services.client.openai_stream import chat_body
from services.engine.backends.fake import token_text
from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios.model import Scenario, Setup, Variant
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.scenarios.replica_lab import private_lab, say
from streamlab.experiments.scenarios.resuming_readers import Reader, readers_done, tally
from streamlab.experiments.timing import Timing
from streamlab.lab.local import Lab
from streamlab.lab.target import LabTarget

GATEWAYS = 2
STREAMS = 6
GAP_MS = 50
TOKENS = 80  # 4 s: the kill comes after KILL_AFTER_TOKENS, well before the end
KILL_AFTER_TOKENS = 10
RETRY_MS = 250

GATEWAY_ENV = {
    "STREAMLAB_GATEWAY_RESUME_RETRY_MS": str(RETRY_MS),
    "STREAMLAB_GATEWAY_HEARTBEAT_S": "1",
}


def request_body() -> dict[str, object]:
    body = chat_body("replica loss", prefill_ms=100, token_gap_ms=GAP_MS,
                     answer_tokens=TOKENS, max_tokens=TOKENS)
    body["resume"] = {"retry_ms": RETRY_MS}
    return body


async def create(lab: Lab, count: int) -> list[tuple[str, str]]:
    """(events URL, owning gateway) per stream, created through the edge."""
    by_port = {lab.port_of(name): name for name in lab.gateway_names}
    streams = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
        for _ in range(count):
            created = (await http.post(f"{lab.edge_url}/v1/streams", json=request_body()))
            created.raise_for_status()
            stream = created.json()
            status = (await http.get(f"{lab.edge_url}/v1/streams/{stream['id']}")).json()
            owner = by_port.get(int(str(status["replica"]).rsplit(":", 1)[1]), "?")
            streams.append((str(stream["events_url"]), owner))
    return streams


async def replica_loss(target: LabTarget, setup: Setup, timing: Timing) -> Figures:
    reattach = bool(setup.knobs["reattach"])
    async with private_lab(target, "replica-loss", gateways=GATEWAYS, gateway_env={
            **GATEWAY_ENV, "STREAMLAB_GATEWAY_REATTACH": str(reattach).lower()}) as lab:
        streams = await create(lab, STREAMS)
        victim = Counter(owner for _, owner in streams).most_common(1)[0][0]
        readers = [(Reader(lab.ports.host, lab.ports.edge_port, path, retry_ms=RETRY_MS), owner)
                   for path, owner in streams]
        reading = asyncio.gather(*(r.run() for r, _ in readers))
        victims = [r for r, owner in readers if owner == victim]
        deadline = time.monotonic() + 20
        while (min(len(r.tokens) for r in victims) < KILL_AFTER_TOKENS  # noqa: ASYNC110
               and time.monotonic() < deadline):
            await asyncio.sleep(0.02)
        tokens_at_kill = min(len(r.tokens) for r in victims)
        say("replica-loss", f"SIGKILL {victim}, the owner of {len(victims)} of "
            f"{len(readers)} streams, {tokens_at_kill} tokens in")
        await asyncio.to_thread(lab.kill_service, victim)
        await readers_done(reading, TOKENS * GAP_MS / 1000 + 30)
        stats = await asyncio.to_thread(lab.engine_stats)
    reference = "".join(token_text(i) for i in range(TOKENS))
    figures = tally(victims, reference, TOKENS)
    reasons = Counter(str((r.terminal_data or {}).get("reason", r.terminal or r.error))
                      for r in victims if r.terminal != "done")
    return {
        **figures,
        "owner_killed": victim,
        "tokens_at_kill": tokens_at_kill,
        "other_streams_whole": (tally(others, reference, TOKENS)["streams_whole"]
                                if (others := [r for r, o in readers if o != victim])
                                else None),
        "end_reasons": ", ".join(f"{k} {v}" for k, v in reasons.items()) or "done",
        "engine_generations_started": stats.generations_started,
        "engine_generations_reattached": stats.generations_reattached,
    }


KILLED = (
    Check("streams", ">=", 1, "the killed gateway owned streams"),
    Check("tokens_at_kill", ">=", KILL_AFTER_TOKENS, "killed mid-stream, not before it"),
)
REPLICA_LOSS = Scenario(
    name="replica-loss",
    summary="SIGKILL the gateway that owns a generation mid-stream: does the client "
            "still get its whole text, exactly once?",
    measure=replica_loss,
    broken=Variant(
        Setup(knobs={"reattach": False}),
        (*KILLED,
         Check("streams_whole", "==", 0, "no stream of the lost owner ends whole"),
         Check("tokens_lost", ">", 0, "the rest of the text never comes"),
         Check("end_reasons", "!=", "done", "an error end (owner_lost), not a silent gap")),
        "STREAMLAB_GATEWAY_REATTACH=false: the other gateway can only end the stream "
        "(owner_lost)"),
    fixed=Variant(
        Setup(knobs={"reattach": True}),
        (*KILLED,
         Check("streams_lost", "==", 0, "every reader ends with the whole text and done"),
         Check("tokens_lost", "==", 0, "no token lost"),
         Check("tokens_duplicated", "==", 0, "no token twice"),
         Check("engine_generations_started", "==", STREAMS,
               "one generation per stream: re-attached, not restarted"),
         Check("engine_generations_reattached", ">=", 1, "the other gateway re-attached")),
        "re-attach: the engine keeps the orphaned generation, the other gateway claims "
        "the stream and Attaches after the log's last token"),
    shown=("owner_killed", "streams", "tokens_at_kill", "streams_whole", "streams_lost",
           "tokens_lost", "tokens_duplicated", "gap_events", "end_reasons", "reconnects",
           "longest_stall_s", "engine_generations_started", "engine_generations_reattached",
           "other_streams_whole"),
)
register(REPLICA_LOSS)
