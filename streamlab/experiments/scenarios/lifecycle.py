"""Scenarios about a stream's life after the client: who stops the engine when
the client leaves, and what a reader that stops reading costs.

    abandoned-tab  the client leaves after 3 tokens: does the engine stop?
    abandoned-prefill  the client leaves during a silent prefill: is the close
                   noticed before anything is written?
    slow-reader    the client stops reading: does the engine pause, or run on?
    poll-leak      a polling client walks away: does its job ever end?

Broken and fixed differ by one per-request knob (the gateway's relay mode, a
polling job's TTL), so they run against any lab that is up. (A cut connection
that picks up where it fell off is resume.py's.)
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import httpx

from services.client.openai_stream import chat_body, stream_chat
from services.client.silent import open_silent_reader
from streamlab.experiments.generation_end import state_name, wait_for_end
from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios.model import (
    ClientSettings,
    Measured,
    Scenario,
    Setup,
    Variant,
    note_stream,
)
from streamlab.experiments.scenarios.plot import from_token_times
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability, LabTarget
from streamlab_protocol.engine.v1 import engine_pb2 as pb

LEAVE_AFTER = 3
# The engine's default max_tokens limit: more than every buffer on the way holds
# for one silent reader (the engine pauses near 2,500), so it runs on any lab.
FLOOD_TOKENS = 4096
# An abandoned polling job: TTL 1 s, and an answer that outlasts the TTL, the
# reaper's interval and the tolerance by 2 s at any gap (80 tokens at 50 ms).
JOB_TTL_S = 1.0


def job_tokens(timing: Timing) -> int:
    outlast_s = 1.25 * JOB_TTL_S + timing.tolerance_s + 2.0
    return LEAVE_AFTER + max(20, math.ceil(outlast_s / timing.gap_s))


async def record_when_done(lab: LabTarget, rid: str, timeout_s: float
                           ) -> pb.GenerationRecord | None:
    return await asyncio.to_thread(wait_for_end, lab.engine_stats, rid, timeout_s)


async def abandoned_tab(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    relay = str(setup.knobs.get("relay", "direct"))
    rid = f"scenario-abandon-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("write an essay", prefill_ms=timing.prefill_ms, token_gap_ms=timing.gap_ms,
                     answer_tokens=timing.tokens, relay=relay)
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        result = await stream_chat(http, f"{lab.edge_url}/v1/chat/completions", body,
                                   headers={"X-Request-Id": rid}, stop_after_tokens=LEAVE_AFTER)
    left_at = result.left_at or time.monotonic()
    record = await record_when_done(lab, rid, timing.model_total_s + 5)
    cancelled = record is not None and record.state == pb.GENERATION_STATE_CANCELLED
    figures: Figures = {
        "client_tokens": len(result.texts),
        "engine_state": state_name(record) if record else None,
        "tokens_generated": record.tokens_generated if record else None,
        "tokens_after_client_left": (record.tokens_generated - len(result.texts)
                                     if record else None),
        "tokens_after_cancel": record.tokens_after_cancel if record else None,
        "cancel_latency_ms": (round((record.cancelled_at - left_at) * 1000, 1)
                              if record and cancelled else None),
    }
    # For `scenario run --plot`: the leave ends the client's clock (total_s); the
    # engine's cancel is on the monotonic clock, placed from the leave.
    cancel = (result.total_s + record.cancelled_at - left_at) if record and cancelled else None
    return Measured(figures, (from_token_times(
        result.token_times, [(result.total_s, "leave"), (cancel, "cancel")]),))


# A long, silent prefill (no pings either), and a client that leaves early in it.
SILENT_PREFILL_MS = 3000
LEAVE_AT_S = 0.3


async def abandoned_prefill(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    """Open a stream through `setup.location`, take the 200 and its headers, and
    close during the prefill: nothing has been written since the headers, so
    only a proxy that watches the client's socket can tell the gateway."""
    rid = f"scenario-prefill-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("think first", prefill_ms=SILENT_PREFILL_MS, token_gap_ms=timing.gap_ms,
                     answer_tokens=timing.tokens, heartbeat_s=0)
    url = f"{lab.edge_url}{setup.location.rstrip('/')}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        async with http.stream("POST", url, json=body, headers={"X-Request-Id": rid}) as response:
            status = response.status_code
            await asyncio.sleep(LEAVE_AT_S)  # the client's own pace: it gives up
        left_at = time.monotonic()
    record = await record_when_done(lab, rid, SILENT_PREFILL_MS / 1000 + timing.model_total_s + 5)
    cancelled = record is not None and record.state == pb.GENERATION_STATE_CANCELLED
    return {
        "status": status,
        "left_after_s": LEAVE_AT_S,
        "engine_state": state_name(record) if record else None,
        "tokens_generated": record.tokens_generated if record else None,
        "cancel_latency_ms": (round((record.cancelled_at - left_at) * 1000, 1)
                              if record and cancelled else None),
    }


async def slow_reader(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    """A client that sends its request and never reads, straight at the gateway
    (through the whole chain, every hop's socket buffers would hold megabytes first)."""
    relay = str(setup.knobs.get("relay", "direct"))
    rid = f"scenario-slow-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("flood", prefill_ms=0, token_gap_ms=0, answer_tokens=FLOOD_TOKENS,
                     max_tokens=FLOOD_TOKENS, relay=relay)
    sock = await asyncio.to_thread(open_silent_reader, lab.ports.host, lab.ports.gateway_port,
                                   "/v1/chat/completions", body, {"X-Request-Id": rid})
    paused_at: int | None = None
    try:
        last, still_since = -1, time.monotonic()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            records = (await asyncio.to_thread(lab.engine_stats, rid)).generations
            if records:
                record = records[0]
                if record.state != pb.GENERATION_STATE_RUNNING:
                    break
                if record.tokens_generated != last:
                    last, still_since = record.tokens_generated, time.monotonic()
                elif time.monotonic() - still_since >= 1.0:
                    paused_at = last  # no progress for a second: flow control holds it
                    break
            await asyncio.sleep(0.1)
    finally:
        sock.close()
    final = await record_when_done(lab, rid, 10)
    return {
        "paused_by_flow_control": paused_at is not None,
        "paused_at_tokens": paused_at,
        "tokens_generated": final.tokens_generated if final else None,
        "engine_state": state_name(final) if final else None,
    }


async def abandoned_job(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    """Start a polling job through the edge, long-poll until a few tokens have
    come, then walk away, as a closed tab does: no request, no connection."""
    ttl_s = setup.knobs.get("job_ttl_s")
    rid = f"scenario-poll-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    tokens = job_tokens(timing)
    body = chat_body("poll me", prefill_ms=timing.prefill_ms, token_gap_ms=timing.gap_ms,
                     answer_tokens=tokens, max_tokens=tokens, job_ttl_s=ttl_s)
    jobs = f"{lab.edge_url}/v1/jobs"
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        started = await http.post(jobs, json=body, headers={"X-Request-Id": rid})
        if started.status_code != 201:
            return {"start_status": started.status_code, "engine_state": None}
        job = started.json()
        seen, end = 0, time.monotonic() + timing.model_total_s + 5
        while seen < LEAVE_AFTER and time.monotonic() < end:
            polled = await http.get(f"{jobs}/{job['id']}", params={"since": seen, "wait_s": 2.0})
            if polled.status_code != 200:
                return {"start_status": started.status_code, "poll_status": polled.status_code,
                        "engine_state": None}
            seen = polled.json()["next"]
        left_at = time.monotonic()
        generation_s = timing.prefill_s + tokens * timing.gap_s
        record = await record_when_done(lab, rid, generation_s + 5)
        # Last, since asking counts as polling: is the job still held?
        held = (await http.get(f"{jobs}/{job['id']}", params={"since": seen})).status_code == 200
        if held:  # the harness mops up its own leak, so reruns do not pile up
            await http.delete(f"{jobs}/{job['id']}")
    cancelled = record is not None and record.state == pb.GENERATION_STATE_CANCELLED
    return {
        "start_status": started.status_code,
        "job_ttl_s": job["ttl_s"],
        "tokens_asked": tokens,
        "client_tokens": seen,
        "engine_state": state_name(record) if record else None,
        "tokens_generated": record.tokens_generated if record else None,
        "tokens_after_client_left": record.tokens_generated - seen if record else None,
        "tokens_after_cancel": record.tokens_after_cancel if record else None,
        "reaped_after_s": (round(record.cancelled_at - left_at, 2)
                           if record and cancelled else None),
        "job_held_at_end": held,
    }


LIFECYCLE: tuple[Scenario, ...] = (
    Scenario(
        name="abandoned-tab",
        summary="the client leaves after 3 tokens; the engine must stop, not write on for nobody",
        measure=abandoned_tab,
        broken=Variant(
            Setup(knobs={"relay": "detached_unbounded"}),
            (Check("engine_state", "==", "completed", "the engine wrote the whole answer"),
             Check("tokens_generated", "==", lambda t: t.tokens, "every token, for nobody")),
            "relay: detached_unbounded (a background task nobody cancels)"),
        fixed=Variant(
            Setup(knobs={"relay": "direct"}),
            (Check("engine_state", "==", "cancelled"),
             Check("tokens_after_cancel", "<=", 1, "at most the decode step under way"),
             Check("cancel_latency_ms", "<", 1000, "the engine heard within a second")),
            "relay: direct (disconnect → task group cancelled → gRPC call cancelled)"),
        needs=frozenset({Capability.ENGINE_RECORD}),
        shown=("client_tokens", "engine_state", "tokens_generated", "tokens_after_client_left",
               "tokens_after_cancel", "cancel_latency_ms"),
        client=ClientSettings(leave_after_tokens=LEAVE_AFTER),
    ),
    Scenario(
        name="abandoned-prefill",
        summary="the client leaves during a silent 3 s prefill: nginx must pass the close on "
                "at once, not at the next write",
        measure=abandoned_prefill,
        broken=Variant(
            Setup(location="/ignore-client-abort/"),
            (Check("status", "==", 200),
             Check("cancel_latency_ms", ">=",
                   lambda t: (SILENT_PREFILL_MS / 1000 - LEAVE_AT_S - t.tolerance_s) * 1000,
                   "the prefill ran to its end for nobody: the cancel waited for a write"),
             Check("tokens_generated", ">=", 1, "and the first token was made for nobody")),
            "/ignore-client-abort/: proxy_ignore_client_abort on (nginx notices at the "
            "next failed write)"),
        fixed=Variant(
            Setup(location="/"),
            (Check("status", "==", 200),
             Check("engine_state", "==", "cancelled"),
             Check("cancel_latency_ms", "<", lambda t: t.tolerance_s * 1000,
                   "the engine heard at once, mid-prefill"),
             Check("tokens_generated", "==", 0, "nothing was generated for nobody")),
            "/: nginx closes the upstream when the client closes (its default)"),
        needs=frozenset({Capability.ENGINE_RECORD}),
        shown=("status", "left_after_s", "engine_state", "tokens_generated",
               "cancel_latency_ms"),
        client=ClientSettings(prefill_ms=SILENT_PREFILL_MS, silent_prefill=True,
                              leave_after_tokens=0),
    ),
    Scenario(
        name="slow-reader",
        summary="a client that stops reading: flow control must pause the engine",
        measure=slow_reader,
        broken=Variant(
            Setup(knobs={"relay": "detached_unbounded"}),
            (Check("paused_by_flow_control", "==", False, "the engine never slowed down"),
             Check("tokens_generated", "==", FLOOD_TOKENS, "it wrote everything into memory")),
            "relay: detached_unbounded (an unbounded queue between engine and client)"),
        fixed=Variant(
            Setup(knobs={"relay": "direct"}),
            (Check("paused_by_flow_control", "==", True),
             Check("tokens_generated", "<", FLOOD_TOKENS, "stopped before the end"),
             Check("engine_state", "==", "cancelled", "and cancelled when the client left")),
            "relay: direct (bounded read-ahead: 16 KiB gRPC window per stream)"),
        needs=frozenset({Capability.ENGINE_RECORD}),
        shown=("paused_by_flow_control", "paused_at_tokens", "tokens_generated", "engine_state"),
    ),
    Scenario(
        name="poll-leak",
        summary="a polling client walks away after 3 tokens: without a TTL its job generates "
                "to the end and stays in memory; with one it is cancelled and deleted",
        measure=abandoned_job,
        broken=Variant(
            Setup(knobs={"job_ttl_s": 0}),
            (Check("start_status", "==", 201, "the gateway accepted the broken mode"),
             Check("engine_state", "==", "completed", "the engine wrote the whole answer"),
             Check("tokens_generated", "==", job_tokens, "every token, for nobody"),
             Check("job_held_at_end", "==", True, "and the gateway still holds them all")),
            "job_ttl_s: 0 (no TTL: nothing tells the gateway the client has gone)"),
        fixed=Variant(
            Setup(knobs={"job_ttl_s": JOB_TTL_S}),
            (Check("start_status", "==", 201),
             Check("engine_state", "==", "cancelled"),
             Check("tokens_after_cancel", "<=", 1, "at most the decode step under way"),
             Check("reaped_after_s", "<=", lambda t: 1.25 * JOB_TTL_S + t.tolerance_s,
                   "within the TTL plus one reaper interval of the last poll"),
             Check("job_held_at_end", "==", False, "deleted: its id now answers 404")),
            f"job_ttl_s: {JOB_TTL_S:g} (the reaper cancels and deletes jobs nobody polls)"),
        needs=frozenset({Capability.ENGINE_RECORD}),
        shown=("job_ttl_s", "client_tokens", "tokens_asked", "engine_state", "tokens_generated",
               "tokens_after_client_left", "tokens_after_cancel", "reaped_after_s",
               "job_held_at_end"),
        client=ClientSettings(answer_tokens=job_tokens, leave_after_tokens=LEAVE_AFTER),
    ),
)
register(*LIFECYCLE)
