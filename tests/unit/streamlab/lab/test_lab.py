"""Lab.down stops what the lab runs, even services another process restarted
(real processes: `sleep`, each in its own session as the lab starts services)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.processes import Running, ServiceSpec, StartError, pid_alive
from streamlab.lab.topology import Ports


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)


@contextlib.contextmanager
def restarted_elsewhere(tmp_path: Path, name: str) -> Iterator[tuple[Lab, subprocess.Popen[bytes]]]:
    """A lab that started `name`; another process (`streamlab bench cancel
    --background`, attached to this lab's run dir) stopped it, started a new
    one and saved its pid in state.json. Yields the lab and the new process."""
    lab = Lab(Ports.load(), LabOptions(run_dir=tmp_path))
    first = _sleeper()
    lab.running[name] = Running(ServiceSpec(name, []), first.pid,
                                tmp_path / f"{name}.log", popen=first)
    first.kill()
    first.wait()
    restarted = _sleeper()
    (tmp_path / "state.json").write_text(json.dumps({"services": {
        name: {"pid": restarted.pid, "log": str(tmp_path / f"{name}.log")}}}))
    try:
        yield lab, restarted
    finally:
        restarted.kill()
        restarted.wait()


def test_down_stops_a_service_that_another_process_restarted(tmp_path: Path) -> None:
    with restarted_elsewhere(tmp_path, "gateway") as (lab, restarted):
        lab.down(grace_s=1.0)
        assert restarted.wait(timeout=5) is not None
        assert not pid_alive(restarted.pid)


def test_a_service_another_process_restarted_is_signalled_by_its_new_pid(
    tmp_path: Path,
) -> None:
    # The suite's engine, restarted from a subprocess: a test that then stops it
    # must reach the new process, not the pid the lab started it with.
    with restarted_elsewhere(tmp_path, "engine") as (lab, restarted):
        assert lab.pids["engine"] == restarted.pid
        lab.kill_service("engine")
        assert restarted.wait(timeout=5) is not None


def test_lab_env_gives_every_listener_of_a_replica_lab_its_own_port(tmp_path: Path) -> None:
    """lab.env's ports, 3 gateways and 3 engines on Redis (each gateway's
    store hop too), with and without tracing: no two listeners on one port.
    (Jaeger's ports once sat on upstream-2's and engine-2's.)"""
    for tracing in (False, True):
        lab = Lab(Ports.load(), LabOptions(run_dir=tmp_path, gateways=3, engines=3,
                                           store="redis", tracing=tracing))
        refused = ""
        try:
            lab.check_ports_free()
        except StartError as exc:  # a lab up on these ports is fine: not a clash
            refused = str(exc)
        assert "used twice" not in refused, refused
