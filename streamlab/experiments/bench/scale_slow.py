"""`streamlab bench scale`, cell c: thousands of slow streams through the full chain.

    c) slow      N streams at once (5,000 by default), 1 token/s and a heartbeat
                 every 5 s, through the full chain; the raw-socket load generator
                 opens them over a ramp shorter than an answer, so all are open
                 together. Reported: how many complete, the gateway's RSS per
                 stream (its peak during the run minus its RSS before, over the
                 most streams it held at once: its open sockets above its idle
                 count, since streams the chain has not yet handed to the
                 gateway cost it nothing),
                 heartbeat lateness (each `: ping` against the one before it),
                 open file descriptors per process at the peak, CPU per token
                 per process, and the load average. The checks ask for every
                 stream complete, <= 30 KiB of gateway RSS per stream and
                 heartbeat lateness p99 <= 1 s, on one gateway worker.

The caps are raised to N for the run and put back after (bench scale's
lab_settings), the engine on its batched clock. Figures judged, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from dataclasses import dataclass, field, replace

import psutil

from services.client.openai_stream import chat_body
from streamlab.experiments.bench.load import LoadResult, run_load
from streamlab.experiments.bench.scale import PROCESSES, ProcessTreeMeter, lab_settings
from streamlab.experiments.report import Check, Figures, Report, Table, judge
from streamlab.lab.processes import StartError
from streamlab.lab.target import LabTarget, pids_of

SLOW_STREAMS = 5000
SLOW_TOKENS = 20
SLOW_GAP_MS = 1000
HEARTBEAT_S = 5.0
# The cell's bounds: a slow stream's memory in the gateway, heartbeat lateness, and
# the open-file limit per process on this lab (a stream holds a socket in each hop).
TARGET_RSS_KIB_PER_STREAM = 30.0
TARGET_HEARTBEAT_LATE_P99_MS = 1000
FD_LIMIT = 20_000


def _tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    return []


def open_files(pid: int) -> int | None:
    """File descriptors open in a process and its children (nginx's workers)."""
    total, seen = 0, False
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):
            total += process.num_fds()
            seen = True
    return total if seen else None


class PeakSampler:
    """Samples the gateway's RSS and every process's open files once a second in a
    thread while the load runs (the event loop is the load generator's alone), and
    keeps the peaks."""

    def __init__(self, pids: dict[str, int], interval_s: float = 1.0) -> None:
        self._pids, self._interval_s = pids, interval_s
        self.peak_rss: dict[str, int] = {}
        self.peak_fds: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self._interval_s):
                return

    def sample(self) -> None:
        for name, pid in self._pids.items():
            fds = open_files(pid)
            if fds is not None:
                self.peak_fds[name] = max(self.peak_fds.get(name, 0), fds)
            rss = sum(_rss(p) for p in _tree(pid))
            self.peak_rss[name] = max(self.peak_rss.get(name, 0), rss)


def _rss(process: psutil.Process) -> int:
    with contextlib.suppress(psutil.Error):
        return int(process.memory_info().rss)
    return 0


@dataclass
class SlowCell:
    streams: int
    tokens: int
    load: LoadResult
    gateway_rss_before: int
    gateway_fds_before: int
    peak_rss: dict[str, int] = field(default_factory=dict)
    peak_fds: dict[str, int] = field(default_factory=dict)
    cpu_ms: dict[str, float | None] = field(default_factory=dict)
    loadavg: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def gateway_streams_held(self) -> int:
        """The most streams the gateway held at once: its open sockets at the peak
        above its idle count (one client socket per stream; the engine hop is one)."""
        return max(0, self.peak_fds.get("gateway", 0) - self.gateway_fds_before)

    @property
    def gateway_kib_per_stream(self) -> float | None:
        peak, held = self.peak_rss.get("gateway"), self.gateway_streams_held
        if not peak or not held:
            return None
        return (peak - self.gateway_rss_before) / 1024 / held

    def us_per_token(self) -> dict[str, float | None]:
        tokens = self.load.tokens
        return {name: (None if ms is None or not tokens else round(ms * 1000 / tokens, 1))
                for name, ms in self.cpu_ms.items()}

    def figures(self) -> Figures:
        per_stream = self.gateway_kib_per_stream
        return {"streams": self.streams, "tokens": self.tokens, "gap_ms": SLOW_GAP_MS,
                "heartbeat_s": HEARTBEAT_S, **{k: v for k, v in self.load.figures().items()
                                               if k not in ("streams", "tokens")},
                "tokens_received": self.load.tokens,
                "gateway_rss_before_mib": round(self.gateway_rss_before / 2**20, 1),
                "gateway_rss_peak_mib": round(self.peak_rss.get("gateway", 0) / 2**20, 1),
                "gateway_streams_held": self.gateway_streams_held,
                "gateway_kib_per_stream": None if per_stream is None else round(per_stream, 1),
                "loadavg_1m": self.loadavg[0], "loadavg_5m": self.loadavg[1],
                "loadavg_15m": self.loadavg[2]}

    def processes(self) -> Table:
        """Per process: open files and RSS at the peak, CPU per token."""
        per = self.us_per_token()
        names = list(dict.fromkeys([*self.peak_fds, *per]))
        return Table("processes", PROCESS_COLUMNS, tuple(
            (name, self.peak_fds.get(name),
             round(self.peak_rss[name] / 2**20, 1) if name in self.peak_rss else None,
             per.get(name)) for name in names),
            caption=f"open files at the peak (the limit here: {FD_LIMIT:,} per process)")

    def report(self) -> Report:
        """The cell judged on its bounds: every stream complete, the gateway's RSS
        per stream held, heartbeat lateness, open files per process."""
        figures = self.figures()
        figures.update({f"peak_fds_{name}": n for name, n in self.peak_fds.items()})
        checks = (Check("completed", "==", self.streams, "every slow stream completes"),
                  Check("gateway_kib_per_stream", "<=", TARGET_RSS_KIB_PER_STREAM,
                        "the gateway holds a slow stream in at most 30 KiB"),
                  Check("heartbeat_late_ms_p99", "<=", TARGET_HEARTBEAT_LATE_P99_MS,
                        "heartbeats come on time, within a second at p99"),
                  *(Check(f"peak_fds_{name}", "<", FD_LIMIT,
                          f"{name} stays under the open-file limit")
                    for name in self.peak_fds))
        return Report("bench scale", "slow", story=f"{self.streams} slow streams at once "
                      "through the full chain (1 token/s, a heartbeat every 5 s)",
                      figures=figures, checks=judge(checks, figures),
                      tables=(self.processes(),))


PROCESS_COLUMNS = ("process", "open files at peak", "RSS at peak MiB", "µs CPU per token")


def slow_cell(lab: LabTarget, streams: int = SLOW_STREAMS, tokens: int = SLOW_TOKENS,
              ramp_s: float | None = None) -> SlowCell:
    """Cell c) on a lab whose caps already admit `streams` (see run_slow)."""
    pids = dict(pids_of(lab, "bench scale reads each process's RSS, files and CPU"))
    pids["client"] = os.getpid()
    answer_s = tokens * SLOW_GAP_MS / 1000
    # Open every stream within half an answer: all are open together for the
    # rest. Longer answers (--slow-tokens) ramp slower: 5,000 set-ups in 10 s
    # (the 20-token default) are more than one gateway worker's loop can take
    # on 2 cores at 2-4 ms of CPU each, which the cell (concurrency) does not ask.
    ramp = ramp_s if ramp_s is not None else answer_s / 2
    host, port = lab.ports.host, lab.ports.edge_port
    warm = chat_body("warm", max_tokens=3, prefill_ms=0, token_gap_ms=20, answer_tokens=3)
    asyncio.run(run_load(host, port, "/v1/chat/completions", warm, streams=20, ramp_s=0.1,
                         timeout_s=30))
    rss_before = sum(_rss(p) for p in _tree(pids["gateway"]))
    fds_before = open_files(pids["gateway"]) or 0
    body = chat_body("slow", max_tokens=tokens, prefill_ms=0, token_gap_ms=SLOW_GAP_MS,
                     answer_tokens=tokens, heartbeat_s=HEARTBEAT_S)
    meters = {name: ProcessTreeMeter(pid) for name, pid in pids.items()
              if name in PROCESSES and name != "client"}
    before = {name: meter.read() for name, meter in meters.items()}
    with PeakSampler(pids) as sampler:
        load = asyncio.run(run_load(host, port, "/v1/chat/completions", body, streams=streams,
                                    ramp_s=ramp, timeout_s=ramp + answer_s * 3 + 60,
                                    heartbeat_s=HEARTBEAT_S))
    after = {name: meter.read() for name, meter in meters.items()}
    cpu: dict[str, float | None] = {
        name: ProcessTreeMeter.ms_between(before[name], after[name]) for name in meters}
    cpu["client"] = load.client_cpu_ms
    return SlowCell(streams, tokens, load, rss_before, fds_before, sampler.peak_rss,
                    sampler.peak_fds, cpu, os.getloadavg())


def run_slow(lab: LabTarget, streams: int = SLOW_STREAMS, tokens: int = SLOW_TOKENS
             ) -> Report:
    """Cell c) with the caps raised to `streams` and the batched clock; caps put back.
    A lab still busy with the run's aftermath may miss the restart's deadline: the
    figures are kept and the failure is reported beside them."""
    cell: Report | None = None
    try:
        with lab_settings(lab, streams) as use_clock:
            use_clock("batched")
            cell = slow_cell(lab, streams, tokens).report()
    except StartError as exc:
        if cell is None:
            raise
        cell = replace(cell, figures={**cell.figures, "restore_error": str(exc)})
    return cell
