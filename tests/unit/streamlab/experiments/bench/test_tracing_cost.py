"""bench scale's cell g (tracing off / on / sampled, side by side): the modes'
environments and the report's arithmetic, on scripted rounds (no lab)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from services.common.tracing import tracing_configured
from streamlab.experiments.bench.load import LoadResult
from streamlab.experiments.bench.setup_cost import CellCost, SetupRun
from streamlab.experiments.bench.tracing_cost import (
    BEFORE,
    TracingRound,
    baseline_tree,
    check_mode,
    mode_env,
    tracing_report,
)

TRACED_LAB = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
              "STREAMLAB_LOG_FORMAT": "json"}


def test_off_is_a_lab_without_tracing_and_a_ratio_samples() -> None:
    assert not tracing_configured({**TRACED_LAB, **mode_env("off")})
    assert mode_env("off")["STREAMLAB_LOG_FORMAT"] == "text"
    assert tracing_configured({**TRACED_LAB, **mode_env("on")})
    sampled = {**TRACED_LAB, **mode_env("0.1")}
    assert tracing_configured(sampled)
    assert (sampled["OTEL_TRACES_SAMPLER"], sampled["OTEL_TRACES_SAMPLER_ARG"]) == (
        "parentbased_traceidratio", "0.1")
    for bad in ("sometimes", "0", "1.5"):
        with pytest.raises(ValueError, match="tracing"):
            check_mode(bad)


def _run(gateway_ms: float, gateway_paced_ms: float) -> SetupRun:
    """1,000 set-ups costing `gateway_ms` each; 10 paced streams of 100 tokens
    whose cell costs their set-ups plus `gateway_paced_ms`."""
    setup = CellCost(LoadResult(streams=1000, completed=1000, tokens=2000, client_cpu_ms=500.0),
                     {"gateway": gateway_ms * 1000, "engine": 1000.0, "toxiproxy": None,
                      "nginx": 300.0})
    paced = CellCost(LoadResult(streams=10, completed=10, tokens=1000, client_cpu_ms=20.0),
                     {"gateway": 10 * gateway_ms + gateway_paced_ms, "engine": 60.0,
                      "toxiproxy": None, "nginx": 20.0})
    return SetupRun(1000, 100.0, setup, {}, (10, 100, 20), paced)


def test_the_cost_is_on_minus_off_beside_offs_own_spread() -> None:
    report = tracing_report([
        TracingRound(1, "off", _run(1.0, 50.0)), TracingRound(1, "on", _run(1.3, 70.0)),
        TracingRound(2, "on", _run(1.5, 90.0)), TracingRound(2, "off", _run(1.1, 60.0))])
    figures = report.figures
    assert figures["setup_ms_gateway_off"] == 1.05
    assert figures["setup_ms_gateway_on"] == 1.4
    assert figures["tracing_cost_setup_ms_gateway_on"] == 0.35
    assert figures["off_spread_setup_ms_gateway"] == 0.1
    # Paced: 50 and 60 µs a token off, 70 and 90 on.
    assert figures["paced_us_gateway_off"] == 55.0
    assert figures["tracing_cost_paced_us_gateway_on"] == 25.0
    assert figures["tracing_ratio_paced_us_gateway_on"] == 1.45
    assert figures["setup_ms_toxiproxy_off"] is None
    cost, rounds = report.tables
    assert cost.columns[-2:] == ("on − off", "off's spread")
    assert [row[1] for row in rounds.rows] == ["off", "on", "on", "off"]


def test_before_runs_a_revisions_services_with_tracing_off(tmp_path: Path) -> None:
    """The `before` mode's tree is the revision's services and wire, nothing
    checked out; its env puts that tree first and the clone off sys.path."""
    if shutil.which("git") is None or not (Path(__file__).parents[5] / ".git").exists():
        pytest.skip("needs git and a clone (an installed wheel has neither)")
    tree = baseline_tree("HEAD", tmp_path)
    assert (tree / "services" / "gateway" / "app.py").is_file()
    assert (tree / "streamlab_protocol" / "engine" / "v1" / "engine_pb2.py").is_file()
    assert not (tree / "streamlab").exists()
    env = mode_env(BEFORE, tree)
    assert (env["PYTHONSAFEPATH"], env["PYTHONPATH"]) == ("1", str(tree))
    assert not tracing_configured({**TRACED_LAB, **env})
    with pytest.raises(ValueError, match="baseline"):
        mode_env(BEFORE)
