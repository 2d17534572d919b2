"""LabTarget: both labs are one, told apart by capabilities (no lab needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamlab.compose import ComposeLab
from streamlab.lab import Lab, LabOptions
from streamlab.processes import Running, ServiceSpec
from streamlab.target import LabTarget, MissingCapability, pid_or_none, pids_of
from streamlab.topology import Ports


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


def test_both_labs_share_their_addresses(tmp_path: Path) -> None:
    local, compose = labs(tmp_path)
    ports = Ports.load()

    for lab in (local, compose):
        assert lab.edge_url == f"http://{ports.host}:{ports.edge_port}"
        assert lab.engine_hop == f"{ports.host}:{ports.engine_proxy_port}"
        assert lab.engine_target == f"{ports.host}:{ports.engine_port}"
