"""Scenarios about the gRPC hop failing under a stream that is already flowing:

    engine-reset      reset_peer on the engine hop (a RST mid-stream)
    engine-cut        limit_data on the engine hop (the connection closes mid-message)
    engine-down       the engine hop's proxy disabled (every connection closed)
    engine-blackhole  timeout 0 on the engine hop, both ways: silence, no FIN, no RST

Each fault is injected after the client's third token. Fixed, the gateway
reports it: an OpenAI-style error event, no `[DONE]`, within a bound (a
black hole is found by the gateway's gRPC keepalive). When the gateway then
closes its connection, Toxiproxy closes the engine's side with it, so the
engine's call ends at the same moment (measured: both 15.06 s after the fault
with the default 10 + 5 s keepalive). On a real dead link no FIN would cross
either, and the engine's own keepalive would end it; the black hole's answer
is sized to outlast both, so the check holds either way. Broken, the gateway
swallows it (`"streamlab": {"engine_errors": "swallow"}`, the bare
`except: pass` around a relay loop) and ends with `[DONE]`: a truncated
answer that every client takes for a whole one.

The gateway multiplexes every stream to the engine over one HTTP/2
connection, so a loud fault ends every stream in flight on that gateway, not
only the scenario's: run these on a lab nobody else is using.

A killed or restarted engine is the same failure seen from the gateway, but
needs a service restart, which scenarios never do (they run against any lab
that is up); tests/integration/test_engine_faults.py covers it.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable

import anyio
import httpx

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.experiments.generation_end import state_name
from streamlab.experiments.report import Check, Figures
from streamlab.experiments.scenarios.lifecycle import record_when_done
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
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.engine.v1 import engine_pb2 as pb

FAULT_AFTER = 3
# 200 tokens: 10 s at the default gap, far past a loud fault's detection. A
# black hole's answer is longer still: it outlasts both ends' keepalives.
FAULT_TOKENS = 200
SILENT_FAULTS = {"timeout"}
# A RST, a closed connection or a disabled proxy are seen at once; this is slack
# for a loaded machine, not a wait.
LOUD_FAULT_BOUND_S = 3.0

# What each fault does to the engine hop, through the lab's Toxiproxy.
FAULTS: dict[str, Callable[[LabTarget], None]] = {
    "reset_peer": lambda lab: _add_toxic(lab, Toxic("reset_peer", {"timeout": 0})),
    "limit_data": lambda lab: _add_toxic(lab, Toxic("limit_data", {"bytes": 1})),
    "disabled": lambda lab: _set_enabled(lab, False),
    # Both ways, as a dead link is: a one-way hole would let the gateway's
    # cancel through to the engine.
    "timeout": lambda lab: _add_toxic(lab, Toxic("timeout", {"timeout": 0}, "downstream"),
                                      Toxic("timeout", {"timeout": 0}, "upstream")),
}


def _add_toxic(lab: LabTarget, *toxics: Toxic) -> None:
    with lab.toxiproxy() as toxiproxy:
        # Every engine hop: with replicas, a stream may go through any of them.
        for hop in lab.hops_of("engine"):
            for toxic in toxics:
                toxiproxy.add_toxic(hop, toxic)


def _set_enabled(lab: LabTarget, enabled: bool) -> None:
    with lab.toxiproxy() as toxiproxy:
        for hop in lab.hops_of("engine"):
            toxiproxy.set_enabled(hop, enabled)


async def engine_fault(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    """Stream a long answer through the edge; break the engine hop after the
    third token; time how the client's stream ends. (The runner resets
    Toxiproxy afterwards, which also re-enables a disabled proxy.)"""
    fault_name = str(setup.knobs["fault"])
    fault = FAULTS[fault_name]
    tokens = FAULT_TOKENS
    if fault_name in SILENT_FAULTS:
        tokens = max(tokens, math.ceil(
            (max(timing.engine_dead_after_s, timing.gateway_dead_after_s) + 5.0) / timing.gap_s))
    rid = f"scenario-fault-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("long answer", prefill_ms=timing.prefill_ms, token_gap_ms=timing.gap_ms,
                     answer_tokens=tokens, max_tokens=tokens,
                     engine_errors=setup.knobs.get("engine_errors", "report"))
    # Heartbeats keep a read timeout from firing while the hop is silent, so the
    # harness's patience is a deadline on the whole stream.
    patience_s = timing.prefill_s + tokens * timing.gap_s + timing.engine_dead_after_s + 5.0
    reached = anyio.Event()  # the FAULT_AFTER-th token, or the stream's end
    seen: list[str] = []
    results: list[StreamResult] = []

    def on_token(text: str) -> None:
        seen.append(text)
        if len(seen) >= FAULT_AFTER:
            reached.set()

    ended_at: list[float] = []

    async def read() -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(patience_s, connect=5.0)) as http:
            results.append(await stream_chat(
                http, f"{lab.edge_url}/v1/chat/completions", body,
                headers={"X-Request-Id": rid}, on_token=on_token))
            ended_at.append(time.monotonic())  # before the client's own teardown
        reached.set()
        ended.set()

    ended = anyio.Event()
    injected_at: float | None = None
    fault_error: str | None = None
    hung = False
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        with anyio.move_on_after(patience_s) as scope:
            await reached.wait()
            if not results:  # still streaming: break the hop under it
                # Timed from the start of the API call: disabling a proxy closes
                # its connections before the call returns.
                injected_at = time.monotonic()
                try:
                    await anyio.to_thread.run_sync(fault, lab)
                except Exception as exc:  # say so in the figures, not as an exception group
                    fault_error, injected_at = repr(exc), None
                    tasks.cancel_scope.cancel()
            await ended.wait()
        if scope.cancelled_caught:
            hung = True
            tasks.cancel_scope.cancel()
    result = results[0] if results else StreamResult()
    record = await record_when_done(lab, rid, timing.gateway_dead_after_s + 5.0)
    error = result.error or {}
    figures: Figures = {
        "fault_injected": injected_at is not None,
        "fault_error": fault_error,
        "client_tokens": len(result.texts),
        "truncated": len(result.texts) < tokens,
        "done": result.done,
        "error_type": error.get("type"),
        "error_code": error.get("code"),
        "hung": hung,
        "ended_after_fault_s": (round(ended_at[0] - injected_at, 2)
                                if injected_at is not None and ended_at else None),
        "engine_state": state_name(record) if record else None,
        # The engine's clock is this host's CLOCK_MONOTONIC, as time.monotonic().
        "engine_cancelled_after_fault_s": (
            round(record.cancelled_at - injected_at, 2)
            if record and injected_at is not None
            and record.state == pb.GENERATION_STATE_CANCELLED else None),
    }
    # For `scenario run --plot`, on the client's clock (from the request): its
    # start in monotonic time is its end less its length.
    start = ended_at[0] - result.total_s if ended_at else None
    cut = injected_at - start if injected_at is not None and start is not None else None
    cancelled = figures["engine_cancelled_after_fault_s"]
    return Measured(figures, (from_token_times(result.token_times, [
        (cut, "cut"), (result.total_s, "done" if result.done else "error"),
        (cut + cancelled if cut is not None and isinstance(cancelled, float) else None,
         "cancel")]),))


def _scenario(name: str, fault: str, summary: str, bound: Callable[[Timing], float],
              story: str) -> Scenario:
    return Scenario(
        name=name, summary=summary, measure=engine_fault,
        broken=Variant(
            Setup(knobs={"fault": fault, "engine_errors": "swallow"}),
            (Check("fault_injected", "==", True),
             Check("done", "==", True, "[DONE] after the cut: it looks like a whole answer"),
             Check("truncated", "==", True, "but the answer stopped part-way"),
             Check("error_type", "==", None, "and nothing says so")),
            f"{story}; the gateway swallows the error (engine_errors: swallow)"),
        fixed=Variant(
            Setup(knobs={"fault": fault, "engine_errors": "report"}),
            (Check("fault_injected", "==", True),
             Check("done", "==", False, "no [DONE]: nobody takes the cut for a whole answer"),
             Check("error_type", "==", "server_error", "an OpenAI-style error event"),
             Check("ended_after_fault_s", "<=", bound, "the client is told within the bound"),
             Check("engine_state", "==", "cancelled",
                   "and the engine stopped: nothing generates on for nobody")),
            f"{story}; the gateway reports it as an error event"),
        needs=frozenset({Capability.TOGGLE_HOPS, Capability.ENGINE_RECORD}),
        shown=("client_tokens", "done", "error_type", "error_code", "ended_after_fault_s",
               "hung", "engine_state", "engine_cancelled_after_fault_s"),
        # A black hole's measure asks for more (past both keepalives); a replay
        # by hand sees the fault long before 200 tokens end either way.
        client=ClientSettings(answer_tokens=FAULT_TOKENS, fault_after_tokens=FAULT_AFTER),
    )


def _loud(t: Timing) -> float:
    return LOUD_FAULT_BOUND_S + t.tolerance_s


ENGINE_FAULTS: tuple[Scenario, ...] = (
    _scenario("engine-reset", "reset_peer",
              "a TCP reset on the engine hop mid-stream must reach the client as an error",
              _loud, "reset_peer on the engine hop after 3 tokens"),
    _scenario("engine-cut", "limit_data",
              "the engine hop closing mid-message must reach the client as an error",
              _loud, "limit_data (1 byte) on the engine hop after 3 tokens"),
    _scenario("engine-down", "disabled",
              "the engine hop going away (proxy disabled) must reach the client as an error",
              _loud, "the engine hop's proxy disabled after 3 tokens"),
    _scenario("engine-blackhole", "timeout",
              "a silent engine hop (no FIN, no RST) must be found by keepalive and reported",
              # Up to one ping interval passes before the first unanswered ping.
              lambda t: t.engine_dead_after_s + 2.0 + t.tolerance_s,
              "timeout 0 (a black hole, both ways) on the engine hop after 3 tokens"),
)
register(*ENGINE_FAULTS)
