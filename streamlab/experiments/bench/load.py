"""A load generator that is not the bottleneck: raw asyncio sockets, minimal parsing.

A Python client on httpx and a line parser costs ~0.5 ms of CPU per token, as
much as the gateway it measures (docs/benchmarks.md): at 100 streams x 50
tokens/s it takes a core by itself and the figures measure the client. This
one writes a prepared HTTP/1.1 request on a bare `asyncio.Protocol` and, per
`data_received`, only counts the token events in the bytes (a substring count)
and notes the time: no HTTP parser, no JSON, no SSE parser, no per-line work.
Tokens that arrive in one read share its timestamp, which is what a reader
sees (inter-chunk 0 means "bunched").

    run_load(host, port, path, body, streams=N)          N streams at once (fixed concurrency)
    run_load(..., rate=R, duration_s=D)                   open loop: Poisson arrivals at R/s
    run_load(..., streams=N, steady=SteadyWindow(edge))   and the part in which all N run

The steady window is what a paced token costs with no stream starting or
ending: it opens when the last of the N streams has its first token and closes
when the first one ends, and `edge` is called at both (a caller reads its CPU
meters there). CPU over a whole run divided by its tokens also charges each
token its share of its stream's set-up (a hundredth of it for 100-token
streams), which has targets of its own.

It reports its own CPU (the process's, read from the kernel around the run)
beside what it measured, so a reader can see that it was not the limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from streamlab.experiments.bench.probes import CpuMeter, cpu_ms
from streamlab.experiments.bench.stats import percentile
from streamlab.experiments.report import Figures, Report
from streamlab.lab.target import TargetUnreachable

# What every token event of the OpenAI route carries and nothing else does
# (the finish event's delta is empty): counted, never parsed.
TOKEN_MARK = b'"content":'
DONE_MARK = b"[DONE]"
# The gateway's heartbeat comment, looked for only when a run tracks heartbeats.
PING_MARK = b": ping"
# Bytes kept from one read for the next: a mark split across two reads is seen
# whole in the second, and a whole token mark never twice (DONE_MARK is shorter
# than the carry, and seeing it twice is harmless).
_TAIL = len(TOKEN_MARK) - 1


class SteadyWindow:
    """The stretch of a fixed-concurrency run in which every stream is running:
    from the moment the last one has its first token to the moment the first
    one ends (finished, failed or cut). `edge` is called when it opens and when
    it closes, on the event loop, as the token or end that opens or closes it
    arrives. After the run, `tokens` is how many arrived inside it and
    `seconds` how long it lasted; both stay None if it never opened (a stream
    failed before its first token) or never closed."""

    def __init__(self, edge: Callable[[], object]) -> None:
        self._edge = edge
        self._waiting = 0  # streams still to have their first token
        self._opened: list[_Stream] = []
        self._open_tokens = 0
        self._open_at = 0.0
        self.state = "idle"  # idle, waiting, open, closed
        self.tokens: int | None = None
        self.seconds: float | None = None

    def arm(self, streams: int, opened: list[_Stream]) -> None:
        """A new run: what a previous one measured is forgotten."""
        self._waiting, self._opened, self.state = streams, opened, "waiting"
        self._open_tokens, self.tokens, self.seconds = 0, None, None

    def first_token(self) -> None:
        """A stream's first read with tokens arrived (already counted in it)."""
        self._waiting -= 1
        if self._waiting == 0 and self.state == "waiting":
            self._edge()
            self.state = "open"
            self._open_at = time.monotonic()
            # Not this read's tokens: their way here was paid before the window.
            self._open_tokens = sum(s.tokens for s in self._opened)

    def ended(self) -> None:
        if self.state == "open":
            self._edge()
            self.state = "closed"
            self.seconds = time.monotonic() - self._open_at
            self.tokens = sum(s.tokens for s in self._opened) - self._open_tokens
        elif self.state == "waiting":
            self.state = "closed"  # a stream ended before all had begun: no window


class _Stream(asyncio.Protocol):
    """One request on its own connection; `done` resolves when it ends."""

    def __init__(self, request: bytes, started: float, keep_body: bool = False,
                 track_pings: bool = False, steady: SteadyWindow | None = None) -> None:
        self._request = request
        self._steady = steady
        # When the head arrived, and each heartbeat (with track_pings).
        self.head_at = 0.0
        self.pings: list[float] | None = [] if track_pings else None
        # The raw response after the head, kept only when asked (tests check texts).
        self.body: list[bytes] | None = [] if keep_body else None
        self.started = started
        self.arrivals: list[tuple[float, int]] = []  # (when, tokens in that read)
        self.tokens = 0
        self.status = 0
        self.finished = False
        self.error = ""
        self._head = b""
        self._carry = b""
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.status:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self._head[:end], self._head[end + 4:]
            self._head = b""
            self.head_at = now
            try:
                self.status = int(head.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
            if self.status != 200:
                self.error = f"HTTP {self.status}"
                self._close()
                return
        if self.body is not None:
            self.body.append(data)
        # The carry: a mark split across two reads is counted in the second.
        window = self._carry + data
        count = window.count(TOKEN_MARK)
        if self.pings is not None:
            self.pings.extend([now] * window.count(PING_MARK))
        if count:
            first = not self.arrivals
            self.arrivals.append((now, count))
            self.tokens += count
            if first and self._steady is not None:
                self._steady.first_token()
        if DONE_MARK in window:
            self.finished = True
            if self._steady is not None:
                self._steady.ended()
            self._close()
            return
        self._carry = window[-_TAIL:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished and not self.error:
            self.error = f"closed: {exc}" if exc else "closed before [DONE]"
        if self._steady is not None:
            self._steady.ended()
        if not self.done.done():
            self.done.set_result(None)

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()


@dataclass
class LoadResult:
    streams: int
    completed: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    wall_s: float = 0.0
    ttft_ms: dict[str, float] = field(default_factory=dict)
    icl_ms: dict[str, float] = field(default_factory=dict)  # inter-chunk (token to token)
    client_cpu_ms: float | None = None
    # Each completed stream's text (the deltas joined), with `keep_text`.
    texts: list[str] = field(default_factory=list)
    # With `heartbeat_s`: how late each heartbeat came, ms past the interval after
    # the one before it (the first: after the response head).
    heartbeats: int = 0
    heartbeat_late_ms: dict[str, float] = field(default_factory=dict)
    # The same, and each token's lateness against `token_gap_ms` (its gap past
    # the gap asked for), for what arrived while the ramp was still opening
    # streams: what a burst of set-ups does to the streams already running.
    ramp_heartbeat_late_ms: dict[str, float] = field(default_factory=dict)
    ramp_token_late_ms: dict[str, float] = field(default_factory=dict)

    @property
    def client_us_per_token(self) -> float | None:
        if self.client_cpu_ms is None or not self.tokens:
            return None
        return self.client_cpu_ms * 1000 / self.tokens

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def figures(self) -> Figures:
        """Flat: `ttft_ms_p50`, `icl_ms_p99`, ...; the errors as one word
        ("HTTP 503: 2, timeout: 1") beside their count."""
        usage = self.client_us_per_token
        out: Figures = {
            "streams": self.streams, "completed": self.completed, "failed": self.failed,
            "errors": ", ".join(f"{k}: {v}" for k, v in sorted(self.errors.items())),
            "tokens": self.tokens, "wall_s": round(self.wall_s, 3),
            **{f"ttft_ms_{q}": v for q, v in self.ttft_ms.items()},
            **{f"icl_ms_{q}": v for q, v in self.icl_ms.items()},
            "client_cpu_ms": None if self.client_cpu_ms is None else round(self.client_cpu_ms, 1),
            "client_us_per_token": None if usage is None else round(usage, 1)}
        if self.heartbeats:
            out["heartbeats"] = self.heartbeats
            out.update({f"heartbeat_late_ms_{q}": v for q, v in self.heartbeat_late_ms.items()})
        out.update({f"ramp_heartbeat_late_ms_{q}": v
                    for q, v in self.ramp_heartbeat_late_ms.items()})
        out.update({f"ramp_token_late_ms_{q}": v for q, v in self.ramp_token_late_ms.items()})
        return out

    def report(self, experiment: str = "bench load", variant: str = "") -> Report:
        return Report(experiment, variant, figures=self.figures())


def http_request(host: str, port: int, path: str, body: Mapping[str, object]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def run_load(host: str, port: int, path: str, body: Mapping[str, object], *,
                   streams: int = 0, ramp_s: float = 0.5, rate: float = 0.0,
                   duration_s: float = 0.0, timeout_s: float = 120.0,
                   seed: int = 1, keep_text: bool = False,
                   heartbeat_s: float = 0.0, token_gap_ms: float = 0.0,
                   steady: SteadyWindow | None = None) -> LoadResult:
    """`streams` at once, their starts spread evenly over `ramp_s` (a burst of
    thousands of connects is the kernel's accept queue's test, not the relay's);
    or, with `rate`, Poisson arrivals at `rate` per second for `duration_s`.
    `keep_text` keeps each response and decodes its text after the run (never
    on the hot path): for checks that every stream got the whole answer.
    `heartbeat_s` (the interval the request asks for) tracks `: ping` arrivals
    and reports how late they came; `token_gap_ms` (the gap the request asks
    for) reports how late tokens came while the ramp ran. `steady` (with
    `streams` only) marks the stretch in which all of them run."""
    loop = asyncio.get_running_loop()
    request = http_request(host, port, path, body)
    if rate > 0:
        rng = random.Random(seed)
        offsets, at = [], rng.expovariate(rate)
        while at < duration_s:
            offsets.append(at)
            at += rng.expovariate(rate)
    else:
        offsets = [ramp_s * i / max(1, streams) for i in range(streams)]
    meter = CpuMeter(os.getpid())
    cpu_before = meter.read()
    begin = loop.time()
    ramp_end = time.monotonic() + (duration_s if rate > 0 else ramp_s)
    opened: list[_Stream] = []
    failures: dict[str, int] = {}
    if steady is not None:
        if rate > 0:
            raise ValueError("a steady window needs a fixed number of streams, not a rate")
        steady.arm(len(offsets), opened)

    async def one(offset: float) -> None:
        await asyncio.sleep(max(0.0, begin + offset - loop.time()))
        stream = _Stream(request, time.monotonic(), keep_text, heartbeat_s > 0, steady)
        try:
            await loop.create_connection(lambda: stream, host, port)
        except OSError as exc:
            key = f"connect: {exc.strerror or exc}"
            failures[key] = failures.get(key, 0) + 1
            if steady is not None:
                steady.ended()
            return
        opened.append(stream)
        await stream.done

    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(one(o) for o in offsets))
    except TimeoutError:
        failures["timeout"] = failures.get("timeout", 0) + 1
    wall_s = loop.time() - begin
    cpu_after = meter.read()
    result = summarize(opened, failures, len(offsets), wall_s, cpu_ms(cpu_before, cpu_after))
    if heartbeat_s > 0:
        late = heartbeat_lateness_ms(opened, heartbeat_s)
        result.heartbeats, result.heartbeat_late_ms = len(late), _quantiles(late)
        result.ramp_heartbeat_late_ms = _quantiles(
            heartbeat_lateness_ms(opened, heartbeat_s, until=ramp_end))
    if token_gap_ms > 0:
        result.ramp_token_late_ms = _quantiles(
            token_lateness_ms(opened, token_gap_ms / 1000, until=ramp_end))
    return result


def heartbeat_lateness_ms(opened: list[_Stream], interval_s: float,
                          until: float = float("inf")) -> list[float]:
    """Per heartbeat (those that arrived by `until`, monotonic s): ms past
    `interval_s` after the previous one (the first one: after the response
    head); 0 when on time."""
    late: list[float] = []
    for stream in opened:
        previous = stream.head_at
        for at in stream.pings or ():
            if at > until:
                break
            late.append(max(0.0, (at - previous - interval_s) * 1000))
            previous = at
    return late


def token_lateness_ms(opened: list[_Stream], gap_s: float,
                      until: float = float("inf")) -> list[float]:
    """Per token after a stream's first (those that arrived by `until`): ms
    past `gap_s` after the read before it; 0 when on time. Tokens bunched in
    one read count as on time (the first of them carries the lateness)."""
    late: list[float] = []
    for stream in opened:
        if not stream.arrivals:
            continue
        previous = stream.arrivals[0][0]
        for at, count in stream.arrivals[1:]:
            if at > until:
                break
            late.append(max(0.0, (at - previous - gap_s) * 1000))
            late.extend([0.0] * (count - 1))
            previous = at
    return late


def summarize(opened: list[_Stream], failures: dict[str, int], streams: int, wall_s: float,
              client_cpu_ms: float | None) -> LoadResult:
    result = LoadResult(streams=streams, wall_s=wall_s, client_cpu_ms=client_cpu_ms)
    result.errors = dict(failures)
    ttfts: list[float] = []
    gaps: list[float] = []
    for stream in opened:
        result.tokens += stream.tokens
        if stream.finished:
            result.completed += 1
        elif stream.error:
            key = stream.error.split(":")[0]
            result.errors[key] = result.errors.get(key, 0) + 1
        if not stream.arrivals:
            continue
        ttfts.append((stream.arrivals[0][0] - stream.started) * 1000)
        previous = stream.arrivals[0][0]
        gaps.extend([0.0] * (stream.arrivals[0][1] - 1))
        for when, count in stream.arrivals[1:]:
            gaps.append((when - previous) * 1000)
            gaps.extend([0.0] * (count - 1))  # bunched: several tokens in one read
            previous = when
        if stream.finished and stream.body is not None:
            result.texts.append(sse_text(dechunk(b"".join(stream.body))))
    result.ttft_ms = _quantiles(ttfts)
    result.icl_ms = _quantiles(gaps)
    return result


def dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's payload (a body that is not chunked comes back
    as it is: the gateway itself sends chunked, nginx too)."""
    out: list[bytes] = []
    at = 0
    while True:
        end = body.find(b"\r\n", at)
        if end < 0:
            return body if at == 0 else b"".join(out)
        try:
            size = int(body[at:end].split(b";")[0], 16)
        except ValueError:
            return body if at == 0 else b"".join(out)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2:end + 2 + size])
        at = end + 2 + size + 2


def sse_text(payload: bytes) -> str:
    """The answer an OpenAI chat stream carries: its content deltas, joined."""
    parts = []
    for line in payload.decode().splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices", []):
            parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"p{q}": round(percentile(values, q), 2) for q in (50, 90, 99)}


def bench_load(url: str, *, streams: int = 100, rate: float = 0.0, duration_s: float = 10.0,
               tokens: int = 100, gap_ms: int = 20, heartbeat_s: float = 0.0) -> Report:
    """`streamlab bench load`: `streams` at once (or Poisson arrivals at `rate`)
    to `url`, each `tokens` long at the model's `gap_ms`; figures only."""
    from urllib.parse import urlsplit

    from services.client.openai_stream import chat_body

    target = urlsplit(url)
    body = chat_body("load", max_tokens=tokens, prefill_ms=10, token_gap_ms=gap_ms,
                     answer_tokens=tokens, heartbeat_s=heartbeat_s)
    result = asyncio.run(run_load(target.hostname or "127.0.0.1", target.port or 80,
                                  target.path or "/v1/chat/completions", body,
                                  streams=0 if rate else streams, rate=rate,
                                  duration_s=duration_s))
    if result.completed == 0 and result.errors and all(
            key.startswith("connect") for key in result.errors):
        # Nothing to measure: the target is not there (exit 3), not a run
        # whose figures happen to be empty.
        raise TargetUnreachable(f"{url} does not answer: no stream connected "
                                f"({', '.join(f'{k}: {v}' for k, v in result.errors.items())})")
    return result.report(variant=f"{rate:g}/s for {duration_s:g} s" if rate
                         else f"{streams} at once")
