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

It reports its own CPU (the process's, read from the kernel around the run)
beside what it measured, so a reader can see that it was not the limit.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from streamlab.bench.probes import CpuMeter, cpu_ms
from streamlab.bench.stats import percentile

# What every token event of the OpenAI route carries and nothing else does
# (the finish event's delta is empty): counted, never parsed.
TOKEN_MARK = b'"content":'
DONE_MARK = b"[DONE]"
# Bytes kept from one read for the next: a mark split across two reads is seen
# whole in the second, and a whole token mark never twice (DONE_MARK is shorter
# than the carry, and seeing it twice is harmless).
_TAIL = len(TOKEN_MARK) - 1


class _Stream(asyncio.Protocol):
    """One request on its own connection; `done` resolves when it ends."""

    def __init__(self, request: bytes, started: float) -> None:
        self._request = request
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
            try:
                self.status = int(head.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
            if self.status != 200:
                self.error = f"HTTP {self.status}"
                self._close()
                return
        # The carry: a mark split across two reads is counted in the second.
        window = self._carry + data
        count = window.count(TOKEN_MARK)
        if count:
            self.arrivals.append((now, count))
            self.tokens += count
        if DONE_MARK in window:
            self.finished = True
            self._close()
            return
        self._carry = window[-_TAIL:]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished and not self.error:
            self.error = f"closed: {exc}" if exc else "closed before [DONE]"
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

    @property
    def client_us_per_token(self) -> float | None:
        if self.client_cpu_ms is None or not self.tokens:
            return None
        return self.client_cpu_ms * 1000 / self.tokens

    def as_json(self) -> dict[str, Any]:
        return {"streams": self.streams, "completed": self.completed, "errors": self.errors,
                "tokens": self.tokens, "wall_s": round(self.wall_s, 3),
                "ttft_ms": self.ttft_ms, "icl_ms": self.icl_ms,
                "client_cpu_ms": self.client_cpu_ms,
                "client_us_per_token": self.client_us_per_token}


def http_request(host: str, port: int, path: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            "Accept-Encoding: identity\r\nConnection: close\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


async def run_load(host: str, port: int, path: str, body: dict[str, Any], *,
                   streams: int = 0, ramp_s: float = 0.5, rate: float = 0.0,
                   duration_s: float = 0.0, timeout_s: float = 120.0,
                   seed: int = 1) -> LoadResult:
    """`streams` at once, their starts spread evenly over `ramp_s` (a burst of
    thousands of connects is the kernel's accept queue's test, not the relay's);
    or, with `rate`, Poisson arrivals at `rate` per second for `duration_s`."""
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
    opened: list[_Stream] = []
    failures: dict[str, int] = {}

    async def one(offset: float) -> None:
        await asyncio.sleep(max(0.0, begin + offset - loop.time()))
        stream = _Stream(request, time.monotonic())
        try:
            await loop.create_connection(lambda: stream, host, port)
        except OSError as exc:
            key = f"connect: {exc.strerror or exc}"
            failures[key] = failures.get(key, 0) + 1
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
    return summarize(opened, failures, len(offsets), wall_s, cpu_ms(cpu_before, cpu_after))


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
    result.ttft_ms = _quantiles(ttfts)
    result.icl_ms = _quantiles(gaps)
    return result


def _quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"p{q}": round(percentile(values, q), 2) for q in (50, 90, 99)}
