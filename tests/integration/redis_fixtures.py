"""A real redis-server, and two real gateways sharing it in front of one real
engine (the fake model): the replicas of tests/integration/test_resume_store.py.

Every process is started on free ports, waited for with deadlines, and stopped
at the end (and whatever had started is stopped if a later start fails).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from streamlab.lab import processes
from streamlab.lab.endpoints import engine_stats
from streamlab.lab.own_toxiproxy import own_toxiproxy
from streamlab.lab.processes import ServiceSpec, free_ports
from streamlab.lab.topology import REPO_ROOT
from streamlab.lab.toxiproxy import Toxiproxy
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.integration.conftest import TEST_ENGINE_ENV, TEST_GATEWAY_ENV

REDIS_SERVER = Path("/usr/bin/redis-server")


def redis_pings(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(16).startswith(b"+PONG")


@dataclass
class RedisServer:
    """`stop()` and `start()` again on the same port: a store outage."""

    port: int
    run_dir: Path
    running: processes.Running | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        spec = ServiceSpec(
            "redis", [str(REDIS_SERVER), "--port", str(self.port), "--bind", "127.0.0.1",
                      "--save", "", "--appendonly", "no", "--dir", str(self.run_dir)],
            ready=lambda: redis_pings(self.port), ready_timeout_s=10.0)
        self.running = processes.start(spec, self.run_dir)
        try:
            processes.wait_ready(self.running)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.running is not None:
            processes.stop(self.running, grace_s=5.0)
            self.running = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if not REDIS_SERVER.exists():
        pytest.skip(f"{REDIS_SERVER} is not installed (Debian: apt-get install redis-server)")
    server = RedisServer(free_ports(1)[0], tmp_path / "redis")
    server.run_dir.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class StoreHop:
    """A Toxiproxy hop `store` in front of the Redis server, as the lab has:
    gateways given `url` reach Redis through it, and a toxic on it is a fault
    on the network, not on Redis (a black hole drops what is sent, where a
    frozen Redis answers its queued commands once it runs again)."""

    url: str
    toxiproxy: Toxiproxy


@pytest.fixture
def store_hop(redis_server: RedisServer, tmp_path: Path) -> Iterator[StoreHop]:
    with own_toxiproxy({"store": f"127.0.0.1:{redis_server.port}"},
                       tmp_path / "store-hop") as hop, \
            Toxiproxy(hop.api) as toxiproxy:
        yield StoreHop(f"redis://127.0.0.1:{hop.listen['store']}/0", toxiproxy)


def engine_serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


@dataclass
class Replicas:
    engine_target: str
    gateways: dict[str, str] = field(default_factory=dict)  # replica id → base URL
    processes: dict[str, processes.Running] = field(default_factory=dict)  # by name

    def stats(self, request_id: str = "") -> pb.GetStatsResponse:
        return engine_stats(self.engine_target, request_id)


StartReplicas = Callable[..., Replicas]


@pytest.fixture
def start_replicas(tmp_path: Path) -> Iterator[StartReplicas]:
    """`start_replicas(redis_url or None, engine_env=None, **env)`: one engine
    (with `engine_env` added to its environment) and gateways "a" and "b" on
    it, each with the Redis store at that URL (None: the memory store, the
    broken case) and `env`. Everything started is stopped after the test."""
    started: list[processes.Running] = []
    log_dir = tmp_path / "logs"

    def run(spec: ServiceSpec) -> processes.Running:
        started.append(processes.start(spec, log_dir))
        processes.wait_ready(started[-1])
        return started[-1]

    def start(redis_url: str | None, engine_env: dict[str, str] | None = None,
              **env: str) -> Replicas:
        engine_port, port_a, port_b = free_ports(3)
        replicas = Replicas(f"127.0.0.1:{engine_port}")
        run(ServiceSpec("engine", [sys.executable, "-m", "services.engine"],
                        env={"STREAMLAB_ENGINE_HOST": "127.0.0.1",
                             "STREAMLAB_ENGINE_PORT": str(engine_port), **TEST_ENGINE_ENV,
                             **(engine_env or {})},
                        ready=lambda: engine_serving(replicas.engine_target), cwd=REPO_ROOT))
        store = ({"STREAMLAB_GATEWAY_RESUME_STORE": "redis",
                  "STREAMLAB_GATEWAY_REDIS_URL": redis_url} if redis_url else {})
        for name, port in (("a", port_a), ("b", port_b)):
            url = f"http://127.0.0.1:{port}"
            replicas.processes[name] = run(ServiceSpec(
                f"gateway-{name}", [sys.executable, "-m", "services.gateway"],
                env={**TEST_GATEWAY_ENV, "STREAMLAB_GATEWAY_HOST": "127.0.0.1",
                     "STREAMLAB_GATEWAY_PORT": str(port),
                     "STREAMLAB_GATEWAY_ENGINE_TARGET": replicas.engine_target,
                     "STREAMLAB_GATEWAY_ALLOW_BROKEN_MODES": "true",
                     "STREAMLAB_GATEWAY_REPLICA_ID": name, **store, **env},
                ready=lambda url=url: httpx.get(f"{url}/healthz", timeout=1.0)  # type: ignore[misc]
                .status_code == 200,
                cwd=REPO_ROOT))
            replicas.gateways[name] = url
        return replicas

    try:
        yield start
    finally:
        for running in reversed(started):
            processes.stop(running, grace_s=5.0)


def create_stream(http: httpx.Client, base_url: str, body: dict[str, Any]) -> str:
    """POST /v1/streams on one replica; the new stream's id (201 or the test fails)."""
    response = http.post(f"{base_url}/v1/streams", json=body)
    assert response.status_code == 201, response.text
    stream_id: str = response.json()["id"]
    return stream_id
