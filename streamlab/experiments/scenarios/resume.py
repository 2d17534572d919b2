"""The resume scenario: one stream cut mid-way, read two ways.

    broken  a client that does not resume (an OpenAI-style reader, or an
            EventSource against a server without ids): the cut loses every
            token from the cut on
    fixed   the resuming client (EventSource's rules: `retry:`, then
            Last-Event-ID): every token exactly once, the uncut run's text

The cut is Toxiproxy's `limit_data` on one hop: the first connection gets
CUT_BYTES bytes (a few tokens in, mid-event) and is closed; later ones run
clean. The toxic is set by the measure itself, per connection, not by the
runner: a runner-set toxic would cut the uncut reference run and every
reconnection too. One scenario per hop, as for latency.
"""

from __future__ import annotations

from collections import Counter

import httpx

from services.client.openai_stream import chat_body
from services.client.resume_stream import ResumeResult, create_stream, follow_stream
from streamlab.experiments.report import JSON, Check, Figures
from streamlab.experiments.scenarios.model import Measured, Scenario, Setup, Variant
from streamlab.experiments.scenarios.plot import ArrivalClock
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability, LabTarget
from streamlab.lab.toxiproxy import Toxic

CUT_BYTES = 900  # a few tokens into the first response, mid-event
RETRY_MS = 100  # the `retry:` the stream asks for, so a reconnection is quick


def request_body(timing: Timing) -> dict[str, JSON]:
    body: dict[str, JSON] = chat_body("resume scenario", **timing.fake_model())
    body["resume"] = {"retry_ms": RETRY_MS}
    return body


def figures_of(result: ResumeResult, reference: ResumeResult) -> Figures:
    counts = Counter(result.indexes)
    expected = set(reference.indexes)
    return {
        "tokens_expected": len(reference.tokens),
        "tokens_received": len(result.tokens),
        "missing": len(expected - set(counts)),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "in_order": result.indexes == sorted(result.indexes),
        "text_equal": result.text == reference.text,
        "connections": len(result.connections),
        "cuts": sum(1 for c in result.connections if c.ended in ("transport", "eof")),
        "resumed_from": next((c.sent_last_event_id for c in result.connections
                              if c.sent_last_event_id), None),
        "gap_events": len(result.gaps),
        "terminal": result.terminal,
    }


async def resume_cut(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    """An uncut reference run, then the same stream with its first connection
    cut on `knobs["hop"]`, read by a client that resumes (`knobs["resume"]`) or not."""
    hop = str(setup.knobs.get("hop", "edge"))
    toxiproxy = lab.toxiproxy()
    # A new connection per request: the toxic's byte count starts at the response.
    limits = httpx.Limits(max_keepalive_connections=0)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0),
                                     limits=limits) as client:
            reference = await follow_stream(
                client, lab.edge_url,
                await create_stream(client, lab.edge_url, request_body(timing)))

            async def cut_first(attempt: int) -> None:
                toxiproxy.reset()
                if attempt == 0:  # on every hop of the kind (replicas)
                    for each in lab.hops_of(hop):
                        toxiproxy.add_toxic(each, Toxic("limit_data", {"bytes": CUT_BYTES}))

            clock = ArrivalClock()  # each token's arrival, for `scenario run --plot`

            async def cut_first_timed(attempt: int) -> None:
                if attempt:  # the client waited its retry after the cut, then comes back
                    clock.event("cut", ago_s=RETRY_MS / 1000)
                    clock.event("restore")
                await cut_first(attempt)

            created = await create_stream(client, lab.edge_url, request_body(timing))
            result = await follow_stream(client, lab.edge_url, created,
                                         resume=bool(setup.knobs.get("resume")),
                                         before_connect=cut_first_timed,
                                         default_retry_ms=RETRY_MS, on_token=clock.token)
            if result.terminal is None:  # it stopped at the cut (no resume)
                clock.event("cut")
    finally:
        toxiproxy.reset()
        toxiproxy.close()
    return Measured(figures_of(result, reference), (clock.timeline(),))


CUT = Check("cuts", ">=", 1, "the connection really was cut")
BROKEN = (
    CUT,
    Check("missing", ">", 0, "without resume, everything after the cut is lost"),
    Check("duplicates", "==", 0, "what did arrive arrived once: the loss is all after the cut"),
    Check("text_equal", "==", False, "the text differs from the uncut run"),
)
FIXED = (
    CUT,
    Check("connections", ">=", 2, "the client came back"),
    Check("missing", "==", 0, "no token lost"),
    Check("duplicates", "==", 0, "no token twice"),
    Check("text_equal", "==", True, "the same text as the uncut run"),
    Check("terminal", "==", "done", "the stream ended with its done event"),
)


def _resume(hop: str) -> Scenario:
    return Scenario(
        name="resume" if hop == "edge" else f"resume-{hop}",
        summary=f"limit_data cuts the {hop} hop mid-event: a resuming client loses nothing",
        measure=resume_cut,
        broken=Variant(Setup(knobs={"resume": False, "hop": hop}), BROKEN,
                       "a client that does not come back (no Last-Event-ID)"),
        fixed=Variant(Setup(knobs={"resume": True, "hop": hop}), FIXED,
                      "EventSource-like client: retry:, then Last-Event-ID, replay, live"),
        needs=frozenset({Capability.TOGGLE_HOPS}),
        shown=("cuts", "connections", "tokens_expected", "tokens_received", "missing",
               "duplicates", "text_equal", "resumed_from", "terminal"),
    )


RESUME: tuple[Scenario, ...] = (_resume("edge"), _resume("upstream"))
register(*RESUME)
