"""`/api/trace`: one stream's timeline for the page's waterfall (docs/console.md).

The same timeline as `streamlab trace ID --json` (streamlab/lab/trace_timeline.py:
`collect` reads the client's record, the edge proxy's JSON log line and the
spans in the lab's Jaeger), read from the local lab whose run dir the console
was started with (`ConsoleSettings.run_dir`), plus `waterfall`: the same
data as rows of bars on one time axis, what the page draws.

    GET /api/trace          {"tracing": bool, "reason": str}: may the page ask?
    GET /api/trace/{id}     the timeline (+ "waterfall"); 409 on a lab up
                            without --tracing (or none the console can read),
                            404 when nothing of that id is found, 502 when
                            Jaeger does not answer
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import JSONResponse

from streamlab.console.control import State, UnknownName
from streamlab.errors import StreamlabError
from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.local import Lab
from streamlab.lab.trace_timeline import Timeline, build, collect

# The ids the gateway accepts (X-Request-Id) and the page makes: no path tricks.
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

router = APIRouter(prefix="/api")


class TraceUnavailable(StreamlabError, RuntimeError):
    """No traced local lab to read (→ 409)."""


def traced_lab(settings: ConsoleSettings) -> Lab:
    """The local lab the console was started for, when it is up with --tracing."""
    if not settings.run_dir:
        raise TraceUnavailable("this console knows no local lab's run dir (the compose lab?): "
                               "the timeline reads a local lab's logs and Jaeger")
    state_file = Path(settings.run_dir) / "state.json"
    try:
        tracing = bool(json.loads(state_file.read_text()).get("tracing", False))
    except (OSError, ValueError) as exc:
        raise TraceUnavailable(f"no lab is running from {settings.run_dir}") from exc
    if not tracing:
        raise TraceUnavailable("this lab is up without tracing: `streamlab down`, then "
                               "`streamlab up --tracing`")
    return Lab.attach(Path(settings.run_dir))


@router.get("/trace")
def tracing(state: State) -> dict[str, Any]:
    """Whether the page may ask for timelines, and why not."""
    try:
        traced_lab(state.settings)
    except TraceUnavailable as exc:
        return {"tracing": False, "reason": str(exc)}
    return {"tracing": True, "reason": ""}


@router.get("/trace/{request_id}")
def trace(request_id: str, state: State,
          wait_s: Annotated[float, Query(ge=0.0, le=10.0)] = 3.0,
          client: Annotated[str, Query(max_length=8192)] = "") -> Any:
    """The stream's timeline (`streamlab trace ID --json`) and its waterfall.
    `client`: the page's own timings of the stream (JSON, record_client's
    fields, on the wall clock), used when the lab's client made no record of it
    (the page's streams): the client's row, and what the cut is judged by."""
    if not REQUEST_ID.fullmatch(request_id):
        raise UnknownName(f"no stream {request_id!r}: not a request id")
    page_client = page_record(client)
    lab = traced_lab(state.settings)
    try:
        timeline = collect(lab, request_id, wait_s=wait_s)
    except httpx.HTTPError as exc:
        return JSONResponse({"error": f"Jaeger did not answer: {exc!r}"}, status_code=502)
    if not timeline.marks:
        raise UnknownName(f"no stream {request_id!r} in the lab's logs or Jaeger "
                          f"({'; '.join(timeline.missing)})")
    if timeline.client is None and page_client is not None:
        with_client(timeline, page_client)
    return as_json(timeline)


PAGE_FIELDS = ("started_unix", "headers_s", "first_byte_s", "ttft_s", "last_token_s",
               "total_s")


def page_record(text: str) -> dict[str, Any] | None:
    """The page's timings as record_client's fields; None when absent or not
    a record (a bad one is ignored: the timeline stands without it)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        record: dict[str, Any] = {k: None if doc.get(k) is None else float(doc[k])
                                  for k in PAGE_FIELDS}
        pings = [float(t) for t in doc.get("pings_s") or []][:100]
    except (ValueError, TypeError, AttributeError):
        return None
    if record["started_unix"] is None or record["total_s"] is None or not all(
            math.isfinite(v) for v in (*record.values(), *pings) if v is not None):
        return None
    return {**record, "pings_s": pings, "done": bool(doc.get("done")),
            "error": str(doc.get("error") or "")[:64], "source": "page"}


def with_client(timeline: Timeline, client: dict[str, Any]) -> None:
    """The page's record into a timeline collected without one: its marks
    (as `build` makes them from a recorded client), so `cut()` can judge."""
    page = build(timeline.request_id, None, None, client)
    timeline.client = page.client
    timeline.marks.extend(page.marks)
    timeline.missing = [m for m in timeline.missing if not m.startswith("client timings")]


def as_json(timeline: Timeline) -> dict[str, Any]:
    doc = timeline.as_json()
    doc["waterfall"] = waterfall(doc)
    return doc


def install_error_handlers(app: FastAPI) -> None:
    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=409)

    app.add_exception_handler(TraceUnavailable, unavailable)


# ---- the waterfall: rows of bars on one axis (seconds from the timeline's origin) -----------

def _row(hop: str, label: str, start: float | None, end: float | None,
         segments: list[dict[str, Any]] | None = None,
         marks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"hop": hop, "label": label, "start_s": start, "end_s": end,
            "segments": segments or [], "marks": marks or []}


def _mark(what: str, t: float | None) -> list[dict[str, Any]]:
    return [] if t is None else [{"what": what, "t_s": round(t, 6)}]


def _segment(what: str, start: float | None, end: float | None) -> list[dict[str, Any]]:
    if start is None or end is None or end < start:
        return []
    return [{"what": what, "start_s": round(start, 6), "end_s": round(end, 6)}]


def waterfall(doc: dict[str, Any]) -> dict[str, Any]:
    """Timeline.as_json() as rows the page draws: client (request sent → end,
    with headers, first byte, first token, heartbeats), proxy (its request
    time, the gateway's headers), each gateway span (engine accepted, first
    token, heartbeats, client left), each engine span (queue and prefill as
    segments, first token, cancel); the cut as a mark across every row."""
    origin = float(doc.get("origin_unix") or 0.0)
    marks = doc.get("marks") or []

    def rel(unix: Any) -> float | None:
        return None if unix is None else round(float(unix) - origin, 6)

    def client_mark(what: str) -> float | None:
        found = [m["t_s"] for m in marks if m["hop"] == "client" and m["what"] == what]
        return min(found) if found else None

    rows = []
    client = doc.get("client") or {}
    if client:
        label = "page" if client.get("source") == "page" else "client"
        row = _row("client", label, client_mark("request sent"), client_mark("end"))
        for what in ("headers", "first_byte", "first_token", "last_token"):
            row["marks"] += _mark(what, client_mark(what))
        row["marks"] += [{"what": "heartbeat", "t_s": m["t_s"]} for m in marks
                         if m["hop"] == "client" and m["what"] == "ping"]
        if row["start_s"] is not None and row["end_s"] is not None:
            row["segments"] += _segment("connect", row["start_s"], client_mark("headers"))
        rows.append(row)
    proxy = doc.get("proxy_log")
    if proxy and proxy.get("start"):
        start, end = rel(proxy["start"]), rel(proxy.get("end"))
        header = proxy.get("upstream_header_s")
        row = _row("proxy", f"proxy ({proxy.get('proxy', '?')})", start, end,
                   segments=_segment("to the gateway's headers", start,
                                     None if header is None or start is None
                                     else start + float(header)),
                   marks=_mark("gateway headers", None if header is None or start is None
                               else start + float(header)))
        rows.append(row)
    for span in doc.get("spans") or []:
        engine = str(span.get("service", "")).endswith("engine")
        events: dict[str, float | None] = {}
        row = _row("engine" if engine else "gateway",
                   span["name"] + (f" [{span['instance']}]" if span.get("instance") else ""),
                   rel(span["start_unix"]), rel(span["end_unix"]))
        for event in span.get("events") or []:
            at = rel(event["at_unix"])
            events.setdefault(event["name"], at)
            name = "heartbeat" if event["name"] == "heartbeat" else event["name"]
            if event["name"] not in ("accepted", "admitted"):
                row["marks"] += _mark(name, at)
        if engine:
            accepted = events.get("accepted", row["start_s"])
            row["segments"] += _segment("queue", accepted, events.get("admitted"))
            row["segments"] += _segment("prefill", events.get("admitted"),
                                        events.get("first_token"))
        else:
            row["segments"] += _segment("to the engine's first token", row["start_s"],
                                        events.get("first_token"))
        rows.append(row)
    cut = doc.get("cut")
    if cut and client.get("error") == "stopped" and client_mark("end") is not None:
        # the page's Stop: the client cut it
        cut = {"hop": "client (Stop)", "at_s": client_mark("end")}
    ends = [t for row in rows for t in (row["start_s"], row["end_s"]) if t is not None]
    return {"rows": rows, "start_s": min(ends, default=0.0),
            "end_s": max(ends, default=0.0),
            "cut": None if not cut else {"hop": cut["hop"], "t_s": cut["at_s"]}}
