"""What uvicorn is told, from the gateway's settings: the accept queue sized for
bursts of thousands of new streams, and no access-log line per response unless
asked (nginx in front logs every request; at 2,500 set-ups at once the
gateway's own lines cost its one worker 1.9 s of 57 on the 504s alone,
docs/results/profile-gateway-2500-slow-streams.txt)."""

from __future__ import annotations

from services.gateway.app import create_app
from services.gateway.server import uvicorn_config
from services.gateway.settings import GatewaySettings
from tests.unit.gateway.scripted_engine import ScriptedEngine


def _config(**settings: object) -> tuple[bool, int]:
    gateway = GatewaySettings(**settings)  # type: ignore[arg-type]
    config = uvicorn_config(create_app(gateway, engine=ScriptedEngine()), gateway)
    return config.access_log, config.backlog


def test_access_log_is_off_by_default_and_on_when_asked() -> None:
    assert _config()[0] is False
    assert _config(access_log=True)[0] is True


def test_backlog_holds_a_burst_of_thousands_of_streams() -> None:
    assert _config()[1] >= 5000  # uvicorn's own default, 2048, is less than half a burst
    assert _config(backlog=100)[1] == 100
