"""The gateway's channel to several engines: round_robin, health-checked
(services/gateway/engine_client.py; shown on real processes in
tests/integration/test_replicas.py)."""

from __future__ import annotations

import json

from services.gateway.engine_client import attach_verdict, balanced_target, engine_service_config
from services.gateway.errors import EngineError
from services.gateway.settings import GatewaySettings


def test_one_engine_keeps_grpc_default_pick_first() -> None:
    assert engine_service_config(GatewaySettings(engine_target="127.0.0.1:8473")) is None


def test_several_engines_get_round_robin_with_health_checks() -> None:
    settings = GatewaySettings(engine_target="ipv4:127.0.0.1:8473,127.0.0.1:8483")
    config = json.loads(engine_service_config(settings) or "{}")
    assert config == {"loadBalancingConfig": [{"round_robin": {}}],
                      "healthCheckConfig": {"serviceName": ""}}


def test_health_checks_and_balancing_can_be_turned_off_to_show_what_they_do() -> None:
    target = "ipv4:127.0.0.1:1,127.0.0.1:2"
    unchecked = GatewaySettings(engine_target=target, engine_health_checks=False)
    assert "healthCheckConfig" not in json.loads(engine_service_config(unchecked) or "{}")
    assert engine_service_config(
        GatewaySettings(engine_target=target, engine_balancing="pick_first")) is None


def test_a_list_of_names_becomes_an_ipv4_target_and_others_stay() -> None:
    assert balanced_target("localhost:1,127.0.0.1:2") == "ipv4:127.0.0.1:1,127.0.0.1:2"
    assert balanced_target("ipv4:10.0.0.1:5,10.0.0.2:5") == "ipv4:10.0.0.1:5,10.0.0.2:5"
    assert balanced_target("engine:50051") == "engine:50051"



def verdict_of(statuses: tuple[int, ...]) -> int:
    """The status an Attach ends with when the engines, asked in turn, refuse it so."""
    verdict = None
    for status in statuses:
        code = "not_found" if status == 404 else "unavailable"
        verdict = attach_verdict(verdict, EngineError(status, code, "engine says no"))
    assert verdict is not None
    return verdict.status_code


def test_an_attach_is_refused_for_good_only_when_every_engine_said_404() -> None:
    # The owner's hop still reconnecting after a blip (503) while the other
    # engine says 404: the owner may hold it, so the caller tries again. The
    # multiplexed wire once kept the 404 and ended a stream the blip had spared.
    for statuses in ((503, 404), (404, 503), (404, 504, 404)):
        assert verdict_of(statuses) != 404, statuses
    assert verdict_of((404, 404)) == 404
