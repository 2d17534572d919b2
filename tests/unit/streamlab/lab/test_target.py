"""LabTarget: the local and compose labs are one abstraction, told apart by the
capabilities they declare (no lab needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlab.lab.compose import ComposeLab
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.processes import Running, ServiceSpec
from streamlab.lab.target import (
    Capability,
    LabTarget,
    MissingCapability,
    missing,
    pid_or_none,
    pids_of,
    require,
)
from streamlab.lab.topology import Ports


def labs(tmp_path: Path) -> tuple[LabTarget, LabTarget]:
    """A local lab that knows two running services, and a compose lab. Typed as
    LabTarget: mypy checks that both classes satisfy the protocol."""
    local = Lab(Ports.load(), LabOptions(run_dir=tmp_path))
    for name, pid in (("gateway", 101), ("engine", 102)):
        local.running[name] = Running(ServiceSpec(name, []), pid, tmp_path / "logs" / f"{name}.log")
    return local, ComposeLab(Ports.load())


def test_the_local_lab_gives_pids_and_logs(tmp_path: Path) -> None:
    local, _ = labs(tmp_path)

    assert local.pids == {"gateway": 101, "engine": 102}
    assert pid_or_none(local, "gateway") == 101
    assert pid_or_none(local, "nginx") is None  # not running: no pid
    assert local.logs is not None
    assert local.logs["gateway"] == tmp_path / "logs" / "gateway.log"
    assert local.logs["nginx"] == tmp_path / "nginx" / "error.log"  # nginx's own error log


def test_the_compose_lab_has_neither_and_says_so(tmp_path: Path) -> None:
    _, compose = labs(tmp_path)

    assert compose.pids is None
    assert compose.logs is None
    assert pid_or_none(compose, "gateway") is None
    with pytest.raises(MissingCapability, match="the soak reads RSS: needs the lab's pids"):
        pids_of(compose, "the soak reads RSS")


def test_each_lab_declares_what_it_can_give() -> None:
    local, compose = Lab(Ports.load()), ComposeLab(Ports.load())
    shared = {Capability.TOGGLE_HOPS, Capability.ENGINE_RECORD, Capability.RESTART_SERVICE}

    assert local.capabilities == shared | {Capability.PIDS, Capability.LOGS}
    assert compose.capabilities == shared
    # What a capability guards agrees with the declaration.
    for lab in (local, compose):
        assert (lab.pids is not None) == (Capability.PIDS in lab.capabilities)
        assert (lab.logs is not None) == (Capability.LOGS in lab.capabilities)
        assert lab.edge_proxy == "nginx"


def test_replicas_are_declared_only_where_the_lab_runs_several() -> None:
    from streamlab.lab.compose import ComposeSettings

    assert Capability.REPLICAS not in Lab(Ports.load()).capabilities
    assert Capability.REPLICAS in Lab(Ports.load(), LabOptions(engines=2)).capabilities
    replicated = ComposeLab(Ports.load(), ComposeSettings(override=Path("compose.replicas.yaml")))
    assert Capability.REPLICAS in replicated.capabilities


def test_an_experiment_names_what_it_needs_and_learns_what_is_missing(tmp_path: Path) -> None:
    local, compose = labs(tmp_path)
    needs = (Capability.PIDS, Capability.ENGINE_RECORD)

    assert missing(local, needs) == frozenset()
    assert missing(compose, needs) == {Capability.PIDS}
    require(local, needs, "bench scale reads CPU")  # nothing missing: no error
    with pytest.raises(MissingCapability, match=r"bench scale reads CPU: needs the lab's pids.*"
                       r"STREAMLAB_TARGET=local") as raised:
        require(compose, needs, "bench scale reads CPU")
    assert raised.value.capability == Capability.PIDS


def test_both_labs_share_their_addresses(tmp_path: Path) -> None:
    local, compose = labs(tmp_path)
    ports = Ports.load()

    for lab in (local, compose):
        assert lab.edge_url == f"http://{ports.host}:{ports.edge_port}"
        assert lab.engine_hop == f"{ports.host}:{ports.engine_proxy_port}"
        assert lab.engine_target == f"{ports.host}:{ports.engine_port}"


# ---- replicas: what the suite's fixtures fan out over --------------------------------
def test_the_compose_lab_learns_its_replicas_from_the_override_file() -> None:
    from streamlab.lab.compose import ComposeSettings

    plain = ComposeLab(Ports.load(), ComposeSettings())
    replicas = ComposeLab(Ports.load(), ComposeSettings(override=Path("compose.replicas.yaml")))

    assert plain.engine_names == ("engine",)
    assert plain.gateway_names == ("gateway",)
    assert plain.hops_of("engine") == ("engine",)
    # engine-gpu and engine-vllm (compose.yaml's profiles) are no replicas.
    assert replicas.engine_names == ("engine", "engine-2")
    assert replicas.gateway_names == ("gateway", "gateway-2")
    assert replicas.replicas.redis
    assert replicas.hops_of("engine") == ("engine", "engine-2")
    assert replicas.hops_of("upstream") == ("upstream", "upstream-2")
    assert replicas.hops_of("edge") == ("edge",)
    # Each replica where compose.replicas.yaml publishes it: the replica port rule.
    ports = Ports.load()
    assert replicas.port_of("engine-2") == ports.engine_port + ports.replica_port_step
    assert replicas.engine_metrics_url_of("engine-2").endswith(
        f":{ports.engine_metrics_port + ports.replica_port_step}/metrics")


def test_several_engines_stats_are_summed_with_every_record() -> None:
    from streamlab.lab.endpoints import merge_stats
    from streamlab_protocol.engine.v1 import engine_pb2 as pb

    one = pb.GetStatsResponse(
        backend="fake", generations_started=3, generations_active=1, tokens_generated=10,
        generations=[pb.GenerationRecord(request_id="a", state=pb.GENERATION_STATE_RUNNING)],
        load=pb.EngineLoad(running=1, running_limit=30, queue_limit=5))
    two = pb.GetStatsResponse(
        backend="fake", generations_started=4, tokens_generated=7,
        generations=[pb.GenerationRecord(request_id="b", state=pb.GENERATION_STATE_CANCELLED)],
        load=pb.EngineLoad(running=0, running_limit=30, queue_limit=5))

    merged = merge_stats([one, two])

    assert merged.backend == "fake"
    assert (merged.generations_started, merged.generations_active) == (7, 1)
    assert merged.tokens_generated == 17
    assert [g.request_id for g in merged.generations] == ["a", "b"]
    assert merged.generations[1].state == pb.GENERATION_STATE_CANCELLED
    assert (merged.load.running, merged.load.running_limit) == (1, 60)
