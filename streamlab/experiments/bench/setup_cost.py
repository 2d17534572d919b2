"""`streamlab bench setup`: what the lab's own processes spend to set a stream up,
and what a paced token costs them, as CPU per stream and per token.

    idle      each process's CPU over a quiet spell (keepalive pings, timers,
              metrics threads): a rate, subtracted from every cell below
    set-up    N short streams (default 1,000 two-token streams, evenly spaced
              at 100 a second, in waves of half a second's worth) through the
              full chain: (CPU - idle) / streams, in ms, per process. Two tokens
              and no gap, so nearly all of it is the stream's set-up and
              teardown, not its tokens
    paced     S streams x T tokens at a 20 ms step: (CPU - idle - S x set-up)
              / tokens, in µs, per process (set-up taken out, so it is the
              per-token part alone)
    floor     the same N set-ups at the same rate between two bare grpc.aio
              processes on the engine's Session protocol (setup_floor.py):
              the least the engine, and the gateway's gRPC side, can spend per
              stream on this wire, on this machine, now

CPU is read from /proc/PID/task/*/schedstat around each cell (probes.CpuMeter),
for every process on the path: the gateway, the engine, Toxiproxy (both
processes summed: its three hops, edge, upstream and engine) and the edge proxy
(with its workers); the client is this process, on raw sockets (load.py), and
is reported beside them. Targets: set-up gateway <= 1.0 ms and engine <= 0.3 ms
per stream; judged as checks that can fail, figures never asserted (a missed
target is a finding, and the command exits 0 on it). The floor is printed
beside them, never judged: it says how much of a figure the transport alone
takes, so what is left to cut is the difference. The load average is
printed with the figures: on a shared machine, compare runs side by side.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from services.client.openai_stream import chat_body
from streamlab.experiments.bench.load import LoadResult, run_load
from streamlab.experiments.bench.probes import CpuReading, ProcessTreeMeter
from streamlab.experiments.bench.setup_floor import FloorRun, run_floor
from streamlab.experiments.bench.stats import rounded
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge
from streamlab.lab.target import Capability, LabTarget, pids_of, require
from streamlab.lab.topology import TOXIPROXY_PROCESSES

# Measured per process, in the order a request crosses them; "toxiproxy" is both
# Toxiproxy processes (every hop), "nginx" the edge proxy and its workers.
PROCESSES = ("toxiproxy", "nginx", "gateway", "engine")
# ms of CPU per stream set-up: the targets of the report that asked for this
# bench (it measured gateway 4.6 ms and engine 2.6 ms on main).
SETUP_TARGET_MS: Mapping[str, float] = {"gateway": 1.0, "engine": 0.3}
DEFAULT_STREAMS, DEFAULT_RATE = 1000, 100.0
DEFAULT_PACED = (60, 200, 20)  # streams, tokens, step ms (60: under the per-client cap of 64)
QUICK_STREAMS, QUICK_RATE, QUICK_PACED = 100, 50.0, (10, 50, 20)


@dataclass(frozen=True)
class CellCost:
    """One cell: its load (the client's view) and each process's CPU in ms,
    the idle rate times the cell's wall time already taken off."""

    load: LoadResult
    cpu_ms: dict[str, float | None]
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class SetupRun:
    streams: int
    rate: float
    setup: CellCost
    idle_ms_per_s: dict[str, float | None] = field(default_factory=dict)
    # (streams, tokens, step_ms) and its cell; None: not run.
    paced_shape: tuple[int, int, int] | None = None
    paced: CellCost | None = None
    # How the gateways reach the engines ("per_request" or "multiplexed"): the
    # engine's set-up differs by wire, so a figure names the one it was read on.
    engine_wire: str = ""
    # The bare gRPC floor of the same set-ups (None: not run).
    floor: FloorRun | None = None

    def floor_ms(self) -> dict[str, float | None]:
        """The floor per stream, ms, charged to the process it is the floor of."""
        if self.floor is None:
            return {}
        return {"engine": self.floor.server_ms, "gateway": self.floor.client_ms}

    def setup_ms(self) -> dict[str, float | None]:
        """CPU per stream set-up, ms, per process (and the client)."""
        done = self.setup.load.completed
        return {name: None if ms is None or not done else ms / done
                for name, ms in self._with_client(self.setup).items()}

    def paced_us(self) -> dict[str, float | None]:
        """CPU per paced token, µs, per process: the streams' own set-up taken off."""
        if self.paced is None or not self.paced.load.tokens:
            return {}
        per_stream = self.setup_ms()
        out: dict[str, float | None] = {}
        for name, ms in self._with_client(self.paced).items():
            setup = per_stream.get(name)
            if ms is None or setup is None:
                out[name] = None
                continue
            out[name] = (ms - setup * self.paced.load.completed) * 1000 / self.paced.load.tokens
        return out

    @staticmethod
    def _with_client(cell: CellCost) -> dict[str, float | None]:
        return {**cell.cpu_ms, "client": cell.load.client_cpu_ms}


def setup_report(run: SetupRun) -> Report:
    """The run as the one Report: figures (`setup_ms_<process>`,
    `paced_us_<process>`, `idle_ms_per_s_<process>`), the set-up targets as
    checks, and one table of rows measured / target / met."""
    setup, paced = run.setup_ms(), run.paced_us()
    figures: Figures = {
        "streams": run.streams, "rate_per_s": run.rate,
        "completed": run.setup.load.completed, "failed": run.setup.load.failed,
        "errors": run.setup.load.figures()["errors"],
        "ttft_ms_p50": run.setup.load.ttft_ms.get("p50"),
        "ttft_ms_p99": run.setup.load.ttft_ms.get("p99"),
        "loadavg_1m": round(run.setup.loadavg[0], 2),
        "engine_wire": run.engine_wire or None,
        **{f"setup_ms_{name}": rounded(ms, 3) for name, ms in setup.items()},
        **{f"idle_ms_per_s_{name}": rounded(ms, 2) for name, ms in run.idle_ms_per_s.items()},
    }
    floor = run.floor_ms()
    if run.floor is not None:
        figures.update({
            "floor_completed": run.floor.completed,
            "floor_messages_per_stream": run.floor.messages_per_stream,
            **{f"floor_ms_{name}": rounded(ms, 3) for name, ms in floor.items()}})
    if run.paced is not None and run.paced_shape is not None:
        streams, tokens, step_ms = run.paced_shape
        figures.update({
            "paced_streams": streams, "paced_tokens": tokens, "paced_step_ms": step_ms,
            "paced_completed": run.paced.load.completed,
            "paced_icl_ms_p99": run.paced.load.icl_ms.get("p99"),
            "paced_loadavg_1m": round(run.paced.loadavg[0], 2),
            **{f"paced_us_{name}": rounded(us, 1) for name, us in paced.items()}})
    checks = [Check("completed", "==", run.streams, "every set-up stream completes"),
              *(Check(f"setup_ms_{name}", "<=", target,
                      f"{name}: at most {target:g} ms of CPU per stream set-up")
                for name, target in SETUP_TARGET_MS.items())]
    if run.paced is not None and run.paced_shape is not None:
        checks.append(Check("paced_completed", "==", run.paced_shape[0],
                            "every paced stream completes"))
    results = judge(checks, figures)
    met = {r.check.figure: r.holds for r in results}
    rows: list[tuple[Figure, ...]] = []
    for name in (*PROCESSES, "client"):
        target = SETUP_TARGET_MS.get(name)
        rows.append((name, rounded(setup.get(name), 3), target,
                     None if target is None else met.get(f"setup_ms_{name}"),
                     rounded(floor.get(name), 3),
                     rounded(paced.get(name), 1) if paced else None,
                     rounded(run.idle_ms_per_s.get(name), 2)))
    caption = (f"{run.setup.load.completed}/{run.streams} two-token streams at "
               f"{run.rate:g}/s, load {run.setup.loadavg[0]:.2f}")
    if run.engine_wire:
        caption += f", engine wire {run.engine_wire}"
    if run.paced_shape is not None:
        streams, tokens, step_ms = run.paced_shape
        caption += f" · paced: {streams} streams x {tokens} tokens at {step_ms} ms"
    if run.floor is not None:
        messages = run.floor.messages_per_stream
        caption += (" · gRPC floor: bare grpc.aio server (engine) and client (gateway), "
                    f"{messages:g} message{'' if messages == 1 else 's'} a stream")
    table = Table("cost", ("process", "set-up ms/stream", "target ms", "met",
                           "gRPC floor ms", "paced µs/token", "idle ms/s"), tuple(rows),
                  caption=caption)
    return Report("bench setup", story="CPU each process spends per stream set-up and per "
                  "paced token, idle taken off", figures=figures, checks=results,
                  tables=(table,))


# Per process, per pid: its tree's readings.
Readings = dict[str, list[list[CpuReading | None]]]


class Meters:
    """Each measured process's CPU (summed over its pids and their children)."""

    def __init__(self, pids: Mapping[str, int]) -> None:
        groups: dict[str, list[int]] = {
            "gateway": [pids["gateway"]] if "gateway" in pids else [],
            "engine": [pids["engine"]] if "engine" in pids else [],
            "toxiproxy": [pids[p] for p in TOXIPROXY_PROCESSES if p in pids],
            "nginx": [pids["nginx"]] if "nginx" in pids else []}
        self._meters = {name: [ProcessTreeMeter(pid) for pid in group]
                        for name, group in groups.items()}

    def read(self) -> Readings:
        return {name: [meter.read() for meter in group] for name, group in self._meters.items()}

    def ms_between(self, before: Readings, after: Readings) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for name in self._meters:
            parts = [ProcessTreeMeter.ms_between(b, a)
                     for b, a in zip(before[name], after[name], strict=True)]
            known = [p for p in parts if p is not None]
            out[name] = sum(known) if known else None
        return out


def _minus_idle(cpu: dict[str, float | None], idle_ms_per_s: dict[str, float | None],
                wall_s: float) -> dict[str, float | None]:
    return {name: None if ms is None else ms - (idle_ms_per_s.get(name) or 0.0) * wall_s
            for name, ms in cpu.items()}


def _cell(meters: Meters, idle: dict[str, float | None], host: str, port: int,
          body: Mapping[str, object], streams: int, ramp_s: float, timeout_s: float
          ) -> CellCost:
    before, started = meters.read(), time.monotonic()
    load = asyncio.run(run_load(host, port, "/v1/chat/completions", body, streams=streams,
                                ramp_s=ramp_s, timeout_s=timeout_s))
    after, wall_s = meters.read(), time.monotonic() - started
    return CellCost(load, _minus_idle(meters.ms_between(before, after), idle, wall_s),
                    os.getloadavg())


WAVE_S = 0.5


def merge(waves: list[LoadResult]) -> LoadResult:
    """The waves as one result: counts summed; TTFT p50 the waves' median, p99
    their worst (each wave's own quantiles are all that is kept)."""
    out = LoadResult(streams=sum(w.streams for w in waves))
    for wave in waves:
        out.completed += wave.completed
        out.tokens += wave.tokens
        out.wall_s += wave.wall_s
        for key, count in wave.errors.items():
            out.errors[key] = out.errors.get(key, 0) + count
    cpu = [w.client_cpu_ms for w in waves]
    out.client_cpu_ms = None if any(c is None for c in cpu) else sum(c or 0.0 for c in cpu)
    p50s = sorted(w.ttft_ms["p50"] for w in waves if "p50" in w.ttft_ms)
    p99s = [w.ttft_ms["p99"] for w in waves if "p99" in w.ttft_ms]
    if p50s:
        out.ttft_ms = {"p50": p50s[len(p50s) // 2], "p99": max(p99s)}
    return out


def _setup_cell(meters: Meters, idle: dict[str, float | None], host: str, port: int,
                body: Mapping[str, object], streams: int, rate: float) -> CellCost:
    """`streams` in waves of half a second's worth at `rate`, each wave waited
    for: at most `rate / 2` streams open at once however slow the machine is, so
    a loaded machine slows the cell down instead of piling streams up past the
    gateway's per-client cap (refusals would cost CPU for no stream)."""
    per_wave = max(1, round(rate * WAVE_S))
    waves: list[LoadResult] = []
    before, started = meters.read(), time.monotonic()
    for first in range(0, streams, per_wave):
        count = min(per_wave, streams - first)
        waves.append(asyncio.run(run_load(
            host, port, "/v1/chat/completions", body, streams=count,
            ramp_s=count / rate, timeout_s=30)))
    after, wall_s = meters.read(), time.monotonic() - started
    return CellCost(merge(waves), _minus_idle(meters.ms_between(before, after), idle, wall_s),
                    os.getloadavg())


# Each process's CPU by pid.
NEEDS = frozenset({Capability.PIDS})


def run_setup(lab: LabTarget, *, streams: int = DEFAULT_STREAMS, rate: float = DEFAULT_RATE,
              paced: tuple[int, int, int] | None = DEFAULT_PACED, idle_s: float = 3.0,
              floor_logs: Path | None = None,
              on_step: Callable[[str], None] = lambda step: None) -> SetupRun:
    """Idle, then the set-up cell, then the gRPC floor's (its processes log to
    `floor_logs`; None skips it), then the paced cell (unless `paced` is None)."""
    require(lab, NEEDS, "bench setup reads each process's CPU by pid")
    meters = Meters(pids_of(lab, "bench setup reads each process's CPU"))
    edge = urlsplit(lab.edge_url)
    host, port = edge.hostname or "127.0.0.1", edge.port or 80
    short = chat_body("setup", max_tokens=2, prefill_ms=0, token_gap_ms=0, answer_tokens=2,
                      heartbeat_s=0)
    on_step("warming up")
    # Unrecorded: the first streams after a start open channels and warm caches.
    asyncio.run(run_load(host, port, "/v1/chat/completions", short, streams=20, ramp_s=0.2,
                         timeout_s=30))
    on_step(f"idle baseline ({idle_s:g} s)")
    # The quiet spell is the measurement itself (the idle rate), not a wait for something.
    before, started = meters.read(), time.monotonic()
    time.sleep(idle_s)
    idle_ms = meters.ms_between(before, meters.read())
    elapsed = time.monotonic() - started
    idle = {name: None if ms is None else ms / elapsed for name, ms in idle_ms.items()}
    # The client is this process: idle it is asleep, so no rate to take off.
    idle["client"] = 0.0
    on_step(f"set-up: {streams} streams at {rate:g}/s")
    setup = _setup_cell(meters, idle, host, port, short, streams, rate)
    floor = None
    if floor_logs is not None:
        on_step(f"gRPC floor: {streams} bare set-ups at {rate:g}/s")
        floor = run_floor(streams, rate, floor_logs)
    paced_cell = None
    if paced is not None:
        count, tokens, step_ms = paced
        on_step(f"paced: {count} streams x {tokens} tokens at {step_ms} ms")
        body = chat_body("paced", max_tokens=tokens, prefill_ms=10, token_gap_ms=step_ms,
                         answer_tokens=tokens, heartbeat_s=0)
        paced_cell = _cell(meters, idle, host, port, body, count, 0.5,
                           timeout_s=30 + tokens * step_ms / 1000 * 4)
    return SetupRun(streams, rate, setup, idle, paced, paced_cell,
                    lab.options.gateway_settings().engine_wire, floor)


def bench_setup(lab: LabTarget, *, streams: int = DEFAULT_STREAMS, rate: float = DEFAULT_RATE,
                paced: tuple[int, int, int] | None = DEFAULT_PACED, idle_s: float = 3.0,
                floor_logs: Path | None = None,
                on_step: Callable[[str], None] = lambda step: None) -> Report:
    """`streamlab bench setup`: run_setup, as the one Report."""
    return setup_report(run_setup(lab, streams=streams, rate=rate, paced=paced,
                                  idle_s=idle_s, floor_logs=floor_logs, on_step=on_step))
