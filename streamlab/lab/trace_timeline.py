"""One stream's timeline across every hop (`streamlab trace REQUEST_ID`,
docs/tracing.md), from four sources that share its request id and trace id:

    client   the lab's measuring client's own clock: request sent, headers,
             first byte, first token, end (`record_client`, one JSON line per
             stream in <run dir>/traces/clients.jsonl)
    proxy    the edge proxy's JSON access-log line: when it took the request,
             the gateway's headers, its end (`proxy_line`)
    gateway  its span in Jaeger: engine accepted, first token read from the
             engine, heartbeats, client left, closed (services/gateway/tracing.py)
    engine   its span: accepted, admitted (queue), first token handed to the
             wire (prefill), cancel, end (services/engine/tracing.py)

Every mark is a wall-clock time (the lab runs on one machine, one clock); the
timeline shows each relative to the earliest. `where_held` says where the
tokens waited: the longest step between the engine's first token and the
client's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.client.openai_stream import StreamResult
from services.common.tracing import new_traceparent, trace_id_of
from streamlab.lab.proxies import PROXIES, proxy_class

CLIENT_LOG = Path("traces") / "clients.jsonl"
HOPS = ("client", "proxy", "gateway", "engine")


@dataclass(frozen=True)
class Mark:
    at: float  # unix seconds
    hop: str
    what: str
    detail: str = ""


@dataclass
class Timeline:
    request_id: str
    trace_id: str | None = None
    marks: list[Mark] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)  # (service, name, start, end, attrs)
    proxy: dict[str, Any] | None = None
    client: dict[str, Any] | None = None
    missing: list[str] = field(default_factory=list)

    @property
    def origin(self) -> float:
        return min((m.at for m in self.marks), default=0.0)

    def first(self, hop: str, what: str) -> float | None:
        found = [m.at for m in self.marks if m.hop == hop and m.what == what]
        return min(found) if found else None

    def figures(self) -> dict[str, float | None]:
        """Seconds from the timeline's origin, the marks a reader compares."""
        def rel(hop: str, what: str) -> float | None:
            at = self.first(hop, what)
            return None if at is None else round(at - self.origin, 6)
        engine_first = self.first("engine", "first_token")
        client_first = self.first("client", "first_byte")
        return {
            "engine_first_token_s": rel("engine", "first_token"),
            "gateway_first_token_s": rel("gateway", "first_token"),
            "client_first_byte_s": rel("client", "first_byte"),
            "client_first_token_s": rel("client", "first_token"),
            # The last mark, or a span's end (a span ends a few µs after its
            # last event): every bar of the waterfall lies within it.
            "end_s": round(max([m.at for m in self.marks]
                               + [s["end_unix"] for s in self.spans]) - self.origin, 6)
            if self.marks else None,
            # How long the first token took from leaving the engine to the client.
            "engine_to_client_s": (round(client_first - engine_first, 6)
                                   if engine_first is not None and client_first is not None
                                   else None),
        }

    def where_held(self) -> str | None:
        """Where the first token waited longest on its way: engine → gateway
        (the engine hop), or gateway → client (the proxy and the hops around
        it; "held by the proxy to the end" when the client's first byte came
        as the proxy's response ended: a buffering proxy)."""
        engine = self.first("engine", "first_token")
        gateway = self.first("gateway", "first_token")
        client = self.first("client", "first_byte")
        gaps = []
        if engine is not None and gateway is not None:
            gaps.append((gateway - engine, "engine → gateway (the engine hop)"))
        if gateway is not None and client is not None:
            where = "gateway → client (proxy and edge)"
            proxy_end = self.first("proxy", "end")
            if proxy_end is not None and abs(proxy_end - client) < 0.1 and client - gateway > 0.2:
                where = "gateway → client: held by the proxy until its response ended (buffered)"
            gaps.append((client - gateway, where))
        if not gaps:
            return None
        gap, where = max(gaps)
        return f"{where}: {gap:.3f} s" if gap > 0.05 else None

    def _gateway_outcome(self) -> str | None:
        for span in self.spans:
            outcome = span["attributes"].get("streamlab.outcome")
            if not span["service"].endswith("engine") and outcome:
                return str(outcome)
        return None

    def _engine_state(self) -> str | None:
        for span in self.spans:
            state = span["attributes"].get("streamlab.state")
            if span["service"].endswith("engine") and state:
                return str(state)
        return None

    def cut(self) -> dict[str, Any] | None:
        """Which hop cut a stream that ended without [DONE], and when: None when
        the client's stream ended whole (or nothing says how it ended).

        The hop whose end came first: the proxy when its response ended before
        (or as) the gateway saw its client leave (it closed both sides: an idle
        timeout, a buffer limit); in front of the proxy (the edge hop) when the
        client's end came before the proxy's; the gateway when it closed the
        stream itself; the engine when its generation failed. `silence_s`: from
        the client's last token to the cut, the quiet an idle timeout counts."""
        client = self.client or {}
        end = self.first("client", "end")
        if end is None or client.get("done"):
            return None
        proxy_end = self.first("proxy", "end")
        left = self.first("gateway", "client_left")
        closed = self.first("gateway", "closed")
        outcome, state = self._gateway_outcome(), self._engine_state()
        proxy = (self.proxy or {}).get("proxy")
        if state not in (None, "completed", "cancelled", "running") and outcome != "client_left":
            hop, at = "engine", self.first("engine", "end") or closed or end
        elif outcome not in (None, "client_left", "completed"):
            hop, at = "gateway", closed or end
        elif proxy_end is not None and end < proxy_end - 0.05 and (left is None or end < left):
            hop, at = "edge", end
        elif proxy_end is not None:
            hop, at = "proxy", proxy_end
        else:
            hop, at = "unknown", end
        last = self.first("client", "last_token")
        return {
            "hop": hop, "proxy": proxy, "at_s": round(at - self.origin, 6),
            "silence_s": None if last is None else round(at - last, 6),
            "client_error": client.get("error") or "cut",
            "proxy_status": (self.proxy or {}).get("status"),
            "proxy_request_time_s": (self.proxy or {}).get("request_time_s"),
            "gateway_outcome": outcome,
            "gateway_client_left_s": None if left is None else round(left - self.origin, 6),
            "engine_state": state,
        }

    def describe_cut(self) -> str | None:
        cut = self.cut()
        if cut is None:
            return None
        who = {"proxy": f"the proxy ({cut['proxy']})", "edge": "the hop in front of the proxy "
               "(edge)", "gateway": "the gateway", "engine": "the engine"}.get(
                   cut["hop"], "an unknown hop")
        line = f"cut by {who} at {cut['at_s'] * 1000:.1f} ms"
        if cut["silence_s"] is not None:
            line += f", {cut['silence_s']:.3f} s after the client's last token"
        if cut["hop"] == "proxy":
            line += (f"; its response ended with status {cut['proxy_status']} after "
                     f"{cut['proxy_request_time_s']:.3f} s")
        if cut["gateway_outcome"] is not None:
            line += f"; the gateway's stream: {cut['gateway_outcome']}"
            if cut["gateway_client_left_s"] is not None:
                line += f" at {cut['gateway_client_left_s'] * 1000:.1f} ms"
        if cut["engine_state"] is not None:
            line += f"; the engine's generation: {cut['engine_state']}"
        return line + f" (the client: {cut['client_error']})"

    def as_json(self) -> dict[str, Any]:
        origin = self.origin
        return {
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "origin_unix": origin,
            "marks": [{"t_s": round(m.at - origin, 6), "hop": m.hop, "what": m.what,
                       "detail": m.detail} for m in sorted(self.marks, key=lambda m: m.at)],
            "figures": self.figures(),
            "where_held": self.where_held(),
            "cut": self.cut(),
            "spans": self.spans,
            "proxy_log": self.proxy,
            "client": self.client,
            "missing": self.missing,
        }

    def render(self, width: int = 48) -> list[str]:
        """A text waterfall: one row per mark, its time and a bar to it."""
        if not self.marks:
            return [f"request {self.request_id}: nothing found ({', '.join(self.missing)})"]
        origin = self.origin
        span = max(m.at for m in self.marks) - origin or 1.0
        lines = [f"request {self.request_id} · trace {self.trace_id or '?'}"]
        for m in sorted(self.marks, key=lambda m: m.at):
            t = m.at - origin
            bar = "·" * round(t / span * width)
            lines.append(f"{t * 1000:9.1f} ms  {m.hop:<8} {bar}▌ {m.what}"
                         + (f" ({m.detail})" if m.detail else ""))
        held = self.where_held()
        if held:
            lines.append(f"the first token waited longest at {held}")
        cut = self.describe_cut()
        if cut:
            lines.append(cut)
        if self.missing:
            lines.append("missing: " + "; ".join(self.missing))
        return lines


# ---- client -------------------------------------------------------------------

def client_headers(request_id: str) -> dict[str, str]:
    """What a traced client sends: its request id and a new trace it starts."""
    return {"X-Request-Id": request_id, "traceparent": new_traceparent()}


def record_client(run_dir: Path, request_id: str, traceparent: str, started_unix: float,
                  headers_s: float | None, first_byte_s: float | None, ttft_s: float | None,
                  total_s: float, pings: Iterable[float] = (), done: bool = False,
                  error: str = "", last_token_s: float | None = None) -> None:
    """One line of the client's own timings, for `streamlab trace`."""
    path = run_dir / CLIENT_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps({
            "request_id": request_id, "trace_id": trace_id_of(traceparent),
            "started_unix": started_unix, "headers_s": headers_s,
            "first_byte_s": first_byte_s, "ttft_s": ttft_s, "total_s": total_s,
            "last_token_s": last_token_s,
            "pings_s": list(pings)[:100], "done": done, "error": error,
            "recorded_unix": time.time()}) + "\n")


def record_stream(run_dir: Path, request_id: str, traceparent: str, started_unix: float,
                  result: StreamResult | None, elapsed_s: float) -> None:
    """record_client for one stream the lab's SSE client read (`stream_chat`:
    the scenarios' measure, `streamlab chat`); None: it never ended (hung)."""
    if result is None:
        record_client(run_dir, request_id, traceparent, started_unix, None, None, None,
                      elapsed_s, error="hung")
        return
    error = str((result.error or {}).get("code") or "")
    record_client(run_dir, request_id, traceparent, result.started_unix or started_unix,
                  result.headers_s, result.first_byte_s, result.ttft_s,
                  result.total_s or elapsed_s, result.ping_times, result.done, error,
                  result.token_times[-1] if result.token_times else None)


def client_record(run_dir: Path, request_id: str) -> dict[str, Any] | None:
    path = run_dir / CLIENT_LOG
    if not path.exists():
        return None
    found = None
    for line in path.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("request_id") == request_id:
            found = doc
    return found


# ---- proxy --------------------------------------------------------------------

def normalise_proxy_line(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """A proxy's JSON access-log line in one shape (lab/proxies/access_log.py):
    request_id, trace_id, status, bytes, start and end (unix s), upstream
    header/response seconds. Each proxy reads its own format."""
    for proxy in PROXIES.values():
        line = proxy.access_line(doc)
        if line is not None:
            return line
    return None


def proxy_lines(log: Path, max_bytes: int = 16 << 20) -> Iterable[dict[str, Any]]:
    """The normalised JSON lines of a proxy's access log (its last max_bytes)."""
    if not log.exists():
        return
    with log.open("rb") as source:
        size = log.stat().st_size
        source.seek(max(0, size - max_bytes))
        for raw in source:
            text = raw.decode(errors="replace").strip()
            start = text.find("{")
            if start < 0:
                continue
            try:
                doc = json.loads(text[start:])
            except ValueError:
                continue
            if isinstance(doc, dict) and (line := normalise_proxy_line(doc)) is not None:
                yield line


def proxy_line(log: Path, request_id: str) -> dict[str, Any] | None:
    found = None
    for line in proxy_lines(log):
        if line["request_id"] == request_id:
            found = line
    return found


# ---- spans ----------------------------------------------------------------------

def _tags(items: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


def spans_of(trace: Mapping[str, Any], request_id: str) -> list[dict[str, Any]]:
    """Jaeger's trace as plain spans (service, name, start/end unix s, attributes,
    events), those of this request only."""
    processes = trace.get("processes") or {}
    spans = []
    for span in trace.get("spans") or []:
        tags = _tags(span.get("tags") or [])
        if tags.get("streamlab.request_id") not in (request_id, None):
            continue
        process = processes.get(span.get("processID"), {})
        instance = _tags(process.get("tags") or []).get("service.instance.id", "")
        start = span["startTime"] / 1e6
        spans.append({
            "service": process.get("serviceName", "?"), "instance": instance,
            "name": span["operationName"], "span_id": span["spanID"],
            "start_unix": start, "end_unix": start + span["duration"] / 1e6,
            "attributes": {k: v for k, v in tags.items() if k.startswith("streamlab.")},
            "events": [{"at_unix": log["timestamp"] / 1e6,
                        "name": next((f["value"] for f in log["fields"] if f["key"] == "event"),
                                     "?"),
                        "attributes": {f["key"]: f["value"] for f in log["fields"]
                                       if f["key"] != "event"}}
                       for log in span.get("logs") or []],
        })
    return sorted(spans, key=lambda s: s["start_unix"])


def build(request_id: str, trace: Mapping[str, Any] | None, proxy: Mapping[str, Any] | None,
          client: Mapping[str, Any] | None) -> Timeline:
    timeline = Timeline(request_id)
    marks = timeline.marks
    if client is not None:
        timeline.client = dict(client)
        t0 = float(client["started_unix"])
        marks.append(Mark(t0, "client", "request sent"))
        for key, what in (("headers_s", "headers"), ("first_byte_s", "first_byte"),
                          ("ttft_s", "first_token"), ("last_token_s", "last_token")):
            if client.get(key) is not None:
                marks.append(Mark(t0 + float(client[key]), "client", what))
        for ping in client.get("pings_s") or []:
            marks.append(Mark(t0 + float(ping), "client", "ping"))
        marks.append(Mark(t0 + float(client["total_s"]), "client", "end",
                          "done" if client.get("done") else (client.get("error") or "cut")))
        timeline.trace_id = client.get("trace_id")
    else:
        timeline.missing.append("client timings (a stream the lab's client did not make)")
    if proxy is not None:
        timeline.proxy = dict(proxy)
        timeline.trace_id = timeline.trace_id or proxy.get("trace_id") or None
        if proxy.get("start"):
            start = float(proxy["start"])
            marks.append(Mark(start, "proxy", "request in", str(proxy.get("proxy", ""))))
            if proxy.get("upstream_header_s") is not None:
                marks.append(Mark(start + float(proxy["upstream_header_s"]), "proxy",
                                  "gateway headers in"))
            marks.append(Mark(float(proxy["end"]), "proxy", "end",
                              f"status {proxy.get('status')}, {proxy.get('bytes')} bytes"))
    else:
        timeline.missing.append("the proxy's access-log line")
    if trace is not None:
        timeline.spans = spans_of(trace, request_id)
        timeline.trace_id = timeline.trace_id or trace.get("traceID")
        for span in timeline.spans:
            hop = "engine" if span["service"].endswith("engine") else "gateway"
            label = span["name"] + (f" [{span['instance']}]" if span["instance"] else "")
            marks.append(Mark(span["start_unix"], hop, "span start", label))
            for event in span["events"]:
                detail = ", ".join(f"{k}={v}" for k, v in event["attributes"].items())
                marks.append(Mark(event["at_unix"], hop, event["name"], detail))
        if not timeline.spans:
            timeline.missing.append("spans tagged with this request id")
    else:
        timeline.missing.append("the trace (Jaeger: `streamlab up --tracing`)")
    return timeline


# ---- one stream of a local lab ---------------------------------------------------

def access_log_of(lab: Any) -> Path:
    """Where the lab's edge proxy writes its JSON access log."""
    return Path(proxy_class(lab.edge_proxy).access_log(Path(lab.run_dir), lab.proxy_setup))


def _complete(trace: Mapping[str, Any] | None, request_id: str) -> bool:
    if trace is None:
        return False
    services = {s["service"] for s in spans_of(trace, request_id)}
    return any(s.endswith("gateway") for s in services) and any(
        s.endswith("engine") for s in services)


def collect(lab: Any, request_id: str, wait_s: float = 3.0) -> Timeline:
    """The timeline of one stream of a local lab up with `--tracing`: its
    client record, its proxy line and its trace (waiting up to wait_s for the
    spans, which the services export in batches)."""
    from streamlab.lab import jaeger

    client = client_record(Path(lab.run_dir), request_id)
    deadline = time.monotonic() + wait_s
    trace: dict[str, Any] | None = None
    while True:
        proxy = proxy_line(access_log_of(lab), request_id)
        trace_id = (client or {}).get("trace_id") or (proxy or {}).get("trace_id")
        if trace_id:
            trace = jaeger.get_trace(lab.ports, trace_id)
        else:
            for service in ("streamlab-gateway", "streamlab-engine"):
                found = jaeger.find_traces(lab.ports, request_id, service)
                if found:
                    trace = found[0]
                    break
        if (_complete(trace, request_id) and proxy is not None) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return build(request_id, trace, proxy, client)
