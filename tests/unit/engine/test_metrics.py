"""The engine's /metrics registry follows the gateway's conventions: no
`*_created` series, and the process metrics a default registry would carry."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest

from services.engine.admission import Admission
from services.engine.metrics import EngineMetrics
from services.engine.stats import EngineStats
from streamlab_protocol.generation import GenerationState


def exposition(metrics: EngineMetrics) -> list[str]:
    return [line for line in generate_latest(metrics.registry).decode().splitlines()
            if not line.startswith("#")]


def test_no_created_series_after_steps_waits_and_generations() -> None:
    metrics, stats = EngineMetrics(), EngineStats(history=4)
    metrics.watch(stats, Admission(2, 2))
    stats.end(stats.begin("r"), GenerationState.COMPLETED)
    metrics.step(0.02, 3)
    metrics.queue_wait.observe(0.001)
    lines = exposition(metrics)
    assert "streamlab_engine_decode_step_seconds_count 1.0" in lines
    assert 'streamlab_engine_generations_total{outcome="completed"} 1.0' in lines
    assert [line for line in lines if "_created" in line] == []


def test_the_registry_carries_the_process_metrics() -> None:
    names = {line.split("{")[0].split(" ")[0] for line in exposition(EngineMetrics())}
    assert "python_info" in names
    if Path("/proc/self/stat").exists():  # ProcessCollector reads Linux's /proc
        assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
