"""The Responses resume scenario: a background Responses stream (`POST
/v1/responses` with background + stream) cut mid-stream at the edge, read on
two ways.

    broken  the client asks for the stream again without `starting_after`
            (`GET /v1/responses/{id}?stream=true`): the replay starts from the
            first event, so every delta read before the cut arrives twice
    fixed   `GET /v1/responses/{id}?stream=true&starting_after=N`, N the
            sequence_number of the last event read: every delta exactly once,
            the uncut response's text

The cut is Toxiproxy's `limit_data` on the edge hop, set by the measure for
the first connection only (as the resume scenario does, resume.py): past the
opening events, which carry the response object twice, a few deltas in. A
background response belongs to the gateway's resume store, so the generation
runs on after the cut, whoever reads it.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import httpx

from streamlab.experiments.report import JSON, Check, Figures
from streamlab.experiments.scenarios.model import Measured, Scenario, Setup, Variant
from streamlab.experiments.scenarios.plot import ArrivalClock
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.timing import Timing
from streamlab.lab.target import Capability, LabTarget
from streamlab.lab.toxiproxy import Toxic
from streamlab_protocol.sse import Event, SSEDecoder

CUT_BYTES = 4000  # past the two response objects of the opening events, a few deltas in
MIN_TOKENS = 40  # enough deltas that the cut lands among them, not after the last
DELTA = "response.output_text.delta"
COMPLETED = "response.completed"
MODEL = "streamlab-fake"  # the fake engine's name, as the chat scenarios send it (chat_body)


def request_body(timing: Timing, *, background: bool) -> dict[str, JSON]:
    model = timing.fake_model()
    pace: dict[str, JSON] = {"prefill_ms": model["prefill_ms"],
                             "token_gap_ms": model["token_gap_ms"],
                             "answer_tokens": max(timing.tokens, MIN_TOKENS)}
    return {"model": MODEL, "input": "responses resume scenario", "stream": background,
            "background": background, "streamlab": pace}


@dataclass(frozen=True)
class Seen:
    """One Responses event as the client read it: its type, number and text."""

    type: str
    sequence_number: int
    delta: str = ""  # a response.output_text.delta's text


@dataclass
class Read:
    """Every event one client saw, over all its connections, in order."""

    events: list[Seen] = field(default_factory=list)
    response_id: str = ""  # from response.created
    connections: int = 0
    cuts: int = 0  # connections that ended before response.completed
    starting_after: int | None = None  # what the second connection asked for

    @property
    def deltas(self) -> list[Seen]:
        return [e for e in self.events if e.type == DELTA]

    @property
    def completed(self) -> bool:
        return any(e.type == COMPLETED for e in self.events)

    def add(self, data: str) -> Seen:
        payload = json.loads(data)
        seen = Seen(str(payload["type"]), int(payload["sequence_number"]),
                    str(payload.get("delta", "")))
        if seen.type == "response.created":
            self.response_id = str(payload["response"]["id"])
        self.events.append(seen)
        return seen


def figures_of(read: Read, reference_text: str, expected_deltas: int) -> Figures:
    numbers = Counter(d.sequence_number for d in read.deltas)
    text = "".join(d.delta for d in read.deltas)
    return {
        "deltas_expected": expected_deltas,
        "deltas_received": len(read.deltas),
        "duplicates": sum(n - 1 for n in numbers.values() if n > 1),
        "missing": max(0, expected_deltas - len(numbers)),
        "text_equal": text == reference_text,
        "connections": read.connections,
        "cuts": read.cuts,
        "starting_after": read.starting_after,
        "completed": read.completed,
    }


async def _read(client: httpx.AsyncClient, method: str, url: str, read: Read,
                clock: ArrivalClock, body: dict[str, JSON] | None = None) -> None:
    """One connection's events into `read`, until the stream ends or is cut."""
    read.connections += 1
    decoder = SSEDecoder()
    try:
        async with client.stream(method, url, json=body,
                                 headers={"Accept-Encoding": "identity"}) as response:
            response.raise_for_status()
            async for chunk in response.aiter_raw():
                for item in decoder.feed(chunk):
                    if not isinstance(item, Event):
                        continue  # `: ping`
                    if read.add(item.data).type == DELTA:
                        clock.token()
    except httpx.TransportError:
        pass  # the cut: an incomplete chunked body, or the connection reset
    if not read.completed:
        read.cuts += 1
        clock.event("cut")


async def responses_cut(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    """An uncut reference response, then a background stream cut on the edge
    hop and read again with or without `starting_after` (`knobs["starting_after"]`)."""
    toxiproxy = lab.toxiproxy()
    # A new connection per request: the toxic's byte count starts at the response.
    limits = httpx.Limits(max_keepalive_connections=0)
    read, clock = Read(), ArrivalClock()
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0),
                                     limits=limits) as client:
            answer = await client.post(f"{lab.edge_url}/v1/responses",
                                       json=request_body(timing, background=False))
            answer.raise_for_status()
            reference = answer.json()["output"][0]["content"][0]["text"]
            expected = max(timing.tokens, MIN_TOKENS)

            toxiproxy.reset()
            for each in lab.hops_of("edge"):  # every edge (replicas)
                toxiproxy.add_toxic(each, Toxic("limit_data", {"bytes": CUT_BYTES}))
            clock = ArrivalClock()  # from the request that is cut
            await _read(client, "POST", f"{lab.edge_url}/v1/responses", read, clock,
                        request_body(timing, background=True))
            toxiproxy.reset()
            if read.response_id and not read.completed:
                url = f"{lab.edge_url}/v1/responses/{read.response_id}?stream=true"
                if setup.knobs.get("starting_after"):
                    read.starting_after = read.events[-1].sequence_number
                    url += f"&starting_after={read.starting_after}"
                clock.event("restore")
                await _read(client, "GET", url, read, clock)
    finally:
        toxiproxy.reset()
        toxiproxy.close()
    return Measured(figures_of(read, reference, expected), (clock.timeline(),))


CUT = Check("cuts", ">=", 1, "the first connection really was cut before response.completed")
BROKEN = (
    CUT,
    Check("completed", "==", True, "the second request read to response.completed"),
    Check("duplicates", ">", 0, "without starting_after the replay starts over: deltas twice"),
    Check("text_equal", "==", False, "the text put together differs from the uncut response"),
)
FIXED = (
    CUT,
    Check("completed", "==", True, "the resumed stream ends with response.completed"),
    Check("missing", "==", 0, "no delta lost"),
    Check("duplicates", "==", 0, "no delta twice"),
    Check("text_equal", "==", True, "the same text as the uncut response"),
)

register(Scenario(
    name="responses-resume",
    summary="limit_data cuts a background Responses stream: starting_after=N resumes it "
            "with every delta once",
    measure=responses_cut,
    broken=Variant(Setup(knobs={"starting_after": False}), BROKEN,
                   "GET /v1/responses/{id}?stream=true again, without starting_after"),
    fixed=Variant(Setup(knobs={"starting_after": True}), FIXED,
                  "GET /v1/responses/{id}?stream=true&starting_after=N (last seen)"),
    needs=frozenset({Capability.TOGGLE_HOPS}),
    shown=("cuts", "connections", "deltas_expected", "deltas_received", "missing",
           "duplicates", "text_equal", "starting_after", "completed"),
))
