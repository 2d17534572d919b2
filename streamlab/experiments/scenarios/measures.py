"""Measure functions: run one request through the lab as a real client would,
and return the figures a scenario's checks look at.

Each takes (lab, setup, timing) and returns a flat dict of figures, so the
CLI can print them and the checks can compare them. Timing comes from the
client's clock (perf_counter) on parsed events, never on chunks, except in
`sliced_reads`, whose point is the chunks.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path

import anyio
import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from streamlab.experiments.load_clients import LogTail
from streamlab.experiments.report import JSON, Figures
from streamlab.experiments.scenarios.model import THINK_AFTER_TOKEN, Measured, Setup
from streamlab.experiments.scenarios.plot import from_token_times
from streamlab.experiments.timing import Timing
from streamlab.lab.target import LabTarget
from streamlab.lab.trace_timeline import client_headers, record_stream
from streamlab_protocol.sse import Event, SSEDecoder

CONNECT_TIMEOUT_S = 5.0
# An SSE event ends at a blank line, whatever the line ending (the gateway uses CRLF).
EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def request_body(setup: Setup, timing: Timing, prompt: str = "scenario") -> dict[str, JSON]:
    pauses = ([{"after_token": THINK_AFTER_TOKEN, "pause_ms": int(timing.think_s * 1000)}]
              if setup.think_pause else None)
    heartbeat = {"gateway": None, "off": 0, "on": timing.heartbeat_s}[setup.heartbeat]
    return chat_body(prompt, prefill_ms=timing.prefill_ms, token_gap_ms=timing.gap_ms,
                     answer_tokens=timing.tokens, pauses=pauses, heartbeat_s=heartbeat)


def expected_total_s(setup: Setup, timing: Timing) -> float:
    return timing.model_total_s + (timing.think_s if setup.think_pause else 0.0)


def hang_deadline_s(setup: Setup, timing: Timing) -> float:
    """How long the harness waits before calling the client hung (Setup.patience)."""
    expected = expected_total_s(setup, timing)
    if setup.patience == "short":
        return expected + 3 * timing.watchdog_s + timing.tolerance_s
    return 2 * expected + 10.0


def _short(message: str, limit: int = 70) -> str:
    return message if len(message) <= limit else message[: limit - 1] + "…"


async def sse_stream(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    """One streamed chat completion through the edge, timed per parsed event
    (each token's arrival kept for `scenario run --plot`)."""
    url = f"{lab.edge_url}{setup.location.rstrip('/')}/v1/chat/completions"
    read_timeout = timing.watchdog_s if setup.watchdog else None
    nginx_log, gateway_log = LogTail.of(lab, "nginx"), LogTail.of(lab, "gateway")
    # Its own request id and a trace it starts: the report names the stream,
    # and `streamlab trace ID` draws it on a lab up with --tracing.
    request_id = uuid.uuid4().hex
    traced = client_headers(request_id)
    started_unix = time.time()
    started = time.perf_counter()
    result = None
    async with httpx.AsyncClient(timeout=httpx.Timeout(read_timeout,
                                                       connect=CONNECT_TIMEOUT_S)) as client:
        with anyio.move_on_after(hang_deadline_s(setup, timing)):
            result = await stream_chat(client, url, request_body(setup, timing),
                                       headers={"Accept-Encoding": setup.accept_encoding,
                                                **traced})
    elapsed = time.perf_counter() - started
    _record_traced(lab, request_id, traced["traceparent"], started_unix, result, elapsed)
    figures: Figures = {"hung": result is None, "request_id": request_id}
    if result is None:
        figures.update(total_s=elapsed, done=False, tokens=0, error_code="",
                       client_error=f"none: still waiting after {elapsed:.1f} s")
        return Measured(figures, (from_token_times((), [(elapsed, "timeout")]),))
    total = result.total_s or elapsed
    last_token = result.token_times[-1] if result.token_times else None
    last_byte = max([t for t in (last_token, result.first_byte_s) if t is not None]
                    + result.ping_times, default=0.0)
    error = result.error or {}
    figures.update(
        status=result.status,
        tokens=len(result.texts),
        done=result.done,
        error_code=str(error.get("code") or ""),
        client_error=_short(str(error.get("message", "")).removeprefix("connection failed: "),
                            120) if error else "",
        first_byte_s=result.first_byte_s,
        ttft_s=result.ttft_s,
        total_s=total,
        first_byte_share=(result.first_byte_s / total) if result.first_byte_s else None,
        token_spread_share=((last_token - result.token_times[0]) / total
                            if last_token is not None else None),
        ttft_shift_s=(result.ttft_s - timing.model_ttft_s) if result.ttft_s else None,
        last_token_lag_s=(last_token - expected_total_s(setup, timing)
                          if last_token is not None else None),
        silence_before_end_s=total - last_byte,
        pings=len(result.ping_times),
        bytes_down=result.bytes_down,
        stream_kb_per_s=result.bytes_down / 1024 / expected_total_s(setup, timing),
        # None without the `logs` capability: no check on them can pass unread.
        nginx_upstream_timeouts=nginx_log.count("upstream timed out") if nginx_log else None,
        gateway_log_errors=gateway_log.count("ERROR", "Traceback") if gateway_log else None,
    )
    # A stream that ended without [DONE] ends on a mark: cut (transport), timeout, ...
    ended = {"transport": "cut"}.get(str(figures["error_code"]), str(figures["error_code"]))
    events: list[tuple[float | None, str]] = [(at, "ping") for at in result.ping_times]
    events += [] if result.done else [(total, ended or "cut")]
    return Measured(figures, (from_token_times(result.token_times, events),))


def _record_traced(lab: LabTarget, request_id: str, traceparent: str, started_unix: float,
                   result: StreamResult | None, elapsed: float) -> None:
    """The client's timings of a stream, for `streamlab trace`, on a local lab
    up with --tracing (its run dir holds them)."""
    options = getattr(lab, "options", None)
    run_dir = getattr(lab, "run_dir", None)
    if not getattr(options, "tracing", False) or run_dir is None:
        return
    record_stream(Path(run_dir), request_id, traceparent, started_unix, result, elapsed)


async def websocket_chat(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    """The gateway's /ws through the edge and an nginx location: one prompt,
    one message per token, "[DONE]"."""
    url = (f"ws://{lab.ports.host}:{lab.ports.edge_port}"
           f"{setup.location.rstrip('/')}/ws")
    figures: Figures = {"handshake_status": None, "tokens": 0, "done": False, "ttft_s": None,
                        "client_error": ""}
    started = time.perf_counter()
    try:
        with anyio.fail_after(hang_deadline_s(setup, timing)):
            async with connect(url, open_timeout=CONNECT_TIMEOUT_S, close_timeout=2.0,
                               compression=None) as ws:
                figures["handshake_status"] = 101
                # The /ws contract: {"prompt": ..., "streamlab": {...}} (ws_routes.WsPrompt).
                prompt = "scenario"
                chat = request_body(setup, timing, prompt)
                await ws.send(json.dumps({"prompt": prompt, "streamlab": chat.get("streamlab")}))
                async for message in ws:
                    if message == "[DONE]":
                        figures["done"] = True
                        continue
                    if figures["ttft_s"] is None:
                        figures["ttft_s"] = time.perf_counter() - started
                    figures["tokens"] = int(figures["tokens"] or 0) + 1
    except InvalidStatus as exc:
        figures["handshake_status"] = exc.response.status_code
        figures["client_error"] = f"handshake refused: HTTP {exc.response.status_code}"
    except (InvalidHandshake, ConnectionClosed, OSError, TimeoutError) as exc:
        figures["client_error"] = _short(repr(exc))
    figures["total_s"] = time.perf_counter() - started
    return figures


async def sliced_reads(lab: LabTarget, setup: Setup, timing: Timing) -> Figures:
    """The raw bytes of one stream, read off a socket as they come (HTTP/1.0,
    so the body is the SSE text itself, with no chunked framing), then parsed
    by the setup's parser. Shows how events and reads line up."""
    body = request_body(setup, timing)
    path = f"{setup.location.rstrip('/')}/v1/chat/completions"
    payload = json.dumps(body).encode()
    request = (f"POST {path} HTTP/1.0\r\nHost: {lab.ports.host}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
               ).encode() + payload
    reads: list[bytes] = []
    with anyio.fail_after(hang_deadline_s(setup, timing)):
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(lab.ports.host, lab.ports.edge_port), CONNECT_TIMEOUT_S)
        try:
            writer.write(request)
            await writer.drain()
            head = b""
            while b"\r\n\r\n" not in head:
                more = await asyncio.wait_for(reader.read(65536), timing.watchdog_s * 5)
                if not more:
                    break
                head += more
            head, _, rest = head.partition(b"\r\n\r\n")
            if rest:
                reads.append(rest)
            while True:
                await anyio.sleep(setup.read_pause_s)  # the slow consumer, on purpose
                chunk = await asyncio.wait_for(reader.read(65536), timing.watchdog_s * 5)
                if not chunk:
                    break
                reads.append(chunk)
        finally:
            writer.close()
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")

    # What the gateway sent: the same request, not streamed, straight to it.
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as client:
        whole = await client.post(f"{lab.gateway_url}/v1/chat/completions",
                                  json={**body, "stream": False})
    expected_text = whole.json()["choices"][0]["message"]["content"]
    events_sent = timing.tokens + 2  # tokens, the finish chunk, [DONE]

    texts, parsed, errors = (_parse_sse(reads) if setup.parser == "sse"
                             else _parse_naive(reads))
    return {
        "status_line": status_line,
        "reads": len(reads),
        "split_reads": sum(1 for r in reads if not EVENT_END.search(r[-4:])),
        "merged_reads": sum(1 for r in reads if len(EVENT_END.findall(r)) >= 2),
        "events_sent": events_sent,
        "events_parsed": parsed,
        "parse_errors": errors,
        "events_exact": parsed == events_sent and errors == 0,
        "text_matches": "".join(texts) == expected_text,
    }


def _parse_sse(reads: list[bytes]) -> tuple[list[str], int, int]:
    decoder = SSEDecoder()
    texts: list[str] = []
    parsed = errors = 0
    for chunk in reads:
        for item in decoder.feed(chunk):
            if not isinstance(item, Event):
                continue  # `: ping`
            parsed += 1
            if item.data != "[DONE]":
                try:
                    texts.extend(_content(json.loads(item.data)))
                except ValueError:
                    errors += 1
    return texts, parsed, errors


def _parse_naive(reads: list[bytes]) -> tuple[list[str], int, int]:
    """The classic bug: one read is one event, `data: ` then JSON."""
    texts: list[str] = []
    parsed = errors = 0
    for chunk in reads:
        line = chunk.decode(errors="replace").strip()
        if line.startswith(":"):
            continue
        if not line.startswith("data:"):
            errors += 1
            continue
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            parsed += 1
            continue
        try:
            texts.extend(_content(json.loads(data)))
            parsed += 1
        except ValueError:
            errors += 1
    return texts, parsed, errors


def _content(payload: JSON) -> list[str]:
    """The content of each choice's delta in one chat.completion.chunk; none
    from a payload of any other shape."""
    choices = payload.get("choices") if isinstance(payload, dict) else None
    texts = []
    for choice in choices if isinstance(choices, list) else ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        content = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(content, str) and content:
            texts.append(content)
    return texts
