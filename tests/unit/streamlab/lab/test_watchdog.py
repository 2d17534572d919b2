"""The watchdog's decisions against FakeLab, with scripted probes: a healthy
process is left alone, a wedged or down one is restarted (kill, then start),
and a lab that cannot restart services gets a clear error instead."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from streamlab.lab.fake import FakeLab
from streamlab.lab.target import Capability
from streamlab.lab.toxiproxy import ToxiproxyError
from streamlab.lab.watchdog import Health, Probe, ToxiproxyWatchdog


def scripted(health_by_port: dict[int, Health]) -> Callable[[str, float], Probe]:
    def probe_api(url: str, timeout_s: float) -> Probe:
        return Probe(health_by_port[int(url.rsplit(":", 1)[1])])
    return probe_api


def test_healthy_processes_are_left_alone() -> None:
    lab = FakeLab()
    ports = lab.ports
    watchdog = ToxiproxyWatchdog(lab, probe_api=scripted(
        {ports.toxiproxy_api_port: "ok", ports.toxiproxy_backend_api_port: "ok"}))
    assert watchdog.check() == []
    assert lab.service_calls == []


@pytest.mark.parametrize("health", ["wedged", "down"])
def test_a_process_that_does_not_answer_is_killed_and_started(health: Health) -> None:
    lab = FakeLab()
    ports = lab.ports
    watchdog = ToxiproxyWatchdog(lab, probe_api=scripted(
        {ports.toxiproxy_api_port: "ok", ports.toxiproxy_backend_api_port: health}))
    [restart] = watchdog.check()
    assert (restart.process, restart.health) == ("toxiproxy-backend", health)
    assert lab.service_calls == [("kill", "toxiproxy-backend"), ("start", "toxiproxy-backend")]
    assert "toxiproxy-backend was " + health in restart.describe()


def test_a_lab_that_cannot_restart_says_so() -> None:
    lab = FakeLab()
    lab.capabilities = lab.capabilities - {Capability.RESTART_SERVICE}
    ports = lab.ports
    watchdog = ToxiproxyWatchdog(lab, probe_api=scripted(
        {ports.toxiproxy_api_port: "wedged", ports.toxiproxy_backend_api_port: "ok"}))
    with pytest.raises(ToxiproxyError, match="is wedged, and this lab cannot restart it"):
        watchdog.check()
