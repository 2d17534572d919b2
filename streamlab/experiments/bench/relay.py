"""`streamlab bench relay`: what each hop and the gateway itself add to a stream.

Paths, side by side in one run, each at concurrency 1 (streams one after
another) and at concurrency C (C streams at once):

    grpc          client ─gRPC─▶ engine                        (the floor for latency)
    grpc via hop  client ─gRPC─▶ engine hop (Toxiproxy) ─▶ engine  (what the gateway reads)
    gateway       client ─▶ gateway ─gRPC─▶ engine hop ─▶ engine
    via nginx     client ─▶ nginx ─▶ gateway ─▶ ...
    full chain    client ─▶ edge ─▶ nginx ─▶ upstream ─▶ gateway ─▶ ...  (no toxics)
    floor         client ─▶ bare asyncio relay ─▶ engine hop ─▶ engine  (the floor for CPU)
    naive         client ─▶ textbook StreamingResponse relay ─▶ engine hop ─▶ engine

Server CPU per 1,000 tokens is read from the relay process (gateway, floor or
naive) around each cell. Then one load cell: the full chain with the engine at
a 20 ms gap and 100 concurrent streams, for the inter-chunk target. The
report judges the figures against its targets (checks); it asserts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc
import httpx

from services.client.grpc_stream import generate_request, grpc_generate
from services.client.openai_stream import chat_body, sse_chat
from services.client.transport_run import TransportRun
from streamlab.experiments.bench.probes import CpuMeter, cpu_ms
from streamlab.experiments.bench.stats import percentile
from streamlab.experiments.bench.transports import PROMPT
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge
from streamlab.experiments.timing import Timing
from streamlab.lab import processes
from streamlab.lab.processes import ServiceSpec
from streamlab.lab.target import LabTarget, pid_or_none
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

# The relay's targets (docs/benchmarks.md, "Relay overhead").
TARGET_TTFT_ADDED_MS = 3.0
TARGET_CPU_VS_FLOOR = 3.0
TARGET_NAIVE_VS_GATEWAY = 2.0
TARGET_ICL_P50_MS = (19.0, 21.0)
TARGET_ICL_P99_MS = 30.0


@dataclass(frozen=True)
class RelayPath:
    name: str
    kind: str  # "grpc" or "sse"
    address: str  # host:port for gRPC, base URL for SSE
    server: str  # whose CPU counts: "gateway", "floor", "naive" or "engine"


@dataclass
class Cell:
    path: str
    concurrency: int
    streams: int
    gap_ms: int
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    ttft_ms: dict[str, float] = field(default_factory=dict)
    icl_ms: dict[str, float] = field(default_factory=dict)
    tokens: int = 0
    wall_s: float = 0.0
    server: str = ""
    server_cpu_ms: float | None = None
    engine_cpu_ms: float | None = None
    client_cpu_ms: float = 0.0

    @property
    def server_cpu_per_1k(self) -> float | None:
        if self.server_cpu_ms is None or not self.tokens:
            return None
        return self.server_cpu_ms * 1000 / self.tokens


@dataclass
class RelayRun:
    """What one run of the bench measured (`report` judges it)."""

    timing: Timing
    cells: list[Cell]
    started_at: str = ""
    machine: Figures = field(default_factory=dict)


@contextlib.contextmanager
def reference_servers(engine_hop: str, log_dir: Path) -> Iterator[dict[str, tuple[str, int]]]:
    """Start the floor and naive relays on free ports; always stop them."""
    started: dict[str, processes.Running] = {}
    urls: dict[str, tuple[str, int]] = {}
    try:
        for name in ("floor", "naive"):
            [port] = processes.free_ports(1)
            url = f"http://127.0.0.1:{port}"
            spec = ServiceSpec(
                f"bench-{name}",
                [sys.executable, "-m", f"streamlab.experiments.bench.servers.{name}",
                 "--port", str(port), "--engine", engine_hop],
                ready=_healthy(url))
            running = processes.start(spec, log_dir)
            started[name] = running
            processes.wait_ready(running)
            urls[name] = (url, running.pid)
        yield urls
    finally:
        for running in started.values():
            processes.stop(running, grace_s=3.0)


def lab_paths(lab: LabTarget, refs: dict[str, tuple[str, int]]
              ) -> tuple[list[RelayPath], dict[str, int | None]]:
    """The six paths of the comparison, and the pid whose CPU each one charges."""
    paths = [
        RelayPath("grpc", "grpc", lab.engine_target, "engine"),
        RelayPath("grpc via hop", "grpc", lab.engine_hop, "engine"),
        RelayPath("gateway", "sse", lab.gateway_url, "gateway"),
        RelayPath("via nginx", "sse", lab.nginx_url, "gateway"),
        RelayPath("full chain", "sse", lab.edge_url, "gateway"),
        RelayPath("floor", "sse", refs["floor"][0], "floor"),
        RelayPath("naive", "sse", refs["naive"][0], "naive"),
    ]
    pids = {"gateway": pid_or_none(lab, "gateway"), "engine": pid_or_none(lab, "engine"),
            "floor": refs["floor"][1], "naive": refs["naive"][1]}
    return paths, pids


def _healthy(url: str) -> Callable[[], bool]:
    return lambda: httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200


async def _stream(path: RelayPath, timing: Timing, http: httpx.AsyncClient | None,
                  stub: pb_grpc.EngineServiceStub | None) -> TransportRun:
    options = timing.fake_model()
    if path.kind == "grpc":
        assert stub is not None
        request = generate_request(PROMPT, request_id=f"relay-{uuid.uuid4().hex[:12]}",
                                   **options)
        return await grpc_generate(stub, request)
    assert http is not None
    return await sse_chat(http, f"{path.address}/v1/chat/completions",
                          chat_body(PROMPT, **options))


@dataclass
class _Session:
    """One path's client side and running totals within a concurrency level."""

    path: RelayPath
    cell: Cell
    http: httpx.AsyncClient
    stub: pb_grpc.EngineServiceStub | None = None
    runs: list[TransportRun] = field(default_factory=list)


async def _run_level(paths: list[RelayPath], timing: Timing, concurrency: int, rounds: int,
                     pids: dict[str, int | None], on_wave: Callable[[str], None]
                     ) -> list[Cell]:
    """`rounds` waves of `concurrency` streams per path, the paths interleaved
    wave by wave: load from the rest of the machine drifts over seconds, and
    interleaving spreads it over every path instead of landing on one."""
    sessions: list[_Session] = []
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency)
    async with contextlib.AsyncExitStack() as stack:
        for path in paths:
            # identity: nginx would gzip for clients that accept it; this measures relaying.
            http = await stack.enter_async_context(httpx.AsyncClient(
                timeout=httpx.Timeout(60.0, connect=10.0), limits=limits,
                headers={"Accept-Encoding": "identity"}))
            session = _Session(path, Cell(path.name, concurrency, 0, timing.gap_ms,
                                          server=path.server, server_cpu_ms=0.0,
                                          engine_cpu_ms=0.0), http)
            if path.kind == "grpc":
                channel = await stack.enter_async_context(grpc.aio.insecure_channel(path.address))
                session.stub = pb_grpc.EngineServiceStub(channel)
            # Warm connections: a stream's first request pays the TCP (and HTTP/2) set-up.
            warm = replace(timing, gap_ms=1, tokens=2)
            await asyncio.gather(*(_stream(path, warm, http, session.stub)
                                   for _ in range(min(concurrency, 16))))
            sessions.append(session)
        for round_no in range(rounds):
            for session in sessions:
                on_wave(f"{session.path.name} × {concurrency} ({round_no + 1}/{rounds})")
                await _wave(session, timing, concurrency, pids)
    return [_summarise(s, timing) for s in sessions]


async def _wave(session: _Session, timing: Timing, concurrency: int,
                pids: dict[str, int | None]) -> None:
    cell = session.cell
    server, engine = CpuMeter(pids.get(session.path.server)), CpuMeter(pids.get("engine"))
    s0, e0, c0, t0 = server.read(), engine.read(), time.process_time(), time.perf_counter()
    session.runs += await asyncio.gather(*(_stream(session.path, timing, session.http,
                                                   session.stub)
                                           for _ in range(concurrency)))
    s1, e1 = server.read(), engine.read()
    cell.client_cpu_ms += (time.process_time() - c0) * 1000
    cell.wall_s += time.perf_counter() - t0
    cell.streams += concurrency
    for total, delta in (("server_cpu_ms", cpu_ms(s0, s1)), ("engine_cpu_ms", cpu_ms(e0, e1))):
        current = getattr(cell, total)
        setattr(cell, total, None if current is None or delta is None else current + delta)


def _summarise(session: _Session, timing: Timing) -> Cell:
    cell, runs = session.cell, session.runs
    if cell.server == "engine":
        cell.server_cpu_ms = None
    ok = [r for r in runs if r.done and len(r.texts) == timing.tokens]
    cell.completed = len(ok)
    cell.errors = sorted({r.error or "incomplete" for r in runs if r not in ok})
    cell.tokens = sum(len(r.texts) for r in runs)
    ttft = [r.ttft_s * 1000 for r in ok if r.ttft_s is not None]
    icl = [gap * 1000 for r in ok for gap in r.inter_chunk_s]
    cell.ttft_ms = {f"p{q}": percentile(ttft, q) for q in (50, 90, 99)}
    cell.icl_ms = {f"p{q}": percentile(icl, q) for q in (50, 90, 99)}
    return cell


def relay_steps(paths: list[RelayPath], concurrencies: list[int], streams_c1: int,
                load: object) -> int:
    """How many waves `run_relay` runs (for a progress bar)."""
    return sum((streams_c1 if c == 1 else 1) * len(paths) for c in concurrencies) + (
        1 if load is not None else 0)


def run_relay(
    paths: list[RelayPath],
    pids: dict[str, int | None],
    timing: Timing,
    concurrencies: list[int],
    streams_c1: int,
    load: tuple[RelayPath, int, int, int] | None,
    on_cell: Callable[[str], None] = lambda label: None,
) -> Report:
    """`load` is (path, concurrency, gap_ms, tokens) for the inter-chunk cell."""
    run = RelayRun(timing, [], started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   machine=machine())
    for concurrency in concurrencies:
        rounds = streams_c1 if concurrency == 1 else 1
        run.cells += asyncio.run(_run_level(paths, timing, concurrency, rounds, pids, on_cell))
    if load is not None:
        path, concurrency, gap_ms, tokens = load
        load_timing = replace(timing, gap_ms=gap_ms, tokens=tokens)
        run.cells += asyncio.run(_run_level([path], load_timing, concurrency, 1, pids,
                                            lambda label: on_cell(f"{label} @ {gap_ms} ms")))
    return report(run, concurrencies, load)


def machine() -> Figures:
    """What the figures were measured on (others share the machine: the load says
    how much they did)."""
    return {"python": platform.python_version(), "cpus": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "load_average_1m": os.getloadavg()[0]}


def bench_relay(lab: LabTarget, log_dir: Path, timing: Timing, concurrencies: list[int],
                streams_c1: int, load_cell: tuple[int, int, int] | None, only: set[str],
                on_steps: Callable[[int], None], on_cell: Callable[[str], None]) -> Report:
    """`streamlab bench relay`: the reference relays started beside the lab, the
    paths (`only` these, when given) measured, the report judged. `load_cell` is
    (streams, gap_ms, tokens) of the inter-chunk cell through the full chain;
    `on_steps` hears how many waves there will be."""
    with reference_servers(lab.engine_hop, log_dir) as refs:
        paths, pids = lab_paths(lab, refs)
        chain = next(p for p in paths if p.name == "full chain")
        if only:
            paths = [p for p in paths if p.name in only]
        load = (chain, *load_cell) if load_cell else None
        on_steps(relay_steps(paths, concurrencies, streams_c1, load))
        return run_relay(paths, pids, timing, concurrencies, streams_c1, load, on_cell)


def _find(cells: list[Cell], path: str, concurrency: int, gap_ms: int | None = None
          ) -> Cell | None:
    for cell in cells:
        if cell.path == path and cell.concurrency == concurrency and (
                gap_ms is None or cell.gap_ms == gap_ms):
            return cell
    return None


def target_figures(cells: list[Cell], concurrencies: list[int],
                   load: tuple[RelayPath, int, int, int] | None) -> Figures:
    """The figures the targets are about; a figure whose cells were not run
    (`--paths`, no load cell) is left out, and so is its check."""
    out: Figures = {}
    grpc_c1, chain_c1 = _find(cells, "grpc", 1), _find(cells, "full chain", 1)
    if grpc_c1 and chain_c1:
        out["ttft_added_ms"] = round(chain_c1.ttft_ms["p50"] - grpc_c1.ttft_ms["p50"], 2)
    busiest = max(concurrencies)
    gateway, floor, naive = (_find(cells, name, busiest) for name in ("gateway", "floor", "naive"))
    gw_k = gateway.server_cpu_per_1k if gateway else None
    floor_k = floor.server_cpu_per_1k if floor else None
    naive_k = naive.server_cpu_per_1k if naive else None
    if gw_k and floor_k:
        out["gateway_cpu_vs_floor"] = round(gw_k / floor_k, 2)
    if gw_k and naive_k:
        out["naive_cpu_vs_gateway"] = round(naive_k / gw_k, 2)
    if load is not None:
        path, concurrency, gap_ms, _ = load
        cell = _find(cells, path.name, concurrency, gap_ms)
        if cell is not None:
            out["load_icl_p50_ms"] = round(cell.icl_ms["p50"], 2)
            out["load_icl_p99_ms"] = round(cell.icl_ms["p99"], 2)
    return out


def targets(concurrencies: list[int], load: tuple[RelayPath, int, int, int] | None
            ) -> tuple[Check, ...]:
    """The relay's targets (docs/benchmarks.md, "Relay overhead") as checks."""
    busiest = max(concurrencies)
    checks = [
        Check("ttft_added_ms", "<=", TARGET_TTFT_ADDED_MS,
              "the full chain adds at most 3 ms of TTFT p50 over gRPC (c=1)"),
        Check("gateway_cpu_vs_floor", "<=", TARGET_CPU_VS_FLOOR,
              f"the gateway's CPU per 1k tokens within 3x the bare relay's (c={busiest})"),
        Check("naive_cpu_vs_gateway", ">=", TARGET_NAIVE_VS_GATEWAY,
              f"the textbook relay costs at least 2x the gateway's CPU (c={busiest})"),
    ]
    if load is not None:
        path, concurrency, gap_ms, _ = load
        where = f"{concurrency} streams, {gap_ms} ms gap, {path.name}"
        low, high = TARGET_ICL_P50_MS
        checks += [Check("load_icl_p50_ms", ">=", low, f"inter-chunk p50 in 20 ± 1 ms ({where})"),
                   Check("load_icl_p50_ms", "<=", high, f"inter-chunk p50 in 20 ± 1 ms ({where})"),
                   Check("load_icl_p99_ms", "<=", TARGET_ICL_P99_MS,
                         f"inter-chunk p99 at most 30 ms ({where})")]
    return tuple(checks)


RELAY_COLUMNS = ("path", "conc.", "streams", "ok", "TTFT p50", "p90", "p99", "ICL p50",
                 "ICL p99", "relay CPU ms/1k tok", "relay", "engine CPU ms/1k tok",
                 "client CPU ms")


def _ms(value: float | None, digits: int = 1) -> float | None:
    return None if value is None or math.isnan(value) else round(value, digits)


def cell_label(cell: Cell, timing: Timing) -> str:
    return f"{cell.path} × {cell.concurrency}" + (
        f" @ {cell.gap_ms} ms" if cell.gap_ms != timing.gap_ms else "")


def cell_report(cell: Cell, timing: Timing) -> Report:
    figures: Figures = {
        "path": cell.path, "concurrency": cell.concurrency, "streams": cell.streams,
        "gap_ms": cell.gap_ms, "completed": cell.completed, "errors": ", ".join(cell.errors),
        "tokens": cell.tokens, "wall_s": round(cell.wall_s, 3), "server": cell.server,
        **{f"ttft_ms_{q}": _ms(v, 2) for q, v in cell.ttft_ms.items()},
        **{f"icl_ms_{q}": _ms(v, 2) for q, v in cell.icl_ms.items()},
        "server_cpu_ms": _ms(cell.server_cpu_ms),
        "server_cpu_per_1k_tokens_ms": _ms(cell.server_cpu_per_1k),
        "engine_cpu_ms": _ms(cell.engine_cpu_ms),
        "client_cpu_ms": _ms(cell.client_cpu_ms)}
    return Report("bench relay", cell_label(cell, timing), figures=figures)


def _row(cell: Cell, timing: Timing) -> tuple[Figure, ...]:
    engine_k = (cell.engine_cpu_ms * 1000 / cell.tokens
                if cell.engine_cpu_ms is not None and cell.tokens else None)
    relay = cell.server_cpu_per_1k if cell.server != "engine" else None
    return (cell.path + (f" @ {cell.gap_ms} ms" if cell.gap_ms != timing.gap_ms else ""),
            cell.concurrency, cell.streams, cell.completed, _ms(cell.ttft_ms["p50"]),
            _ms(cell.ttft_ms["p90"]), _ms(cell.ttft_ms["p99"]), _ms(cell.icl_ms["p50"]),
            _ms(cell.icl_ms["p99"]), _ms(relay, 0), "" if cell.server == "engine" else cell.server,
            _ms(engine_k, 0), _ms(cell.client_cpu_ms, 0))


def report(run: RelayRun, concurrencies: list[int],
           load: tuple[RelayPath, int, int, int] | None) -> Report:
    """The relay bench as the one Report: its target figures judged, a part and a
    row per cell."""
    measured = target_figures(run.cells, concurrencies, load)
    figures: Figures = {"tokens": run.timing.tokens, "gap_ms": run.timing.gap_ms,
                        "prefill_ms": run.timing.prefill_ms, "started_at": run.started_at,
                        **run.machine, **measured}
    # A target whose cells were not run is not judged (nor shown failing).
    checks = [c for c in targets(concurrencies, load) if c.figure in measured]
    cells = Table("cells", RELAY_COLUMNS, tuple(_row(c, run.timing) for c in run.cells),
                  caption=f"Relay overhead · {run.timing.tokens} tokens, {run.timing.gap_ms} ms "
                          "apart · times in ms")
    return Report("bench relay", story="what each hop and the gateway itself add to a stream",
                  figures=figures, checks=judge(checks, figures, run.timing), tables=(cells,),
                  parts=tuple(cell_report(c, run.timing) for c in run.cells))
