"""A lab whose engine streams from an OpenAI-compatible upstream, and that upstream.

The upstream is the lab's own kind of server: a second engine (the fake model)
and gateway, as real processes on free ports. The outer lab's engine runs the
`openai` backend against that gateway, so every test crosses two gateways and
two engines, and the inner engine's counters show what reached the "model".

    client ─▶ edge ─▶ nginx ─▶ gateway ─▶ engine (openai) ─SSE─▶ gateway ─▶ engine (fake)
              └──────────── openai_lab ─────────────────┘        └── upstream_pair ──┘
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamlab.lab import processes
from streamlab.lab.endpoints import engine_stats
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.processes import Running, ServiceSpec, free_ports
from streamlab.lab.topology import REPO_ROOT
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import TEST_HEARTBEAT_S, free_lab_ports

# The inner engine's limit is below the outer one's: a request between the two
# passes the outer engine and is refused upstream (an error to map back).
UPSTREAM_MAX_TOKENS = 1000
UPSTREAM_MODEL = "inner-fake"


@dataclass
class UpstreamPair:
    engine_port: int
    gateway_port: int
    log_dir: Path
    running: dict[str, Running]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}/v1"

    def specs(self) -> dict[str, ServiceSpec]:
        return {
            "upstream-engine": ServiceSpec(
                "upstream-engine", [sys.executable, "-m", "services.engine"],
                env={"STREAMLAB_ENGINE_HOST": "127.0.0.1",
                     "STREAMLAB_ENGINE_PORT": str(self.engine_port),
                     "STREAMLAB_ENGINE_BACKEND": "fake",
                     "STREAMLAB_ENGINE_MAX_TOKENS_LIMIT": str(UPSTREAM_MAX_TOKENS)},
                ready=self.engine_healthy, cwd=REPO_ROOT),
            "upstream-gateway": ServiceSpec(
                "upstream-gateway", [sys.executable, "-m", "services.gateway"],
                env={"STREAMLAB_GATEWAY_HOST": "127.0.0.1",
                     "STREAMLAB_GATEWAY_PORT": str(self.gateway_port),
                     "STREAMLAB_GATEWAY_ENGINE_TARGET": f"127.0.0.1:{self.engine_port}",
                     "STREAMLAB_GATEWAY_HEARTBEAT_S": str(TEST_HEARTBEAT_S),
                     "STREAMLAB_GATEWAY_MODEL_NAME": UPSTREAM_MODEL},
                ready=lambda: httpx.get(f"http://127.0.0.1:{self.gateway_port}/healthz",
                                        timeout=1.0).status_code == 200,
                cwd=REPO_ROOT),
        }

    def start(self, name: str) -> None:
        running = processes.start(self.specs()[name], self.log_dir)
        self.running[name] = running
        processes.wait_ready(running)

    def stop(self, name: str, grace_s: float = 5.0) -> None:
        running = self.running.pop(name, None)
        if running is not None:
            processes.stop(running, grace_s=grace_s)

    def engine_healthy(self) -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{self.engine_port}") as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1.0)
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def engine_stats(self, request_id: str = "") -> pb.GetStatsResponse:
        return engine_stats(f"127.0.0.1:{self.engine_port}", request_id)


@pytest.fixture(scope="session")
def upstream_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamPair]:
    engine_port, gateway_port = free_ports(2)
    pair = UpstreamPair(engine_port, gateway_port, tmp_path_factory.mktemp("upstream-logs"), {})
    try:
        pair.start("upstream-engine")
        pair.start("upstream-gateway")
        yield pair
    finally:
        for name in ("upstream-gateway", "upstream-engine"):
            pair.stop(name)


@pytest.fixture(scope="session")
def openai_lab(upstream_pair: UpstreamPair,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    ports = free_lab_ports()
    options = LabOptions(
        run_dir=tmp_path_factory.mktemp("openai-lab"),
        engine_env={"STREAMLAB_ENGINE_BACKEND": "openai",
                    "STREAMLAB_OPENAI_BASE_URL": upstream_pair.base_url,
                    "STREAMLAB_OPENAI_MODEL": UPSTREAM_MODEL,
                    # The upstream is a streamlab gateway: let tests shape its fake model.
                    "STREAMLAB_OPENAI_FORWARD_STREAMLAB_TIMING": "true",
                    "STREAMLAB_OPENAI_READ_TIMEOUT_S": "10"},
        gateway_env={"STREAMLAB_GATEWAY_HEARTBEAT_S": str(TEST_HEARTBEAT_S)},
    )
    lab = Lab(ports, options)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()
