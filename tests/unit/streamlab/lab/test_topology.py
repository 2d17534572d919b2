"""The replica port rule and hop names (streamlab/lab/topology.py, lab.env)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamlab.lab import nginx
from streamlab.lab.topology import (
    Ports,
    Replicas,
    ToxiproxyRuntime,
    hops,
    is_hop_name,
    replica_name,
    replica_port,
    split_replica,
)


@pytest.fixture
def ports() -> Ports:
    return Ports.load()


def test_replica_k_listens_step_times_k_minus_one_above_the_base(ports: Ports) -> None:
    step = ports.replica_port_step
    assert replica_port(ports, ports.gateway_port, 1) == ports.gateway_port
    assert replica_port(ports, ports.gateway_port, 3) == ports.gateway_port + 2 * step


def test_one_replica_keeps_the_four_hops_of_old(ports: Ports) -> None:
    assert [h.name for h in hops(ports)] == ["edge", "edge-h2", "upstream", "engine"]


def test_each_replica_has_its_own_hop_and_each_gateway_its_store_hop(ports: Ports) -> None:
    by_name = {h.name: h for h in hops(ports, Replicas(gateways=3, engines=2, redis=True))}
    assert list(by_name) == ["edge", "edge-h2", "upstream", "upstream-2", "upstream-3",
                             "engine", "engine-2", "store", "store-2", "store-3"]
    step = ports.replica_port_step
    assert by_name["upstream-3"].listen_port == ports.upstream_port + 2 * step
    assert by_name["upstream-3"].upstream_port == ports.gateway_port + 2 * step
    assert by_name["engine-2"].upstream_port == ports.engine_port + step
    assert by_name["store"].upstream_port == by_name["store-3"].upstream_port == ports.redis_port
    assert by_name["store-2"].listen_port == ports.store_proxy_port + step


@pytest.mark.parametrize(("name", "expected"), [
    ("gateway", ("gateway", 1)), ("gateway-2", ("gateway", 2)),
    ("engine-12", ("engine", 12)), ("edge-h2", ("edge-h2", 1))])
def test_replica_names_split_back(name: str, expected: tuple[str, int]) -> None:
    assert split_replica(name) == expected
    assert replica_name(*expected) == name


def test_hop_names_of_replicas_are_known_and_others_not() -> None:
    assert all(map(is_hop_name, ("edge", "upstream-2", "engine-3", "store", "store-2")))
    assert not any(map(is_hop_name, ("gateway-2", "upstream-1", "nope", "edge-2")))


def test_nginx_balances_several_gateways_least_conn_and_one_as_before(ports: Ports) -> None:
    assert nginx.upstream_servers(ports, 1) == f"server {ports.host}:{ports.upstream_port};"
    two = nginx.upstream_servers(ports, 2)
    assert two.splitlines()[0] == "least_conn;"
    assert "least_conn" not in nginx.upstream_servers(ports, 2, "round_robin")
    assert "non_idempotent" in nginx.upstream_retry(2)
    assert "non_idempotent" not in nginx.upstream_retry(1)


def test_a_port_offset_moves_every_listener_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMLAB_PORT_OFFSET", raising=False)
    base = Ports.load()
    monkeypatch.setenv("STREAMLAB_PORT_OFFSET", "1000")
    moved = Ports.load()
    for name, value in base.model_dump().items():
        expected = value + 1000 if name.endswith("_port") else value
        assert getattr(moved, name) == expected, name
    # The replica rule still holds on top of it.
    assert replica_port(moved, moved.gateway_port, 2) == base.gateway_port + 1000 + \
        base.replica_port_step


@pytest.mark.parametrize("text", ["ten", "-5", "1.5", "65000"])
def test_a_port_offset_that_cannot_be_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("STREAMLAB_PORT_OFFSET", text)
    with pytest.raises(ValueError, match="STREAMLAB_PORT_OFFSET"):
        Ports.load()


def test_toxiproxy_runs_as_lab_env_says_and_a_variable_overrides_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STREAMLAB_TOXIPROXY_GOMAXPROCS", raising=False)
    monkeypatch.delenv("STREAMLAB_TOXIPROXY_LOG_LEVEL", raising=False)
    assert ToxiproxyRuntime().environment() == {"GOMAXPROCS": "1", "LOG_LEVEL": "info"}
    monkeypatch.setenv("STREAMLAB_TOXIPROXY_GOMAXPROCS", "2")
    monkeypatch.setenv("STREAMLAB_TOXIPROXY_LOG_LEVEL", "debug")
    assert ToxiproxyRuntime().environment() == {"GOMAXPROCS": "2", "LOG_LEVEL": "debug"}


@pytest.mark.parametrize(("key", "value"), [("GOMAXPROCS", "0"), ("GOMAXPROCS", "many"),
                                            ("LOG_LEVEL", "verbose")])
def test_a_toxiproxy_setting_that_cannot_be_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch, key: str, value: str) -> None:
    monkeypatch.setenv(f"STREAMLAB_TOXIPROXY_{key}", value)
    with pytest.raises(ValidationError, match=key.lower()):
        ToxiproxyRuntime()
