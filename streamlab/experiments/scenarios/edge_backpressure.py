"""A reader that stops reading, through the whole chain (the edge, nginx, the
upstream hop): is it cut, and its generation cancelled, within a stated
bound, or does the chain soak up the whole answer for nobody?

    slow-reader-edge  broken: a location that buffers the response (to disk
                      past its memory buffers) and waits nginx's default 60 s
                      on a client that takes nothing: the engine completes;
                      fixed: `/`, nginx's send buffer bounded and its send
                      timeout the gateway's: nginx cuts the client once the
                      hops in front of it are full, closes the upstream, and
                      the gateway cancels the generation

The gateway's own send timeout cannot do it through the chain: it starts only
once every buffer between it and the client is full, and on loopback the
hops behind nginx hold megabytes (the upstream Toxiproxy's autotuned send
buffer alone grows to tcp_wmem's 4 MiB; Toxiproxy sets no buffer sizes). So
the figures say where the bytes sit: each hop's socket queues (the kernel's,
from /proc/net/tcp: a local lab's only) at the fullest moment.
docs/cancellation-and-backpressure.md has them per hop.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx

from services.client.openai_stream import chat_body, stream_chat
from services.client.silent import open_silent_reader
from streamlab.experiments import socket_queues
from streamlab.experiments.generation_end import state_name
from streamlab.experiments.load_clients import Flood, FloodTooLong
from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios.lifecycle import record_when_done
from streamlab.experiments.scenarios.model import (
    Scenario,
    ScenarioUnavailable,
    Setup,
    Variant,
    note_stream,
)
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability, LabTarget
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# No progress for this long is a pause.
PAUSED_AFTER_S = 1.0
# The hops a stalled stream's bytes cross, client side first.
HOPS = ("client", "edge", "nginx", "upstream", "gateway")


def held_per_hop(lab: LabTarget) -> dict[str, int] | None:
    """Bytes in each hop's socket queues now; None without this host's view of them."""
    sockets = socket_queues.read()
    if sockets is None or lab.pids is None:
        return None  # a compose lab's sockets live in its containers' namespaces
    p = lab.ports
    return {
        "client": socket_queues.held_by(sockets, dials=p.edge_port),
        "edge": socket_queues.held_by(sockets, listens_on=p.edge_port, dials=p.nginx_port),
        "nginx": socket_queues.held_by(sockets, listens_on=p.nginx_port,
                                       dials=p.upstream_port),
        "upstream": socket_queues.held_by(sockets, listens_on=p.upstream_port,
                                          dials=p.gateway_port),
        "gateway": socket_queues.held_by(sockets, listens_on=p.gateway_port),
    }


async def sse_bytes_per_token(lab: LabTarget) -> float:
    """What one token costs on the SSE wire, from a short stream read in full."""
    tokens = 100
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        result = await stream_chat(http, f"{lab.gateway_url}/v1/chat/completions",
                                   chat_body("flood", prefill_ms=0, token_gap_ms=0,
                                             answer_tokens=tokens, max_tokens=tokens))
    return result.bytes_down / max(1, len(result.texts))


async def slow_reader_edge(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    """A client that sends its request through the edge and never reads."""
    try:
        flood = Flood.for_lab(lab)
    except FloodTooLong as exc:  # this lab cannot show the difference: not a verdict
        raise ScenarioUnavailable(str(exc)) from exc
    per_token = await sse_bytes_per_token(lab)
    rid = f"scenario-slow-edge-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("flood", prefill_ms=0, token_gap_ms=flood.gap_ms,
                     answer_tokens=flood.tokens, max_tokens=flood.tokens)
    path = f"{setup.location.rstrip('/')}/v1/chat/completions"
    asked_at = time.monotonic()
    sock = await asyncio.to_thread(open_silent_reader, lab.ports.host, lab.ports.edge_port,
                                   path, body, {"X-Request-Id": rid})
    paused_at: int | None = None
    samples: list[tuple[float, dict[str, int]]] = []  # socket queues per hop, over time
    try:
        last, still_since = -1, time.monotonic()
        end = asked_at + flood.answer_s + flood.cut_bound_s + 10
        while time.monotonic() < end:
            records = (await asyncio.to_thread(lab.engine_stats, rid)).generations
            record = records[0] if records else None
            if record is not None and record.state != pb.GENERATION_STATE_RUNNING:
                break
            held = held_per_hop(lab)
            if held is not None:
                samples.append((time.monotonic() - asked_at, held))
            if record is not None and record.tokens_generated != last:
                last, still_since = record.tokens_generated, time.monotonic()
            elif (record is not None and paused_at is None
                  and time.monotonic() - still_since >= PAUSED_AFTER_S):
                paused_at = last
            await asyncio.sleep(0.1)
    finally:
        sock.close()
    final = await record_when_done(lab, rid, 10)
    cancelled = final is not None and final.state == pb.GENERATION_STATE_CANCELLED
    cancelled_after = round(final.cancelled_at - asked_at, 2) if final and cancelled else None
    figures: Figures = {
        "tokens_asked": flood.tokens,
        "gap_ms": flood.gap_ms,
        "answer_s": round(flood.answer_s, 1),
        "send_timeout_s": flood.send_timeout_s,
        "sse_bytes_per_token": round(per_token, 1),
        "paused_by_flow_control": paused_at is not None,
        "paused_at_tokens": paused_at,
        "tokens_generated": final.tokens_generated if final else None,
        "tokens_short_of_answer": flood.tokens - final.tokens_generated if final else None,
        "engine_state": state_name(final) if final else None,
        "cancelled_after_s": cancelled_after,
        "cut_bound_s": round(flood.cut_bound_s, 2),
        "cancel_past_bound_s": (round(cancelled_after - flood.cut_bound_s, 2)
                                if cancelled_after is not None else None),
    }
    figures.update(_held_figures(samples))
    return figures


def _held_figures(samples: list[tuple[float, dict[str, int]]]) -> Figures:
    """Bytes per hop at the fullest moment, and when the hops in front of nginx
    stopped taking more (from then on nginx waits on its write)."""
    names = [f"held_{hop}_kib" for hop in HOPS] + ["held_sockets_kib", "edge_side_full_after_s"]
    if not samples:
        return dict.fromkeys(names)  # no view of the sockets (a compose lab)
    _, fullest = max(samples, key=lambda sample: sum(sample[1].values()))
    figures: Figures = {f"held_{hop}_kib": round(fullest[hop] / 1024, 1) for hop in HOPS}
    figures["held_sockets_kib"] = round(sum(fullest.values()) / 1024, 1)

    def edge_side(held: dict[str, int]) -> int:
        return held["client"] + held["edge"] + held["nginx"]

    most = max(edge_side(held) for _, held in samples)
    figures["edge_side_full_after_s"] = round(
        min(t for t, held in samples if edge_side(held) >= 0.95 * most), 2)
    return figures


BACKPRESSURE: tuple[Scenario, ...] = (
    Scenario(
        name="slow-reader-edge",
        summary="a client that stops reading through the edge: nginx's buffers bounded and "
                "its send timeout cut it, and the engine with it, well before the answer's end",
        measure=slow_reader_edge,
        broken=Variant(
            Setup(location="/buffered-to-disk/"),
            (Check("engine_state", "==", "completed",
                   "the engine wrote the whole answer for a reader that read none"),
             Check("tokens_short_of_answer", "==", 0, "every token, into nginx's temp file")),
            "/buffered-to-disk/: nginx buffers the response (memory, then a temp file of up "
            "to 1 GB) and waits its default 60 s before cutting a client that takes nothing"),
        fixed=Variant(
            Setup(location="/"),
            (Check("engine_state", "==", "cancelled"),
             Check("tokens_short_of_answer", ">", 0, "stopped before the end"),
             Check("cancel_past_bound_s", "<=", lambda t: t.tolerance_s,
                   "cancelled within the bound: the hops in front of nginx fill "
                   "(~3,000 tokens), then nginx's send timeout")),
            "/: proxy_buffering off, a 32 KB send buffer per client connection, and "
            "send_timeout = the gateway's send timeout: nginx closes the client and the "
            "upstream, and the gateway cancels the generation"),
        needs=frozenset({Capability.ENGINE_RECORD}),
        shown=("tokens_asked", "gap_ms", "answer_s", "send_timeout_s", "sse_bytes_per_token",
               *(f"held_{h}_kib" for h in HOPS), "held_sockets_kib", "edge_side_full_after_s",
               "paused_by_flow_control", "tokens_generated", "engine_state",
               "cancelled_after_s", "cut_bound_s", "cancel_past_bound_s"),
    ),
)
register(*BACKPRESSURE)
