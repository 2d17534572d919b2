"""`streamlab bench transports`: every transport side by side, on the real topology.

Every transport gets the same fake-model timing (50 tokens, 50 ms apart, no
real prefill) and runs one at a time, N times, through the edge
(gRPC, which browsers cannot speak, through the engine hop instead). Around
each run the bench reads the wire bytes on that proxy and the CPU of the
gateway and engine processes, so the table's bytes and CPU are the system's,
not the client's own count.

The fake model's prefill is 1 ms, not 0: on the gRPC wire 0 means "engine
default" (300 ms), so 1 ms is the closest to "the first token after one
gap".

SSE runs over three wires (docs/http2.md): HTTP/1.1 in the clear through
"edge", and HTTP/1.1 or HTTP/2 over TLS through "edge-h2" (the same nginx
server, ALPN picks the protocol), each read by httpx and by curl, so bytes per
token compare chunked encoding with HTTP/2's DATA frames and HPACK, TLS alike.
nginx's CPU is its worker processes' (the master only supervises).
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
import psutil

from services.client.grpc_stream import generate_request, grpc_once
from services.client.openai_stream import chat_body, sse_chat
from services.client.polling import long_poll, short_poll
from services.client.transport_run import TransportRun
from services.client.ws_stream import ws_chat
from services.engine.backends.fake import token_text
from streamlab.experiments.bench.probes import CpuMeter, CpuReading, WireMeter, cpu_ms
from streamlab.experiments.bench.stats import summary
from streamlab.experiments.report import Figure, Figures, Report, Table
from streamlab.experiments.timing import Timing
from streamlab.lab.target import LabTarget, pid_or_none

PROMPT = "tell me about streaming"
# The model's pace: 50 tokens, 50 ms apart, first token after one gap.
BENCH_TIMING = Timing(prefill_ms=1, gap_ms=50, tokens=50)


@dataclass
class Sample:
    """One run of one transport, with what it cost outside the client."""

    ttft_ms: float | None
    total_ms: float
    requests: int
    tokens: int
    bytes_up: int
    bytes_down: int
    gateway_cpu_ms: float | None
    engine_cpu_ms: float | None
    token_times_ms: list[float]
    done: bool
    error: str | None
    in_order: bool
    nginx_cpu_ms: float | None = None

    @property
    def bytes_per_token(self) -> float | None:
        return (self.bytes_up + self.bytes_down) / self.tokens if self.tokens else None

    @property
    def cpu_us_per_token(self) -> float | None:
        if self.gateway_cpu_ms is None or not self.tokens:
            return None
        return self.gateway_cpu_ms * 1000 / self.tokens

    @property
    def nginx_cpu_us_per_token(self) -> float | None:
        if self.nginx_cpu_ms is None or not self.tokens:
            return None
        return self.nginx_cpu_ms * 1000 / self.tokens


@dataclass
class TransportResult:
    name: str
    proxy: str
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict[str, dict[str, float | None]]:
        s = self.samples
        return {
            "ttft_ms": summary([x.ttft_ms for x in s]),
            "total_ms": summary([x.total_ms for x in s]),
            "requests": summary([x.requests for x in s]),
            "tokens": summary([x.tokens for x in s]),
            "bytes_up": summary([x.bytes_up for x in s]),
            "bytes_down": summary([x.bytes_down for x in s]),
            "bytes_per_token": summary([x.bytes_per_token for x in s]),
            "gateway_cpu_ms": summary([x.gateway_cpu_ms for x in s]),
            "engine_cpu_ms": summary([x.engine_cpu_ms for x in s]),
            "cpu_us_per_token": summary([x.cpu_us_per_token for x in s]),
            "nginx_cpu_ms": summary([x.nginx_cpu_ms for x in s]),
            "nginx_cpu_us_per_token": summary([x.nginx_cpu_us_per_token for x in s]),
        }


@dataclass
class TransportsRun:
    """What one run of the bench measured (`report` turns it into the one Report)."""

    timing: Timing
    repetitions: int
    transports: list[TransportResult]
    gzip: bool = False
    started_at: str = ""
    machine: Figures = field(default_factory=dict)


TRANSPORT_COLUMNS = ("transport", "TTFT ms", "±", "total ms", "±", "requests", "tokens",
                     "bytes up", "bytes down", "B/token", "gw CPU ms", "CPU µs/token",
                     "nginx µs/token", "failed")
# The median run's arrival time of each token, per lane ("model": the model's own).
ARRIVAL_COLUMNS = ("lane", "token", "ms")


def _half_spread(stat: dict[str, float | None]) -> float | None:
    low, high = stat["min"], stat["max"]
    return None if low is None or high is None or high <= low else round((high - low) / 2, 1)


def _median(stat: dict[str, float | None], digits: int = 1) -> float | None:
    value = stat["median"]
    return None if value is None else round(value, digits)


def _transport_row(t: TransportResult) -> tuple[Figure, ...]:
    s = t.summary()
    failed = sum(1 for x in t.samples if not x.done or not x.in_order)
    return (t.name, _median(s["ttft_ms"], 0), _half_spread(s["ttft_ms"]),
            _median(s["total_ms"], 0), _half_spread(s["total_ms"]), _median(s["requests"], 0),
            _median(s["tokens"], 0), _median(s["bytes_up"], 0), _median(s["bytes_down"], 0),
            _median(s["bytes_per_token"], 0), _median(s["gateway_cpu_ms"]),
            _median(s["cpu_us_per_token"], 0), _median(s["nginx_cpu_us_per_token"], 0), failed)


def _run_figures(x: Sample) -> Figures:
    return {"ttft_ms": x.ttft_ms, "total_ms": x.total_ms, "requests": x.requests,
            "tokens": x.tokens, "bytes_up": x.bytes_up, "bytes_down": x.bytes_down,
            "bytes_per_token": x.bytes_per_token, "gateway_cpu_ms": x.gateway_cpu_ms,
            "engine_cpu_ms": x.engine_cpu_ms, "nginx_cpu_ms": x.nginx_cpu_ms,
            "cpu_us_per_token": x.cpu_us_per_token,
            "nginx_cpu_us_per_token": x.nginx_cpu_us_per_token, "done": x.done,
            "error": x.error, "in_order": x.in_order}


def _transport_part(t: TransportResult) -> Report:
    """One transport: its medians as figures, each run a part of its own."""
    figures: Figures = {"wire_proxy": t.proxy}
    for name, stat in t.summary().items():
        figures[f"{name}_median"] = stat["median"]
    runs = tuple(Report("bench transports", f"{t.name} · run {i + 1}", figures=_run_figures(x))
                 for i, x in enumerate(t.samples))
    return Report("bench transports", t.name, figures=figures, parts=runs)


def _median_run(t: TransportResult) -> Sample | None:
    done = sorted((x for x in t.samples if x.done), key=lambda x: x.total_ms)
    return done[len(done) // 2] if done else None


def report(run: TransportsRun) -> Report:
    """Every transport side by side: a row and a part each; the median run's token
    arrivals (a table) for the timeline plot."""
    timing = run.timing
    figures: Figures = {"tokens": timing.tokens, "gap_ms": timing.gap_ms,
                        "prefill_ms": timing.prefill_ms, "repetitions": run.repetitions,
                        "gzip": run.gzip, "started_at": run.started_at, **run.machine}
    arrivals: list[tuple[Figure, ...]] = [
        ("model", i, round(t * 1000, 2)) for i, t in enumerate(timing.model_token_times_s())]
    for t in run.transports:
        median = _median_run(t)
        arrivals += [(t.name, i, round(ms, 2))
                     for i, ms in enumerate(median.token_times_ms if median else [])]
    costs = Table(
        "transports", TRANSPORT_COLUMNS, tuple(_transport_row(t) for t in run.transports),
        caption=f"{timing.tokens} tokens, {timing.gap_ms} ms apart · median of "
                f"{run.repetitions} (± half the range)" + (" · gzip" if run.gzip else "")
                + " · bytes: Toxiproxy's count on the edge proxy (TLS rows: edge-h2; gRPC: "
                  "the engine proxy); CPU: the gateway process, nginx's workers (kernel "
                  "accounting). Absolute times vary by machine.")
    return Report("bench transports", story="every transport side by side, same model",
                  figures=figures,
                  tables=(costs, Table("arrivals", ARRIVAL_COLUMNS, tuple(arrivals),
                                       caption="the median run's token arrivals, ms since "
                                               "the request")),
                  parts=tuple(_transport_part(t) for t in run.transports))


# SSE over each wire: (client, HTTP version, TLS). "sse" is httpx over HTTP/1.1 in the clear.
SSE_WIRES: dict[str, tuple[str, str, bool]] = {
    "sse": ("httpx", "1.1", False),
    "sse h1 tls": ("httpx", "1.1", True),
    "sse h2": ("httpx", "2", True),
    "curl h1": ("curl", "1.1", False),
    "curl h2": ("curl", "2", True),
}


def transport_names(intervals_ms: list[int], h2: bool = True) -> list[str]:
    """Every transport, in the table's order; `h2`: with the TLS rows (edge-h2)."""
    sse = [name for name, (_, _, tls) in SSE_WIRES.items() if h2 or not tls]
    return ["grpc", *sse, "websocket", "long poll", *(f"poll {i} ms" for i in intervals_ms)]


def wire_proxy(name: str) -> str:
    """The Toxiproxy hop whose byte counters measure this transport."""
    if name == "grpc":
        return "engine"
    return "edge-h2" if name in SSE_WIRES and SSE_WIRES[name][2] else "edge"


async def curl_sse(url: str, body: Mapping[str, object], http_version: str, cacert: str | None,
                   gzip: bool) -> TransportRun:
    """curl -N (`--http1.1` or `--http2`), its output read line by line as it
    streams: TTFT includes starting curl (a few ms), as it does for a user."""
    run = TransportRun(f"curl h{http_version[0]}", requests=1)
    args = ["curl", "-sS", "-N", "--http2" if http_version == "2" else "--http1.1",
            "--max-time", "60", "-H", "content-type: application/json",
            "-d", json.dumps(body), *(["--cacert", cacert] if cacert else []),
            *(["--compressed"] if gzip else ["-H", "Accept-Encoding: identity"]), url]
    process = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    assert process.stderr is not None
    async with asyncio.timeout(70):
        while raw := await process.stdout.readline():  # b"" only at the end
            line = raw.decode().strip()
            if line == "data: [DONE]":
                run.done = True
            elif line.startswith("data: {"):
                delta = json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
                run.tokens([delta.get("content") or ""])
        stderr = (await process.stderr.read()).decode().strip()
        await process.wait()
    if process.returncode:
        run.error = f"curl exit {process.returncode}: {stderr}"
    return run.finish()


async def _one(name: str, lab: LabTarget, timing: Timing, gzip: bool) -> TransportRun:
    """One run of one transport on fresh connections (their set-up counts).

    Without `gzip` the HTTP clients ask for `identity`: nginx here compresses
    event streams and JSON for clients that accept it, and the table compares
    protocols (the WebSocket runs without compression too, as in the seed)."""
    options = timing.fake_model()
    # A long-poll read may be held up to the server's wait (30 s) plus a token gap.
    timeout = httpx.Timeout(60.0, connect=5.0)
    if name == "grpc":
        request = generate_request(PROMPT, request_id=f"bench-{uuid.uuid4().hex[:12]}",
                                   **options)
        return await grpc_once(lab.engine_hop, request)
    if name == "websocket":
        ws_url = lab.edge_url.replace("http://", "ws://", 1) + "/ws"
        return await ws_chat(ws_url, PROMPT, timing=options)
    body = chat_body(PROMPT, **options)
    headers = {} if gzip else {"Accept-Encoding": "identity"}
    if name in SSE_WIRES:
        client_name, http_version, tls = SSE_WIRES[name]
        base = lab.edge_h2_url if tls else lab.edge_url
        url = f"{base}/v1/chat/completions"
        if client_name == "curl":
            return await curl_sse(url, body, http_version,
                                  str(lab.tls.ca_cert) if tls else None, gzip)
        async with httpx.AsyncClient(
                timeout=timeout, headers=headers, http2=http_version == "2",
                verify=lab.tls.ssl_context() if tls else True) as client:
            run = await sse_chat(client, url, body)
        run.transport = name
        return run
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
        if name == "long poll":
            return await long_poll(client, lab.edge_url, body)
        if name.startswith("poll "):
            interval_s = float(name.split()[1]) / 1000
            return await short_poll(client, lab.edge_url, body, interval_s)
    raise ValueError(f"unknown transport {name!r}")


def measure(name: str, lab: LabTarget, timing: Timing, gzip: bool = False) -> Sample:
    """Run one transport once, reading wire bytes and CPU around it (CPU only
    where the lab has the `pids` capability; None otherwise)."""
    toxiproxy = lab.toxiproxy()
    try:
        wire = WireMeter(toxiproxy, wire_proxy(name))
        gateway = CpuMeter(pid_or_none(lab, "gateway"))
        engine = CpuMeter(pid_or_none(lab, "engine"))
        nginx = NginxCpu(pid_or_none(lab, "nginx"))
        wire_before = wire.settled()
        gw_before, en_before, ng_before = gateway.read(), engine.read(), nginx.read()
        run = asyncio.run(_one(name, lab, timing, gzip))
        gw_after, en_after, ng_after = gateway.read(), engine.read(), nginx.read()
        moved = wire.settled() - wire_before
    finally:
        toxiproxy.close()
    expected = [token_text(i) for i in range(timing.tokens)]
    return Sample(
        ttft_ms=None if run.ttft_s is None else run.ttft_s * 1000,
        total_ms=run.total_s * 1000,
        requests=run.requests,
        tokens=len(run.texts),
        bytes_up=moved.up,
        bytes_down=moved.down,
        gateway_cpu_ms=cpu_ms(gw_before, gw_after),
        engine_cpu_ms=cpu_ms(en_before, en_after),
        token_times_ms=[t * 1000 for t in run.token_times],
        done=run.done,
        error=run.error,
        in_order=run.texts == expected,
        nginx_cpu_ms=nginx.ms(ng_before, ng_after),
    )


class NginxCpu:
    """nginx's CPU: the sum over its master and workers (the workers do the work;
    a worker's time is not its master's until it exits)."""

    def __init__(self, master: int | None) -> None:
        pids = []
        if master:
            try:
                pids = [master, *(child.pid for child in psutil.Process(master).children())]
            except psutil.Error:
                pids = []
        self._meters = [CpuMeter(pid) for pid in pids]

    def read(self) -> list[CpuReading | None]:
        return [meter.read() for meter in self._meters]

    @staticmethod
    def ms(before: list[CpuReading | None], after: list[CpuReading | None]) -> float | None:
        spent = [cpu_ms(b, a) for b, a in zip(before, after, strict=True)]
        if not spent or any(s is None for s in spent):
            return None
        return sum(s for s in spent if s is not None)


def run_transports(
    lab: LabTarget,
    timing: Timing,
    repetitions: int,
    intervals_ms: list[int],
    gzip: bool = False,
    on_run: Callable[[str, int], None] = lambda name, rep: None,
) -> Report:
    """Interleave transports within each repetition, so a burst of load on the
    shared machine spreads over all of them instead of hitting one."""
    # A lab without the HTTP/2 edge (compose started without certificates): no TLS rows.
    names = transport_names(intervals_ms, h2=lab.h2_ready())
    results = {name: TransportResult(name, wire_proxy(name)) for name in names}
    run = TransportsRun(
        timing, repetitions, list(results.values()), gzip,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        machine={"python": platform.python_version(), "cpus": _cpus(),
                 "platform": platform.platform(),
                 # Others share the machine: the load says how much they did.
                 "load_average_1m": os.getloadavg()[0]},
    )
    # One unrecorded run each first: imports, first connections, JIT-free but
    # cold caches would otherwise land in repetition 1.
    for name in names:
        on_run(f"{name} (warm-up)", -1)
        measure(name, lab, timing, gzip)
    for rep in range(repetitions):
        for name in names:
            on_run(name, rep)
            results[name].samples.append(measure(name, lab, timing, gzip))
    return report(run)


def _cpus() -> int:
    return len(os.sched_getaffinity(0))
