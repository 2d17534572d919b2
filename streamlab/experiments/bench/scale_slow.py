"""`streamlab bench scale`, cell c: thousands of slow streams through the full chain.

    c) slow      N streams at once (5,000 by default), 1 token/s and a heartbeat
                 every 5 s, through the full chain; the raw-socket load generator
                 opens them over a 10 s ramp (half an answer), so all are open
                 together. Reported: how many complete, the gateway's RSS per
                 stream (its peak during the run minus its RSS before, over the
                 most streams it held at once: its open sockets above its idle
                 count, since streams the chain has not yet handed to the
                 gateway cost it nothing),
                 heartbeat lateness (each `: ping` against the one before it),
                 and, for what arrived while the ramp was still opening streams,
                 heartbeat and token lateness (each token against the one
                 before it and the 1 s gap): what a burst of set-ups does to the
                 streams already running. Open file descriptors per process at
                 the peak, CPU per token per process, and the load average. The
                 checks ask for every stream complete, TTFT p99 <= 1 s, <= 40
                 KiB of gateway RSS per stream and heartbeat lateness p99 <=
                 500 ms, on one gateway worker.

The cell runs once per set-up admission mode (`admission`): "off", the gateway
setting every set-up as it arrives (STREAMLAB_GATEWAY_ADMISSION_RATE_PER_S=0),
and "on", set-ups admitted at a bounded rate, the rest waiting their turn
(services/gateway/admission.py), side by side in one run; the report's own
figures are the last mode's ("on" when it ran: the lab's protection).

The caps are raised to N for the run and put back after (lab_settings.py), the
engine on its batched clock. Figures judged, never asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from dataclasses import dataclass, field, replace

import psutil

from services.client.openai_stream import chat_body
from streamlab.experiments.bench.lab_settings import lab_settings
from streamlab.experiments.bench.load import LoadResult, run_load
from streamlab.experiments.bench.probes import PROCESSES, ProcessTreeMeter
from streamlab.experiments.report import Check, Figures, Report, Table, judge
from streamlab.lab.processes import StartError
from streamlab.lab.target import LabTarget, pids_of

SLOW_STREAMS = 5000
SLOW_TOKENS = 20
SLOW_GAP_MS = 1000
HEARTBEAT_S = 5.0
# The cell's bounds: a slow stream's memory in the gateway, heartbeat lateness, and
# the open-file limit per process on this lab (a stream holds a socket in each hop).
TARGET_RSS_KIB_PER_STREAM = 40.0
TARGET_HEARTBEAT_LATE_P99_MS = 500
TARGET_TTFT_P99_MS = 1000
FD_LIMIT = 20_000
SLOW_RAMP_S = 10.0
# Set-up admission for the "on" mode: new streams a second on the one gateway.
# What the 2-core lab sets up without starving the running streams: ~5 ms of
# CPU per set-up across every process (docs/cost.md) at 200/s is one core.
ADMISSION_RATE_PER_S = 200.0
ADMISSION_MODES = ("off", "on")
ADMISSION_ENV = "STREAMLAB_GATEWAY_ADMISSION_RATE_PER_S"


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
    # Set-up admission: "off", or "on" at `admission_rate` set-ups a second.
    admission: str = "off"
    admission_rate: float = 0.0
    ramp_s: float = SLOW_RAMP_S

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
                "ramp_s": self.ramp_s, "admission": self.admission,
                "admission_rate_per_s": self.admission_rate,
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
                  Check("ttft_ms_p99", "<=", TARGET_TTFT_P99_MS,
                        "first token within a second at p99"),
                  Check("gateway_kib_per_stream", "<=", TARGET_RSS_KIB_PER_STREAM,
                        "the gateway holds a slow stream in at most 40 KiB"),
                  Check("heartbeat_late_ms_p99", "<=", TARGET_HEARTBEAT_LATE_P99_MS,
                        "heartbeats come on time, within 500 ms at p99"),
                  *(Check(f"peak_fds_{name}", "<", FD_LIMIT,
                          f"{name} stays under the open-file limit")
                    for name in self.peak_fds))
        return Report("bench scale", f"slow, admission {self.admission}",
                      story=f"{self.streams} slow streams at once through the full chain "
                      f"(1 token/s, a heartbeat every 5 s, a {self.ramp_s:g} s ramp), "
                      f"set-up admission {self.admission}",
                      figures=figures, checks=judge(checks, figures),
                      tables=(self.processes(),))


PROCESS_COLUMNS = ("process", "open files at peak", "RSS at peak MiB", "µs CPU per token")


def slow_cell(lab: LabTarget, streams: int = SLOW_STREAMS, tokens: int = SLOW_TOKENS,
              ramp_s: float = SLOW_RAMP_S) -> SlowCell:
    """Cell c) on a lab whose caps already admit `streams` (see run_slow)."""
    pids = dict(pids_of(lab, "bench scale reads each process's RSS, files and CPU"))
    pids["client"] = os.getpid()
    answer_s = tokens * SLOW_GAP_MS / 1000
    # 5,000 set-ups in 10 s (the default) are more than the 2-core lab sets up
    # at ~5 ms of CPU each across its processes: the ramp is the test of what a
    # burst of set-ups does to the streams already running.
    ramp = ramp_s
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
                                    heartbeat_s=HEARTBEAT_S, token_gap_ms=SLOW_GAP_MS))
    after = {name: meter.read() for name, meter in meters.items()}
    cpu: dict[str, float | None] = {
        name: ProcessTreeMeter.ms_between(before[name], after[name]) for name in meters}
    cpu["client"] = load.client_cpu_ms
    return SlowCell(streams, tokens, load, rss_before, fds_before, sampler.peak_rss,
                    sampler.peak_fds, cpu, os.getloadavg(), ramp_s=ramp)


ADMISSION_COLUMNS = ("admission", "set-ups/s", "completed", "errors", "TTFT p99 ms",
                     "heartbeat late p99 ms", "during the ramp: heartbeat late p99",
                     "token late p99", "load")


def admission_report(cells: list[SlowCell]) -> Report:
    """The cell once per admission mode, side by side: a part each, one table,
    and the last mode's figures and checks as the report's own."""
    rows = tuple((c.admission, c.admission_rate or None, c.load.completed,
                  c.load.figures()["errors"] or None, c.load.ttft_ms.get("p99"),
                  c.load.heartbeat_late_ms.get("p99"),
                  c.load.ramp_heartbeat_late_ms.get("p99"),
                  c.load.ramp_token_late_ms.get("p99"), round(c.loadavg[0], 1))
                 for c in cells)
    parts = tuple(c.report() for c in cells)
    last = parts[-1]
    table = Table("admission", ADMISSION_COLUMNS, rows,
                  caption=f"{cells[-1].streams} slow streams over a {cells[-1].ramp_s:g} s "
                          "ramp, without and with set-up admission in the gateway")
    return Report("bench scale", "slow", story=f"{last.story}; each admission mode in turn",
                  figures=last.figures, checks=last.checks,
                  tables=(table, *last.tables), parts=parts)


def run_slow(lab: LabTarget, streams: int = SLOW_STREAMS, tokens: int = SLOW_TOKENS,
             ramp_s: float = SLOW_RAMP_S, admission: tuple[str, ...] = ADMISSION_MODES,
             admission_rate: float = ADMISSION_RATE_PER_S) -> Report:
    """Cell c) with the caps raised to `streams` and the batched clock, once per
    admission mode (the gateway restarted on each); caps and the gateway's
    admission put back after. A lab still busy with the run's aftermath may
    miss the restart's deadline: the figures are kept and the failure is
    reported beside them."""
    cells: list[SlowCell] = []
    try:
        with lab_settings(lab, streams) as use_clock:
            use_clock("batched")
            for mode in admission:
                rate = admission_rate if mode == "on" else 0.0
                set_admission(lab, rate)
                cell = slow_cell(lab, streams, tokens, ramp_s)
                cell.admission, cell.admission_rate = mode, rate
                cells.append(cell)
    except StartError as exc:
        if not cells:
            raise
        report = admission_report(cells)
        return replace(report, figures={**report.figures, "restore_error": str(exc)})
    return admission_report(cells)


def set_admission(lab: LabTarget, rate: float) -> None:
    """Restart the gateway on `rate` set-ups a second (0: no admission), inside
    lab_settings, which puts the gateway's settings back at its end."""
    from streamlab.lab.local import Lab

    assert isinstance(lab, Lab)  # lab_settings refused any other
    env = lab.options.gateway_env
    if env.get(ADMISSION_ENV) == f"{rate:g}":
        return
    env[ADMISSION_ENV] = f"{rate:g}"
    lab.stop_service("gateway")
    lab.start_service("gateway")
