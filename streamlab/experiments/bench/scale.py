"""`streamlab bench scale`: how many paced streams the full chain keeps on cadence,
and where each token's CPU goes.

    a) cadence   N streams at a 20 ms step through the full chain (client ─▶ edge
                 ─▶ nginx ─▶ upstream ─▶ gateway ─▶ engine hop ─▶ engine), or
                 entering at nginx or the gateway (`entry`), N swept
                 (10, 50, 100, 200, 400, ...) until inter-chunk p99 passes 30 ms;
                 the engine's batched clock and per-stream timers side by side,
                 interleaved N by N so that load from elsewhere lands on both
    b) CPU       µs of CPU per token for each process on the path, read from
                 /proc/PID/task/*/schedstat around each cell: the client (this
                 process: the raw-socket load generator), Toxiproxy (two processes:
                 "toxiproxy" with the edge hops, "toxiproxy-backend" with upstream
                 and engine), nginx (master and workers), gateway, engine
    c) slow      5,000 slow streams at once (streamlab/experiments/bench/scale_slow.py)
    d) set-up    CPU per stream set-up for each process, N two-token streams at
                 100/s (streamlab/experiments/bench/setup_cost.py, `bench setup`)
    e) storm     N resumable streams cut at once at the edge and restored (the
                 reconnect-storm scenario's measurement, on its private lab)
    f) cancel    cancel latency on both engine wires with 1,000 streams running
                 (streamlab/experiments/bench/cancel.py)
    g) tracing   set-up and paced-token CPU with tracing off, on (exported to the
                 lab's Jaeger) and sampled, side by side in rounds
                 (streamlab/experiments/bench/tracing_cost.py)
    targets      every target of the cells that ran, one table, measured /
                 target / met (streamlab/experiments/bench/targets.py)

The clock is the engine's setting (STREAMLAB_FAKE_CLOCK), so the bench restarts
the engine to switch it, and raises the engine's and gateway's stream caps to
the sweep's largest N (the defaults would refuse the load it means to
measure); every setting it changed is put back at the end. That needs a lab
this tool started (`streamlab up`): a compose lab's services are compose's.
Figures judged against the cadence target, never asserted; the load average
is printed with them.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from services.client.openai_stream import chat_body
from streamlab.experiments.bench.cancel import WIRES, bench_cancel_wires
from streamlab.experiments.bench.lab_settings import lab_settings
from streamlab.experiments.bench.load import LoadResult, SteadyWindow, run_load
from streamlab.experiments.bench.probes import PROCESSES, CpuMeter, CpuReading, ProcessTreeMeter
from streamlab.experiments.bench.scale_slow import run_slow
from streamlab.experiments.bench.setup_cost import run_setup, setup_report
from streamlab.experiments.bench.targets import Cells, targets_report
from streamlab.experiments.bench.tracing_cost import run_tracing_cost, tracing_report
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge
from streamlab.lab.target import Capability, LabTarget, pids_of, require

SWEEP = (10, 50, 100, 200, 400)
CLOCKS = ("batched", "per_stream")
TARGET_ICL_P99_MS = 30.0
TARGET_ICL_P50_MS = (19.0, 21.0)


def _per_token_us(cpu_ms: dict[str, float | None], tokens: int | None
                  ) -> dict[str, float | None]:
    """Each process's CPU (ms) over `tokens`, in µs a token (None: not known)."""
    return {name: (None if ms is None or not tokens else round(ms * 1000 / tokens, 1))
            for name, ms in cpu_ms.items()}


@dataclass
class ScaleCell:
    clock: str
    streams: int
    load: LoadResult
    cpu_ms: dict[str, float | None] = field(default_factory=dict)
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # Tokens per engine step (the batched clock's mean batch; None: per-stream timers).
    mean_batch: float | None = None
    # The steady window (load.SteadyWindow: every stream running, none starting
    # or ending): each process's CPU in it and the tokens that arrived in it.
    running_cpu_ms: dict[str, float | None] = field(default_factory=dict)
    running_tokens: int | None = None
    running_s: float | None = None

    def us_per_token(self) -> dict[str, float | None]:
        """Over the whole cell: each token also carries its share of its
        stream's set-up and end."""
        return _per_token_us(self.cpu_ms, self.load.tokens)

    def us_per_running_token(self) -> dict[str, float | None]:
        """Over the steady window only: what a paced token itself costs."""
        return _per_token_us(self.running_cpu_ms, self.running_tokens)

    def on_cadence(self) -> bool:
        icl = self.load.icl_ms
        return (self.load.completed == self.streams and bool(icl)
                and icl["p99"] <= TARGET_ICL_P99_MS)

    def figures(self) -> Figures:
        return {"clock": self.clock, **self.load.figures(),
                **{f"cpu_ms_{name}": None if ms is None else round(ms, 1)
                   for name, ms in self.cpu_ms.items()},
                **{f"us_per_token_{name}": us for name, us in self.us_per_token().items()},
                "running_tokens": self.running_tokens,
                "running_s": None if self.running_s is None else round(self.running_s, 3),
                **{f"us_per_running_token_{name}": us
                   for name, us in self.us_per_running_token().items()},
                "loadavg_1m": self.loadavg[0], "loadavg_5m": self.loadavg[1],
                "loadavg_15m": self.loadavg[2], "on_cadence": self.on_cadence(),
                "mean_batch": None if self.mean_batch is None else round(self.mean_batch, 1)}

    def report(self) -> Report:
        """The cell judged against the cadence target (a sweep means to pass it: a
        cell past the break point fails its checks, and that is the figure)."""
        figures = self.figures()
        checks = (Check("completed", "==", self.streams, "every stream completes"),
                  Check("icl_ms_p99", "<=", TARGET_ICL_P99_MS, "inter-chunk p99 within 30 ms"))
        return Report("bench scale", f"{self.clock} × {self.streams}", figures=figures,
                      checks=judge(checks, figures))

    def row(self) -> tuple[Figure, ...]:
        icl, ttft, per = self.load.icl_ms, self.load.ttft_ms, self.us_per_token()
        known = [v for v in per.values() if v is not None]
        running = [v for v in self.us_per_running_token().values() if v is not None]
        return (self.clock, self.streams, self.load.completed,
                None if self.mean_batch is None else round(self.mean_batch, 1),
                icl.get("p50"), icl.get("p90"), icl.get("p99"), ttft.get("p99"),
                round(self.loadavg[0], 1), *(per.get(name) for name in PROCESSES),
                round(sum(known)) if known else None, round(sum(running)) if running else None)


SCALE_COLUMNS = ("clock", "streams", "ok", "batch", "ICL p50", "p90", "p99", "TTFT p99", "load",
                 f"µs/token: {PROCESSES[0]}", *PROCESSES[1:], "total", "total running")


# Where the streams enter: the full chain, or past its first hops (the break
# point "via nginx alone" beside the full chain's).
ENTRIES = ("edge", "nginx", "gateway")


def entry_url(lab: LabTarget, entry: str) -> str:
    return {"edge": lab.edge_url, "nginx": lab.nginx_url, "gateway": lab.gateway_url}[entry]


def cadence_cell(lab: LabTarget, clock: str, streams: int, tokens: int, step_ms: int,
                 entry: str = "edge") -> ScaleCell:
    pids = pids_of(lab, "bench scale reads each process's CPU")
    meters: dict[str, ProcessTreeMeter] = {
        name: ProcessTreeMeter(pids[name]) for name in PROCESSES if name in pids}
    edge = urlsplit(entry_url(lab, entry))
    body = chat_body("scale", max_tokens=tokens, prefill_ms=10, token_gap_ms=step_ms,
                     answer_tokens=tokens, heartbeat_s=0)
    steps_before = lab.engine_stats().load
    host, port = edge.hostname or "127.0.0.1", edge.port or 80
    # Unrecorded warm-up: fresh keep-alives and channels after a restart are not the cell.
    warm = chat_body("warm", max_tokens=5, prefill_ms=0, token_gap_ms=step_ms, answer_tokens=5)
    asyncio.run(run_load(host, port, "/v1/chat/completions", warm, streams=min(streams, 20),
                         ramp_s=0.1, timeout_s=30))
    # The client's own CPU in the steady window beside the lab's (this process
    # alone: a lab started from it would be its children).
    client = CpuMeter(os.getpid())

    def read() -> dict[str, list[CpuReading | None]]:
        return {name: meter.read() for name, meter in meters.items()}

    edges: list[dict[str, list[CpuReading | None]]] = []
    steady = SteadyWindow(lambda: edges.append({**read(), "client": [client.read()]}))
    before = read()
    load = asyncio.run(run_load(host, port, "/v1/chat/completions", body, streams=streams,
                                timeout_s=60 + tokens * step_ms / 1000 * 4, steady=steady))
    after = read()
    cpu: dict[str, float | None] = {
        name: ProcessTreeMeter.ms_between(before[name], after[name]) for name in meters}
    cpu["client"] = load.client_cpu_ms
    running: dict[str, float | None] = {}
    if len(edges) == 2 and steady.tokens:
        running = {name: ProcessTreeMeter.ms_between(edges[0][name], edges[1][name])
                   for name in edges[0]}
    steps_after = lab.engine_stats().load
    steps = steps_after.decode_steps - steps_before.decode_steps
    batch = (steps_after.decode_step_tokens - steps_before.decode_step_tokens) / steps \
        if steps else None
    return ScaleCell(clock, streams, load, cpu, os.getloadavg(), batch, running,
                     steady.tokens if running else None, steady.seconds if running else None)


def run_scale(lab: LabTarget, sweep: tuple[int, ...] = SWEEP, tokens: int = 100,
              step_ms: int = 20, clocks: tuple[str, ...] = CLOCKS,
              on_cell: Callable[[ScaleCell], None] = lambda cell: None,
              stop_p99_ms: float = 4 * TARGET_ICL_P99_MS, entry: str = "edge"
              ) -> Report:
    """Cell a) with b) read in the same runs. Each N runs every clock in turn.
    The break point of a clock is the first N whose inter-chunk p99 passes the
    target; the sweep goes on past it (the curve is the point of the plot) and
    stops after the N at which every clock is far past it (`stop_p99_ms`), or
    lost a stream."""
    cells: list[ScaleCell] = []
    broken: dict[str, int] = {}
    with lab_settings(lab, max(sweep)) as use_clock:
        for streams in sweep:
            gone = 0
            for clock in clocks:
                use_clock(clock)
                cell = cadence_cell(lab, clock, streams, tokens, step_ms, entry)
                cells.append(cell)
                on_cell(cell)
                if not cell.on_cadence():
                    broken.setdefault(clock, streams)
                p99 = cell.load.icl_ms.get("p99", float("inf"))
                if p99 > stop_p99_ms or cell.load.completed < streams:
                    gone += 1
            if gone == len(clocks):
                break
    return cadence_report(cells, broken, tokens, step_ms, sweep, clocks, entry)


def cadence_report(cells: list[ScaleCell], broken: dict[str, int], tokens: int, step_ms: int,
                   sweep: tuple[int, ...], clocks: tuple[str, ...], entry: str) -> Report:
    """The sweep's cells (a part and a row each) and each clock's break point (the
    first N off cadence, in `broken`)."""
    figures: Figures = {"tokens": tokens, "step_ms": step_ms,
                        "sweep": ",".join(str(n) for n in sweep), "entry": entry,
                        "target_icl_p99_ms": TARGET_ICL_P99_MS,
                        **{f"break_point_{c}": broken.get(c) for c in clocks}}
    table = Table("cells", SCALE_COLUMNS, tuple(c.row() for c in cells),
                  caption=f"{tokens} tokens per stream at a {step_ms} ms step, entering at "
                          f"{entry} · ms and µs/token · break points (inter-chunk p99 > 30 ms): "
                          + ", ".join(f"{c} {broken.get(c) or '-'}" for c in clocks))
    return Report("bench scale", "cadence", story="how many paced streams keep their cadence, "
                  "per engine clock, and where each token's CPU goes", figures=figures,
                  tables=(table,), parts=tuple(c.report() for c in cells))


# Each process's CPU and RSS by pid, restarts to raise the caps and switch the
# engine's clock, and the engine's step counters.
NEEDS = frozenset({Capability.PIDS, Capability.RESTART_SERVICE, Capability.ENGINE_RECORD})


def bench_scale(lab: LabTarget, *, sweep: tuple[int, ...] = SWEEP, tokens: int = 100,
                step_ms: int = 20, clocks: tuple[str, ...] = CLOCKS, entry: str = "edge",
                slow_streams: int = 0, slow_tokens: int = 20, slow_ramp_s: float = 10.0,
                admission: tuple[str, ...] = ("off", "on"), admission_rate: float = 200.0,
                cadence: bool = True, setup_streams: int = 0, storm_streams: int = 0,
                cancel_background: int = 0, cancel_streams: int = 200,
                floor_logs: Path | None = None,
                tracing: tuple[str, ...] = (), tracing_rounds: int = 2,
                tracing_streams: int = 500, tracing_baseline: str | None = None,
                storm_cell: Callable[[LabTarget, int], Report] | None = None,
                on_cell: Callable[[ScaleCell], None] = lambda cell: None,
                on_step: Callable[[str], None] = lambda step: None) -> Report:
    """`streamlab bench scale`: cell d with `setup_streams` (0: none), the
    cadence sweep (cells a and b, unless not `cadence`), cell c with
    `slow_streams` (0: none) once per `admission` mode, cell e with
    `storm_streams` (0: none), cell f with `cancel_background` streams running
    (0: none), cell g with `tracing` modes (empty: none, else `tracing_rounds`
    rounds of `tracing_streams` set-ups and the paced cell per mode), each a
    part; then the targets of the cells that ran, a part.
    Cell d runs the gRPC floor beside it when `floor_logs` names where its
    processes log. Cell e is a scenario's measurement, handed in as `storm_cell`
    (the reconnect-storm scenario's `fixed_storm`: a bench imports no scenario)."""
    if entry not in ENTRIES:
        raise ValueError(f"entry must be one of {', '.join(ENTRIES)}, not {entry!r}")
    if storm_streams and storm_cell is None:
        raise ValueError("cell e (storm_streams) needs the storm_cell that measures it")
    require(lab, NEEDS, "bench scale")
    cells = Cells()
    if setup_streams:
        # First, on the lab as it is: the sweep restarts services and raises caps.
        on_step(f"cell d: {setup_streams} set-ups")
        cells = replace(cells, setup=setup_report(run_setup(
            lab, streams=setup_streams, paced=None, floor_logs=floor_logs)))
    if cadence:
        on_step("cells a, b: the cadence sweep")
        cells = replace(cells, cadence=run_scale(lab, sweep, tokens, step_ms, clocks, on_cell,
                                                 entry=entry))
    if slow_streams:
        on_step(f"cell c: {slow_streams} slow streams, {slow_tokens} tokens each, "
                f"admission {', '.join(admission)}")
        cells = replace(cells, slow=run_slow(lab, slow_streams, slow_tokens, slow_ramp_s,
                                             admission, admission_rate))
    if storm_streams:
        on_step(f"cell e: a reconnect storm of {storm_streams} streams")
        assert storm_cell is not None
        cells = replace(cells, storm=replace(storm_cell(lab, storm_streams),
                                             experiment="bench scale", variant="storm"))
    if cancel_background:
        on_step(f"cell f: cancel beside {cancel_background} streams, both wires")
        cells = replace(cells, cancel=bench_cancel_wires(
            lab, WIRES, streams=cancel_streams, background=cancel_background))
    parts = [p for p in (cells.setup, cells.cadence, cells.slow, cells.storm, cells.cancel)
             if p is not None]
    if tracing:
        on_step(f"cell g: tracing {', '.join(tracing)}, {tracing_rounds} rounds")
        parts.append(tracing_report(run_tracing_cost(
            lab, tracing, rounds=tracing_rounds, streams=tracing_streams,
            baseline=tracing_baseline, on_step=on_step)))
    parts.append(targets_report(cells, os.getloadavg()))
    return Report("bench scale", parts=tuple(parts))
