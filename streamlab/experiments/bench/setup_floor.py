"""The gRPC floor cell of `bench setup`: the same two-token set-ups, at the same
rate, between two bare grpc.aio processes (servers/grpc_floor.py) that do
nothing else. Its server's CPU per stream is the least the engine can spend
on this wire; its client's, the least the gateway's gRPC side can. Run beside
the lab's own cell, on the same machine in the same run, so a set-up figure
reads against what the transport alone costs there (docs/cost.md)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from streamlab.errors import StreamlabError
from streamlab.experiments.bench.probes import ProcessTreeMeter
from streamlab.lab import processes
from streamlab.lab.processes import ServiceSpec

MODULE = "streamlab.experiments.bench.servers.grpc_floor"
IDLE_S = 1.0  # the server's idle spell, before the drive


class FloorError(StreamlabError, RuntimeError):
    """The floor's processes did not run to the end (the message says where)."""


@dataclass(frozen=True)
class FloorRun:
    streams: int
    completed: int
    # SessionEvents the client read per completed stream (1: everything at once).
    messages_per_stream: float
    server_ms: float | None  # CPU per stream, idle taken off: the engine's floor
    client_ms: float  # the same for the client: the gateway's gRPC side's floor


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def run_floor(streams: int, rate: float, log_dir: Path) -> FloorRun:
    """Start the bare server, drive `streams` set-ups at `rate` through it from
    a bare client process, read both processes' CPU; always stop the server."""
    [port] = processes.free_ports(1)
    spec = ServiceSpec("bench-grpc-floor",
                       [sys.executable, "-m", MODULE, "serve", "--port", str(port)],
                       ready=lambda: _listening(port))
    running = processes.start(spec, log_dir)
    try:
        processes.wait_ready(running)
        meter = ProcessTreeMeter(running.pid)
        # The quiet spell is the measurement itself (the idle rate), not a wait.
        first, started = meter.read(), time.monotonic()
        time.sleep(IDLE_S)
        idle_ms = ProcessTreeMeter.ms_between(first, meter.read())
        idle_per_s = None if idle_ms is None else idle_ms / (time.monotonic() - started)
        before, started = meter.read(), time.monotonic()
        timeout_s = 60 + streams / rate * 3
        done = subprocess.run(
            [sys.executable, "-m", MODULE, "drive", "--target", f"127.0.0.1:{port}",
             "--streams", str(streams), "--rate", str(rate), "--timeout-s", str(timeout_s)],
            capture_output=True, text=True, timeout=timeout_s + 30, check=False)
        server_ms = ProcessTreeMeter.ms_between(before, meter.read())
        wall_s = time.monotonic() - started
    finally:
        processes.stop(running, grace_s=3.0)
    if done.returncode != 0:
        raise FloorError(f"the gRPC floor's client failed ({done.returncode}): "
                         f"{done.stderr.strip()[-800:]}")
    drove = json.loads(done.stdout)
    completed = int(drove["completed"])
    if not completed:
        raise FloorError("the gRPC floor's client completed no stream")
    if server_ms is not None and idle_per_s is not None:
        # The client's own start is inside wall_s: the server idled through it.
        server_ms -= idle_per_s * wall_s
    return FloorRun(streams=streams, completed=completed,
                    messages_per_stream=round(drove["messages"] / completed, 2),
                    server_ms=None if server_ms is None else server_ms / completed,
                    client_ms=float(drove["cpu_ms"]) / completed)
