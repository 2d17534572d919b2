"""`streamlab bench memory`: the gateway's memory per open stream, on each engine wire.

N slow streams (15 tokens 1 s apart, a heartbeat every 5 s: the shape of bench
scale's slow cell) held open at once against a gateway and an engine this
bench starts on free ports (no lab needed: the gateway's memory per stream
does not depend on the hops in front of it), once per engine wire
(per_request: a grpc.aio call per stream; multiplexed: one Session per
engine). Per wire: the gateway's RSS before (after a warm-up) and at its peak
while the streams are held, over the streams it held (its open sockets above
its idle count): KiB per stream, judged against the cost report's 40 KiB.

With `trace`, a second run per wire under tracemalloc
(streamlab/experiments/bench/memory_gateway.py) diffs a snapshot taken before
the streams open against one taken while they are held: the Python
allocations each stream holds, by where they were made, as a table. Its RSS is
inflated by tracemalloc's own bookkeeping, so the RSS figures come from the
untraced run; what tracemalloc cannot see (grpc's C core, uvloop's and
httptools' C buffers, the allocator's fragmentation) is RSS minus traced.

Figures judged, never asserted (docs/cost.md: memory per stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from services.client.openai_stream import chat_body
from services.gateway.settings import ENGINE_WIRES
from streamlab.experiments.bench.load import LoadResult, run_load
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge
from streamlab.lab.processes import free_ports
from streamlab.lab.processes import wait_until as wait_for

WIRES: tuple[str, ...] = ENGINE_WIRES
DEFAULT_STREAMS = 1000
TOKENS = 15
GAP_MS = 1000
HEARTBEAT_S = 5.0
RAMP_S = 3.0
TARGET_KIB_PER_STREAM = 40.0
# Rows of the tracemalloc table per wire.
TOP = 12
# Where a traced frame's file is shown from (site-packages or the repository).
_ROOTS = tuple(sorted({str(Path(p)) for p in sys.path if p and Path(p).is_dir()},
                      key=len, reverse=True))


@dataclass
class WireRun:
    wire: str
    streams: int
    load: LoadResult
    rss_before: int
    rss_peak: int
    fds_before: int
    fds_peak: int
    # The median RSS while every stream was held (after the ramp, before the
    # first ends): what they hold, without the ramp's passing garbage.
    rss_held: int = 0
    # With a traced run: (where, KiB per stream, objects per stream), largest first,
    # and the traced total per stream.
    top: list[tuple[str, float, float]] = field(default_factory=list)
    traced_kib_per_stream: float | None = None

    @property
    def held(self) -> int:
        """The most streams the gateway held at once: its sockets above idle."""
        return max(0, self.fds_peak - self.fds_before)

    @property
    def kib_per_stream(self) -> float | None:
        """At the peak, as bench scale's slow cell counts it (the judged figure)."""
        if not self.held:
            return None
        return round((self.rss_peak - self.rss_before) / 1024 / self.held, 1)

    @property
    def held_kib_per_stream(self) -> float | None:
        """At the median while held: steadier from run to run than the peak."""
        if not self.held or not self.rss_held:
            return None
        return round((self.rss_held - self.rss_before) / 1024 / self.held, 1)


def _gateway_env(port: int, engine_port: int, wire: str, streams: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLAB_")}
    caps = str(streams + 100)
    env.update({
        "STREAMLAB_GATEWAY_HOST": "127.0.0.1", "STREAMLAB_GATEWAY_PORT": str(port),
        "STREAMLAB_GATEWAY_ENGINE_TARGET": f"127.0.0.1:{engine_port}",
        "STREAMLAB_GATEWAY_ENGINE_WIRE": wire,
        # Every stream comes from this one client: caps raised past N.
        "STREAMLAB_GATEWAY_MAX_STREAMS": caps, "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": caps,
        "STREAMLAB_GATEWAY_DRAIN_GRACE_S": "0"})
    return env


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str], log: Path, ready: Callable[[], bool],
             what: str) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        popen = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    try:
        def died() -> str | None:
            if popen.poll() is None:
                return None
            return f"{what} exited during start-up: {log.read_text(errors='replace')[-2000:]}"

        wait_for(ready, 30.0, what, died=died)
        yield popen
    finally:
        popen.terminate()
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=5)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as response:
        return int(response.status) == 200


def _tcp_open(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1):
        return True


def _where(frame: tracemalloc.Frame) -> str:
    name = frame.filename
    for root in _ROOTS:
        if name.startswith(root + os.sep):
            name = name[len(root) + 1:]
            break
    return f"{name}:{frame.lineno}"


def traced_top(before: tracemalloc.Snapshot, during: tracemalloc.Snapshot, held: int,
               top: int = TOP) -> tuple[list[tuple[str, float, float]], float]:
    """The allocations that grew between the snapshots, by the line that made them
    (the innermost frame, with its two callers), per held stream; and the total."""
    keep = [tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap*>")]
    before, during = before.filter_traces(keep), during.filter_traces(keep)
    stats = during.compare_to(before, "traceback")
    # Grouped by the innermost three frames: one site, whoever called it above.
    grouped: dict[str, list[int]] = {}
    for stat in stats:
        frames = list(stat.traceback)[-3:] if stat.traceback else []
        key = " < ".join(_where(f) for f in reversed(frames)) or "?"
        sizes = grouped.setdefault(key, [0, 0])
        sizes[0] += stat.size_diff
        sizes[1] += stat.count_diff
    total = sum(size for size, _ in grouped.values())
    rows = sorted(grouped.items(), key=lambda item: item[1][0], reverse=True)[:top]
    per = max(1, held)
    return ([(where, round(size / 1024 / per, 2), round(count / per, 1))
             for where, (size, count) in rows], round(total / 1024 / per, 1))


async def _hold(port: int, gateway: psutil.Process, streams: int, ramp_s: float,
                fds_before: int, on_held: Callable[[int], None]
                ) -> tuple[LoadResult, int, int, int]:
    """Open the slow streams; sample the gateway's RSS and sockets until they end:
    the load, the peak RSS and sockets, and the median RSS while all are held.
    `on_held(n)` runs once, when the gateway holds every stream (its sockets
    above `fds_before`; n of them) or, on a machine too slow for that, when the
    first could end: n is what it held then."""
    body = chat_body("memory", max_tokens=TOKENS, prefill_ms=0, token_gap_ms=GAP_MS,
                     answer_tokens=TOKENS, heartbeat_s=HEARTBEAT_S)
    load = asyncio.ensure_future(run_load(
        "127.0.0.1", port, "/v1/chat/completions", body, streams=streams, ramp_s=ramp_s,
        timeout_s=ramp_s + TOKENS * GAP_MS / 1000 + 60))
    rss_peak = fds_peak = 0
    start = time.monotonic()
    held_at = start + ramp_s + 2.5  # the ramp, then two tokens' time
    # Until the first stream can have ended (its last token), less a margin.
    held_until = start + (TOKENS - 2) * GAP_MS / 1000
    held: list[int] = []
    fired = False
    fds = 0
    while not load.done():
        with contextlib.suppress(psutil.Error):
            rss = gateway.memory_info().rss
            fds = gateway.num_fds()
            rss_peak = max(rss_peak, rss)
            fds_peak = max(fds_peak, fds)
            if held_at <= time.monotonic() < held_until:
                held.append(rss)
        now = time.monotonic()
        if not fired and now >= held_at and (fds - fds_before >= streams or now >= held_until):
            fired = True
            on_held(max(0, fds - fds_before))
        await asyncio.sleep(0.1)
    return load.result(), rss_peak, fds_peak, int(statistics.median(held)) if held else 0


def run_wire(wire: str, engine_port: int, streams: int, ramp_s: float, workdir: Path,
             trace: bool = False) -> WireRun:
    (port,) = free_ports(1)
    env = _gateway_env(port, engine_port, wire, streams)
    snapshots = workdir / f"{wire}.snapshot"
    if trace:
        env["STREAMLAB_MEMORY_TRACE"] = str(snapshots)
    taken: list[tracemalloc.Snapshot] = []
    held_at_snapshot = [0]

    def snapshot(popen: subprocess.Popen[bytes]) -> None:
        path = Path(f"{snapshots}.{len(taken)}")
        popen.send_signal(signal.SIGUSR1)
        wait_for(path.exists, 120.0, f"the gateway's snapshot {path.name}")
        taken.append(tracemalloc.Snapshot.load(str(path)))

    with _process([sys.executable, "-m", "streamlab.experiments.bench.memory_gateway"], env,
                  workdir / f"gateway-{wire}{'-trace' if trace else ''}.log",
                  lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"),
                  f"gateway ({wire})") as popen:
        gateway = psutil.Process(popen.pid)
        # A warm-up: the first streams build what every later one reuses (the
        # engine channel, caches), which is not per-stream memory.
        warm = chat_body("warm", max_tokens=3, prefill_ms=0, token_gap_ms=20, answer_tokens=3)
        asyncio.run(run_load("127.0.0.1", port, "/v1/chat/completions", warm,
                             streams=50, ramp_s=0.2, timeout_s=30))
        if trace:
            snapshot(popen)
        rss_before, fds_before = gateway.memory_info().rss, gateway.num_fds()

        def on_held(count: int) -> None:
            if trace:
                # Blocks the load generator's loop while the gateway writes its
                # snapshot: the streams wait, none ends (a trace run's RSS is
                # not the figure anyway).
                held_at_snapshot[0] = count
                snapshot(popen)

        load, rss_peak, fds_peak, rss_held = asyncio.run(_hold(
            port, gateway, streams, ramp_s, fds_before, on_held))
    run = WireRun(wire, streams, load, rss_before, rss_peak, fds_before, fds_peak, rss_held)
    if trace and len(taken) == 2:
        # Over the streams held when the snapshot was taken, not at the peak.
        run.top, run.traced_kib_per_stream = traced_top(taken[0], taken[1],
                                                        held_at_snapshot[0])
    return run


def run_memory(streams: int = DEFAULT_STREAMS, wires: tuple[str, ...] = WIRES,
               trace: bool = False, ramp_s: float = RAMP_S,
               on_step: Callable[[str], None] = lambda step: None) -> list[WireRun]:
    (engine_port,) = free_ports(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLAB_")}
    env.update({"STREAMLAB_ENGINE_HOST": "127.0.0.1", "STREAMLAB_ENGINE_PORT": str(engine_port)})
    runs: list[WireRun] = []
    with tempfile.TemporaryDirectory(prefix="streamlab-memory-") as tmp:
        workdir = Path(tmp)
        with _process([sys.executable, "-m", "services.engine"], env, workdir / "engine.log",
                      lambda: _tcp_open(engine_port), "engine"):
            for wire in wires:
                on_step(f"{wire}: {streams} streams")
                run = run_wire(wire, engine_port, streams, ramp_s, workdir)
                if trace:
                    on_step(f"{wire}: {streams} streams under tracemalloc")
                    traced = run_wire(wire, engine_port, streams, ramp_s, workdir, trace=True)
                    run.top, run.traced_kib_per_stream = traced.top, traced.traced_kib_per_stream
                runs.append(run)
    return runs


def memory_report(runs: list[WireRun]) -> Report:
    figures: Figures = {"loadavg_1m": round(os.getloadavg()[0], 2)}
    checks: list[Check] = []
    rows: list[tuple[Figure, ...]] = []
    tables: list[Table] = []
    for run in runs:
        w = run.wire
        figures.update({
            f"{w}_streams": run.streams, f"{w}_completed": run.load.completed,
            f"{w}_failed": run.load.failed, f"{w}_errors": run.load.figures()["errors"],
            f"{w}_held": run.held,
            f"{w}_rss_before_mib": round(run.rss_before / 2**20, 1),
            f"{w}_rss_peak_mib": round(run.rss_peak / 2**20, 1),
            f"{w}_rss_held_mib": round(run.rss_held / 2**20, 1),
            f"{w}_kib_per_stream": run.kib_per_stream,
            f"{w}_held_kib_per_stream": run.held_kib_per_stream,
            f"{w}_traced_kib_per_stream": run.traced_kib_per_stream})
        checks += [Check(f"{w}_completed", "==", run.streams, f"{w}: every stream completes"),
                   Check(f"{w}_kib_per_stream", "<=", TARGET_KIB_PER_STREAM,
                         f"{w}: at most {TARGET_KIB_PER_STREAM:g} KiB of gateway RSS "
                         "per open stream")]
        rows.append((w, run.load.completed, run.held, round(run.rss_before / 2**20, 1),
                     round(run.rss_peak / 2**20, 1), run.kib_per_stream,
                     run.held_kib_per_stream, run.traced_kib_per_stream))
        if run.top:
            tables.append(Table(f"traced-{w}", ("allocated at (< called from)", "KiB/stream",
                                               "objects/stream"),
                                tuple(run.top),
                                caption=f"{w}: Python allocations held per stream "
                                        "(tracemalloc, while held minus before)"))
    results = judge(checks, figures)
    table = Table("memory", ("wire", "completed", "held", "RSS before MiB", "RSS peak MiB",
                             "KiB/stream", "held KiB/stream", "traced KiB/stream"),
                  tuple(rows),
                  caption=f"{runs[0].streams if runs else 0} streams x {TOKENS} tokens "
                          f"{GAP_MS} ms apart, heartbeat {HEARTBEAT_S:g} s, "
                          f"load {figures['loadavg_1m']}")
    return Report("bench memory", story="the gateway's RSS per open slow stream, per "
                  "engine wire", figures=figures, checks=results, tables=(table, *tables))


def bench_memory(streams: int = DEFAULT_STREAMS, wires: tuple[str, ...] = WIRES,
                 trace: bool = False, ramp_s: float = RAMP_S,
                 on_step: Callable[[str], None] = lambda step: None) -> Report:
    return memory_report(run_memory(streams, wires, trace, ramp_s, on_step))
