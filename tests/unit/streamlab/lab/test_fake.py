"""FakeLab: a LabTarget that starts nothing, records what was asked of its
Toxiproxy and services, and answers the engine's records the test scripted."""

from __future__ import annotations

import pytest

from streamlab.experiments.generation_end import state_name, wait_for_end
from streamlab.lab.fake import FAKE_HOST, FakeLab, ToxiproxyCall
from streamlab.lab.local import LabOptions
from streamlab.lab.target import Capability, LabTarget, MissingCapability, missing, require
from streamlab.lab.toxiproxy import Toxic, ToxiproxyError
from streamlab_protocol.engine.v1 import engine_pb2 as pb

LATENCY = Toxic("latency", {"latency": 100, "jitter": 0})


def as_target(lab: FakeLab) -> LabTarget:
    """mypy checks here that FakeLab satisfies the protocol the real labs do."""
    return lab


def test_its_addresses_follow_the_real_rules_on_a_host_that_never_resolves() -> None:
    lab = as_target(FakeLab(LabOptions(gateways=2, engines=2)))

    assert FAKE_HOST.endswith(".invalid")  # RFC 6761: no resolver answers it
    assert lab.edge_url == f"http://{FAKE_HOST}:{lab.ports.edge_port}"
    assert lab.engine_names == ("engine", "engine-2")
    assert lab.hops_of("engine") == ("engine", "engine-2")
    assert lab.hops_of("edge") == ("edge",)
    assert lab.engine_hop.startswith(f"ipv4:{FAKE_HOST}:")  # both engine hops, balanced
    assert not lab.h2_ready()


def test_it_declares_what_it_has_honestly_and_the_test_may_change_it() -> None:
    one = FakeLab()
    replicated = FakeLab(LabOptions(gateways=2))

    assert Capability.REPLICAS not in one.capabilities
    assert Capability.REPLICAS in replicated.capabilities
    # No processes, no logs: the members those guard say so the way a compose lab's do.
    assert missing(one, {Capability.PIDS, Capability.LOGS, Capability.TOGGLE_HOPS}) == {
        Capability.PIDS, Capability.LOGS}
    assert one.pids is None
    assert one.logs is None

    one.capabilities = one.capabilities | {Capability.PIDS}
    one.fake_pids = {"gateway": 4242}
    assert one.pids == {"gateway": 4242}


def test_a_member_whose_capability_is_off_refuses_with_the_reason() -> None:
    lab = FakeLab(capabilities=())

    with pytest.raises(MissingCapability, match="toxics on the lab's hops: needs the lab's "
                       "toggle_hops"):
        lab.toxiproxy()
    with pytest.raises(MissingCapability, match="engine_record"):
        lab.engine_stats()
    with pytest.raises(MissingCapability, match="stop gateway: needs the lab's "
                       "restart_service"):
        lab.stop_service("gateway")
    with pytest.raises(MissingCapability, match=r"needs the lab's replicas.*--gateways"):
        require(lab, (Capability.REPLICAS,), "replica loss")
    assert lab.service_calls == []


def test_its_toxiproxy_records_every_change_and_refuses_what_toxiproxy_refuses() -> None:
    lab = FakeLab()

    with lab.toxiproxy() as toxiproxy:
        toxiproxy.add_toxic("edge", LATENCY)
        toxiproxy.update_toxic("edge", "latency_downstream", {"latency": 200})
        toxiproxy.set_enabled("engine", False)
        with pytest.raises(ToxiproxyError, match="409"):
            toxiproxy.add_toxic("edge", LATENCY)  # one name per hop, as the real API
        with pytest.raises(ToxiproxyError, match="404"):
            toxiproxy.add_toxic("no-such-hop", LATENCY)
        assert toxiproxy.toxics("edge")[0]["attributes"] == {"latency": 200, "jitter": 0}
        assert lab.fake_toxiproxy.active() == {"edge": ("latency_downstream",)}
        assert lab.fake_toxiproxy.disabled() == ("engine",)
        assert toxiproxy.proxy("engine")["enabled"] is False
        toxiproxy.reset()

    fake = lab.fake_toxiproxy
    assert fake.active() == {}
    assert fake.disabled() == ()
    assert fake.calls == [ToxiproxyCall("add_toxic", "edge", "latency_downstream"),
                          ToxiproxyCall("update_toxic", "edge", "latency_downstream"),
                          ToxiproxyCall("set_enabled", "engine", "off"),
                          ToxiproxyCall("reset")]
    assert fake.closes == 1
    # Every hop the real lab has, and only those.
    assert set(fake.proxies()) == {"edge", "edge-h2", "upstream", "engine"}


def test_its_engine_answers_the_records_the_test_scripted() -> None:
    lab = FakeLab()
    lab.engine.generations.add(request_id="a", state=pb.GENERATION_STATE_CANCELLED,
                               tokens_generated=3)
    lab.engine.generations.add(request_id="b", state=pb.GENERATION_STATE_RUNNING)

    assert [g.request_id for g in lab.engine_stats().generations] == ["a", "b"]
    assert [g.request_id for g in lab.engine_stats("b").generations] == ["b"]
    # The experiments' own reader of the record works on it unchanged.
    record = wait_for_end(lab.engine_stats, "a", timeout_s=0.0)
    assert record is not None
    assert (state_name(record), record.tokens_generated) == ("cancelled", 3)
    # A copy each time: a caller cannot change what the next one reads.
    lab.engine_stats().generations[0].tokens_generated = 99
    assert lab.engine_stats("a").generations[0].tokens_generated == 3


def test_services_stop_and_start_in_the_record_and_the_status() -> None:
    lab = FakeLab(LabOptions(engines=2))

    lab.kill_service("engine-2")
    assert lab.status()["engine-2"]["running"] is False
    assert lab.status()["engine"]["running"] is True
    lab.start_service("engine-2")
    assert lab.status()["engine-2"]["running"] is True
    with pytest.raises(KeyError, match="no service 'engine-3'"):
        lab.stop_service("engine-3")
    assert lab.service_calls == [("kill", "engine-2"), ("start", "engine-2")]


def test_the_services_settings_come_typed_from_the_labs_overrides(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Inherited from the shell, as a service started from it would be...
    monkeypatch.setenv("STREAMLAB_GATEWAY_ENGINE_KEEPALIVE_S", "3")
    monkeypatch.setenv("STREAMLAB_GATEWAY_HEARTBEAT_S", "7")
    # ...under the lab's own overrides, which win.
    options = LabOptions(gateway_env={"STREAMLAB_GATEWAY_HEARTBEAT_S": "1.5"},
                         engine_env={"STREAMLAB_ENGINE_KEEPALIVE_S": "2"})
    lab = as_target(FakeLab(options))

    gateway = lab.options.gateway_settings()
    assert (gateway.heartbeat_s, gateway.engine_keepalive_s) == (1.5, 3.0)
    assert lab.options.engine_settings().keepalive_s == 2.0
