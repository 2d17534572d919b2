"""`streamlab logs` on a running lab: every service's log as one document, and
`-f` printing each new line until Ctrl-C (then exit 0)."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from streamlab.lab.target import LabTarget

CLI = [sys.executable, "-m", "streamlab.cli"]


def test_logs_json_holds_every_service_s_last_lines(lab: LabTarget) -> None:
    if lab.logs is None:
        pytest.skip("the compose lab's logs are `docker compose logs`'s")
    done = subprocess.run([*CLI, "logs", "--tail", "3", "--json", "--run-dir", str(lab.run_dir)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    logs = json.loads(done.stdout)["logs"]
    assert set(logs) == set(lab.logs)
    assert all(len(entry["lines"]) <= 3 for entry in logs.values())


def test_logs_follow_prints_new_lines_until_ctrl_c(lab: LabTarget) -> None:
    if lab.logs is None:
        pytest.skip("the compose lab's logs are `docker compose logs`'s")
    log = lab.logs["gateway"]
    marker = f"streamlab-logs-test {uuid.uuid4().hex}"
    follower = subprocess.Popen([*CLI, "logs", "gateway", "-f", "--tail", "0", "--run-dir",
                                 str(lab.run_dir)], stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in follower.stdout or ():
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        seen, deadline = False, time.monotonic() + 30
        # The follower reads from where the log ends when it starts: write until it sees one.
        while not seen and time.monotonic() < deadline:
            with log.open("a") as out:
                out.write(f"{marker}\n")
            try:
                seen = marker in lines.get(timeout=0.5)
            except queue.Empty:
                continue
        assert seen, "the follower never printed a line written after it started"
    finally:
        follower.send_signal(signal.SIGINT)
        code = follower.wait(timeout=15)
        reader.join(timeout=5)  # at the pipe's end once the follower is gone
        if follower.stdout is not None:
            follower.stdout.close()
    assert code == 0
