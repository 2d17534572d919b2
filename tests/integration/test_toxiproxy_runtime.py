"""The lab's two Toxiproxy processes run as lab.env says (`ToxiproxyRuntime`):
one Go scheduler thread, and info-level logs rather than every level."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from streamlab.lab.local import Lab
from streamlab.lab.topology import TOXIPROXY_PROCESSES, ToxiproxyRuntime

pytestmark = [pytest.mark.integration,
              pytest.mark.local_only("reads the local processes' /proc and log files")]


def environment_of(pid: int) -> dict[str, str]:
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode(errors="replace").split("=", 1) for e in entries if b"=" in e)


def test_each_toxiproxy_process_has_lab_env_s_scheduler_and_log_level(lab: Lab) -> None:
    want = ToxiproxyRuntime().environment()
    for process in TOXIPROXY_PROCESSES:
        got = environment_of(lab.pids[process])
        assert {key: got.get(key) for key in want} == want, process


def test_connections_through_the_edge_log_at_info_and_nothing_finer(lab: Lab) -> None:
    log = lab.logs["toxiproxy"]
    start = log.stat().st_size
    # Two connections, one after the other: Toxiproxy's accept loop logs a
    # connection's set-up (debug, when on) before it accepts the next, so once
    # the second accept is in the log the first's set-up lines are too.
    for _ in range(2):
        with httpx.Client(timeout=10.0) as client:
            client.get(f"{lab.edge_url}/healthz").raise_for_status()
    deadline = time.monotonic() + 10.0
    lines: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        with log.open("rb") as f:
            f.seek(start)
            lines = [json.loads(line) for line in f.read().splitlines() if line.startswith(b"{")]
        if sum(line.get("message") == "Accepted client" for line in lines) >= 2:
            break
        time.sleep(0.05)
    assert sum(line.get("message") == "Accepted client" for line in lines) >= 2, lines
    assert not [line for line in lines if line.get("level") in ("trace", "debug")]
