"""What a run cost, read from outside the client: wire bytes and server CPU.

Bytes come from Toxiproxy's `-proxy-metrics` counters on one proxy (the
`edge`, where clients connect): everything on the wire, headers, chunk
framing and WebSocket frame headers included, which the client's own
libraries never show. CPU comes from the kernel's accounting of each server
process (user + system), read with psutil before and after: `CpuMeter` for one
process, `ProcessTreeMeter` for one and its children (nginx's workers), which
every bench that prices a token or a set-up per process shares.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from streamlab.lab.toxiproxy import ToxiproxyClient

# The processes on the path, in the order a token crosses them (client last):
# the lab's pids by these names, and the bench's own process.
PROCESSES = ("engine", "toxiproxy", "toxiproxy-backend", "gateway", "nginx", "client")

_SAMPLE = re.compile(r'^(toxiproxy_proxy_(?:received|sent)_bytes_total)\{([^}]*)\}\s+(\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class WireBytes:
    up: int  # client → server, as Toxiproxy read it from the client
    down: int  # server → client, as Toxiproxy wrote it to the client

    def __sub__(self, other: WireBytes) -> WireBytes:
        return WireBytes(self.up - other.up, self.down - other.down)


def parse_wire_bytes(metrics_text: str, proxy: str) -> WireBytes:
    up = down = 0
    for line in metrics_text.splitlines():
        match = _SAMPLE.match(line.strip())
        if match is None:
            continue
        name, labels_text, value = match.groups()
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("proxy") != proxy:
            continue
        if name.endswith("received_bytes_total") and labels.get("direction") == "upstream":
            up = int(float(value))
        elif name.endswith("sent_bytes_total") and labels.get("direction") == "downstream":
            down = int(float(value))
    return WireBytes(up, down)


class WireMeter:
    """Bytes through one Toxiproxy proxy between two readings."""

    def __init__(self, toxiproxy: ToxiproxyClient, proxy: str = "edge") -> None:
        self._toxiproxy = toxiproxy
        self.proxy = proxy

    def read(self) -> WireBytes:
        return parse_wire_bytes(self._toxiproxy.metrics(), self.proxy)

    def settled(self, timeout_s: float = 1.0) -> WireBytes:
        """A reading once the counters stop moving: Toxiproxy counts a write just
        after it, so the last bytes the client read may land a moment later."""
        last = self.read()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.02)
            now = self.read()
            if now == last:
                return now
            last = now
        return last


class CpuMeter:
    """CPU time a process has used, in seconds; None when it is gone.

    The kernel's per-thread scheduler accounting (/proc/PID/task/*/schedstat,
    nanoseconds) is summed over the process's threads: psutil's user+system
    comes in 10 ms clock ticks, coarser than a whole 50-token stream costs the
    gateway. A thread that ended between two readings takes its time with it,
    so then the reading falls back to the tick-based total.
    """

    def __init__(self, pid: int | None) -> None:
        self._pid = pid
        self._process = psutil.Process(pid) if pid else None

    def read(self) -> CpuReading | None:
        if self._process is None or self._pid is None:
            return None
        try:
            times = self._process.cpu_times()
        except psutil.Error:
            return None
        threads: dict[str, int] = {}
        task_dir = Path(f"/proc/{self._pid}/task")
        with contextlib.suppress(OSError):
            for task in task_dir.iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    threads[task.name] = int((task / "schedstat").read_text().split()[0])
        return CpuReading(float(times.user + times.system), threads)


@dataclass(frozen=True)
class CpuReading:
    ticks_s: float
    threads_ns: dict[str, int]

    def seconds_since(self, before: CpuReading) -> float:
        if self.threads_ns and set(before.threads_ns) <= set(self.threads_ns):
            return sum(self.threads_ns[t] - before.threads_ns.get(t, 0)
                       for t in self.threads_ns) / 1e9
        return self.ticks_s - before.ticks_s


def cpu_ms(before: CpuReading | None, after: CpuReading | None) -> float | None:
    if before is None or after is None:
        return None
    return after.seconds_since(before) * 1000


class ProcessTreeMeter:
    """CPU of a process and its children (nginx's workers), summed per thread."""

    def __init__(self, pid: int) -> None:
        self._pids = [pid]
        with contextlib.suppress(psutil.Error):
            self._pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
        self._meters = [CpuMeter(p) for p in self._pids]

    def read(self) -> list[CpuReading | None]:
        return [m.read() for m in self._meters]

    @staticmethod
    def ms_between(before: list[CpuReading | None], after: list[CpuReading | None]
                   ) -> float | None:
        total, seen = 0.0, False
        for b, a in zip(before, after, strict=True):
            if b is not None and a is not None:
                total += a.seconds_since(b) * 1000
                seen = True
        return total if seen else None
