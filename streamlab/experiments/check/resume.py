"""Resume: a client cut in the middle of a stream comes back and gets every
event it missed, exactly once: none twice (a client that appends would print
the start again), none skipped (a hole in the answer nobody is told of).

The OpenAI chat route has no resume; a server may offer a surface that does
(Needs.RESUMABLE), and each one it offers is tried:

    streams    `POST {base}/streams` (the chat body) → 201 {"events_url"}; the
               events carry `id:` and a GET with `Last-Event-ID` continues
               after that id (the WHATWG EventSource's own reconnect)
    responses  `POST {base}/responses` with background and stream; its events
               carry `sequence_number`, and `GET {base}/responses/{id}?stream=
               true&starting_after=N` continues after event N (OpenAI's way)

Each is read for READ_BEFORE events, left, resumed after the last one seen,
and read to its end; what the resumed read must be is what a reader that was
never cut got after that event: the whole log read afresh (streams), or the
numbers N+1, N+2, ... to the end with no hole (responses). A server that offers
neither is n/a.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from urllib.parse import urljoin

import httpx

from streamlab.experiments.check.registry import Session, check, streams_budget
from streamlab.experiments.check.target import CheckTarget, Needs
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import JSON, Check, Figure, Report
from streamlab_protocol.sse import Event, SSEDecoder

STORY = "a resumed stream gets every event it missed exactly once"
READ_BEFORE = 5  # events read before the client is cut
TERMINAL_RESPONSE_EVENTS = ("response.completed", "response.failed", "response.incomplete",
                            "response.cancelled", "error")
FIX = ("resume strictly after the id the client sent (Last-Event-ID / starting_after): "
       "not from the start, not past it; a log that no longer holds it must say so")


@dataclass
class Read:
    status: int = 0
    events: list[Event] = field(default_factory=list)
    error: str = ""


async def read_events(client: httpx.AsyncClient, method: str, url: str,
                      headers: dict[str, str], *, json_body: JSON = None,
                      stop_after: int | None = None) -> Read:
    """The SSE events of one response (`stop_after` of them, or to its end)."""
    read, decoder = Read(), SSEDecoder()
    try:
        async with client.stream(method, url, headers=headers, json=json_body) as response:
            read.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                return read
            async for chunk in response.aiter_bytes():
                read.events += [e for e in decoder.feed(chunk) if isinstance(e, Event)]
                if stop_after is not None and len(read.events) >= stop_after:
                    return read  # leaving the block closes the connection: the cut
    except httpx.HTTPError as exc:
        read.error = f"{type(exc).__name__}: {exc}"[:200]
    return read


def once(before: list[str], resumed: list[str], expected: list[str]) -> dict[str, Figure]:
    """How `resumed` differs from `expected`, the events after the cut."""
    seen, wanted = set(before), set(expected)
    return {"duplicates": sum(key in seen for key in resumed),
            "missing": sum(key not in set(resumed) for key in expected),
            "unexpected": sum(key not in wanted and key not in seen for key in resumed),
            "exactly_once": resumed == expected}


def _key(event: Event) -> str:
    return f"{event.id}|{event.event}|{event.data}"


async def streams_surface(client: httpx.AsyncClient, target: CheckTarget
                          ) -> tuple[dict[str, Figure], str]:
    """The `/streams` surface's figures, or {} and why it is not offered."""
    body = target.body("Write ten short lines about the sea.", max_tokens=30,
                       lab={"prefill_ms": 0, "token_gap_ms": 30, "answer_tokens": 30})
    try:
        created = await client.post(target.api_url + "/streams", json=body,
                                    headers=target.headers())
        events_url = created.json().get("events_url") if created.status_code in (200, 201) \
            else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return {}, "POST /streams did not answer with JSON"
    if not isinstance(events_url, str):
        return {}, f"POST /streams answered {created.status_code}"
    events_url = urljoin(target.api_url + "/", events_url)
    first = await read_events(client, "GET", events_url, target.headers(),
                              stop_after=READ_BEFORE)
    if first.status != 200 or not first.events or not first.events[-1].id:
        return {}, f"its events answered {first.status} with no `id:` to resume from"
    last_id = first.events[-1].id
    resumed = await read_events(client, "GET", events_url,
                                {**target.headers(), "Last-Event-ID": last_id})
    whole = await read_events(client, "GET", events_url, target.headers())
    keys = [_key(e) for e in whole.events]
    cut = next((i for i, e in enumerate(whole.events) if e.id == last_id), None)
    figures: dict[str, Figure] = {"streams_last_event_id": last_id,
                                  "streams_resume_status": resumed.status}
    if cut is None:
        return figures | {"streams_exactly_once": False, "streams_duplicates": None,
                          "streams_missing": None}, ""
    result = once([_key(e) for e in first.events], [_key(e) for e in resumed.events],
                  keys[cut + 1:])
    return figures | {f"streams_{k}": v for k, v in result.items()}, ""


def _response_event(event: Event) -> dict[str, JSON]:
    try:
        parsed = json.loads(event.data)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _numbers(events: list[Event]) -> list[int]:
    out = []
    for event in events:
        number = _response_event(event).get("sequence_number")
        if isinstance(number, int):
            out.append(number)
    return out


async def responses_surface(client: httpx.AsyncClient, target: CheckTarget
                            ) -> tuple[dict[str, Figure], str]:
    """The background Responses surface's figures, or {} and why it is not offered."""
    body: dict[str, JSON] = {"model": target.model, "input": "Write ten short lines about rivers.",
                             "stream": True, "background": True, "max_output_tokens": 30}
    if target.lab_knobs:
        body["streamlab"] = {"prefill_ms": 0, "token_gap_ms": 30, "answer_tokens": 30}
    first = await read_events(client, "POST", target.api_url + "/responses", target.headers(),
                              json_body=body, stop_after=READ_BEFORE)
    if first.status != 200 or not first.events:
        return {}, f"POST /responses (background, stream) answered {first.status}"
    response = _response_event(first.events[0]).get("response")
    if not isinstance(response, dict) or response.get("background") is not True:
        return {}, "POST /responses did not keep the response in the background"
    numbers = _numbers(first.events)
    if not numbers:
        return {}, "its events carry no sequence_number to resume from"
    after = numbers[-1]
    resumed = await read_events(
        client, "GET", f"{target.api_url}/responses/{response.get('id')}?stream=true"
        f"&starting_after={after}", target.headers())
    got = _numbers(resumed.events)
    ended = bool(resumed.events) and _response_event(resumed.events[-1]).get(
        "type") in TERMINAL_RESPONSE_EVENTS
    last = max(got, default=after)
    result = once([str(n) for n in numbers], [str(n) for n in got],
                  [str(n) for n in range(after + 1, last + 1)])
    return {"responses_starting_after": after, "responses_resume_status": resumed.status,
            "responses_reached_end": ended, **{f"responses_{k}": v for k, v in result.items()},
            "responses_exactly_once": result["exactly_once"] and ended}, ""


@check("resume", STORY, headline=("surfaces",), budget_s=streams_budget(6))
async def resume(session: Session) -> Report:
    client, target = session.client, session.target
    figures: dict[str, Figure] = {}
    checks: list[Check] = []
    why_not: list[str] = []
    for name, surface in (("streams", streams_surface), ("responses", responses_surface)):
        found, why = await surface(client, target)
        if not found:
            why_not.append(f"{name}: {why}")
            continue
        figures |= found
        checks.append(Check(f"{name}_exactly_once", "==", True,
                            f"the resumed {name} stream repeated or skipped events: " + FIX))
    if not checks:
        return not_applicable("resume", STORY, f"needs {Needs.RESUMABLE}: "
                              + "; ".join(why_not), figures)
    figures["surfaces"] = ",".join(c.figure.removesuffix("_exactly_once") for c in checks)
    return judged("resume", STORY, figures, checks)
