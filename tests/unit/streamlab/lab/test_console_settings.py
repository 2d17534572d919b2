"""ConsoleSettings: lab.env's addresses, the environment's where it sets them."""

from __future__ import annotations

import pytest

from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.topology import Ports


def test_addresses_come_from_the_ports() -> None:
    ports = Ports.load()
    settings = ConsoleSettings.for_ports(ports)
    assert settings.port == ports.console_port
    assert settings.edge_url == f"http://{ports.host}:{ports.edge_port}"
    assert settings.engine_target == f"{ports.host}:{ports.engine_port}"


def test_the_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # What compose does: the server dials service names, the browser the published edge.
    monkeypatch.setenv("STREAMLAB_CONSOLE_ENGINE_TARGET", "engine:50051")
    settings = ConsoleSettings.for_ports(Ports.load())
    assert settings.engine_target == "engine:50051"
    assert settings.edge_url.startswith("http://127.0.0.1:")


def test_settings_round_trip_through_a_process_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = ConsoleSettings.for_ports(Ports.load()).model_copy(update={"port": 1234})
    for key, value in settings.environment().items():
        monkeypatch.setenv(key, value)
    assert ConsoleSettings.for_ports(Ports.load()) == settings
