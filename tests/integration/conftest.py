"""Fixtures that bring the real topology up on free ports and always take it down.

Every setting is an overridable fixture (`lab_options`, `lab_ports`), the lab
waits for readiness with deadlines, and a failed start stops whatever had
started. With STREAMLAB_TARGET=compose the same tests run against a running
compose project instead (see `lab`). Toxics are reset after every test so one
test's fault never leaks into the next.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from services.gateway.settings import GatewaySettings
from streamlab.lab import processes
from streamlab.lab.compose import ComposeLab, selected_target
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.nginx import NginxOptions
from streamlab.lab.processes import ServiceSpec, free_ports
from streamlab.lab.spare_ports import free_lab_ports as free_lab_ports_for
from streamlab.lab.target import LabTarget
from streamlab.lab.topology import REPO_ROOT, Ports
from streamlab.lab.toxiproxy import Toxic, Toxiproxy

pytestmark = pytest.mark.integration

# Short enough that a 3 s think pause sees several pings, long enough that
# ordinary streams are not mostly pings.
TEST_HEARTBEAT_S = 0.5
# A reader that accepts nothing for this long is cut (tests/integration/test_backpressure.py).
TEST_SEND_TIMEOUT_S = 3.0
TEST_ENGINE_RUNNING, TEST_ENGINE_QUEUED = 30, 5
TEST_DRAIN_GRACE_S = 2.0
# Longer than every think pause the other tests use; the deadline tests exceed them.
TEST_ENGINE_IDLE_S, TEST_MAX_STREAM_S = 6.0, 40.0
TEST_GATEWAY_STREAMS, TEST_PER_CLIENT_STREAMS = 60, 25

# The services' settings for this suite; scripts/compose_test.sh gives the compose
# lab the same ones (as env files), so both targets run the suite alike.
TEST_ENGINE_ENV: dict[str, str] = {
    "STREAMLAB_ENGINE_KEEPALIVE_S": "2",
    # Slow-reader tests need answers longer than every buffer on the way.
    "STREAMLAB_ENGINE_MAX_TOKENS_LIMIT": "100000",
    # Small caps so tests/integration/test_limits.py can reach them.
    "STREAMLAB_ENGINE_MAX_RUNNING_GENERATIONS": str(TEST_ENGINE_RUNNING),
    "STREAMLAB_ENGINE_MAX_QUEUED_GENERATIONS": str(TEST_ENGINE_QUEUED),
    "STREAMLAB_ENGINE_KEEPALIVE_TIMEOUT_S": "1",
}
TEST_GATEWAY_ENV: dict[str, str] = {
    "STREAMLAB_GATEWAY_HEARTBEAT_S": str(TEST_HEARTBEAT_S),
    "STREAMLAB_GATEWAY_ENGINE_ACCEPT_TIMEOUT_S": "3",
    "STREAMLAB_GATEWAY_SEND_TIMEOUT_S": str(TEST_SEND_TIMEOUT_S),
    "STREAMLAB_GATEWAY_ENGINE_KEEPALIVE_S": "1",
    "STREAMLAB_GATEWAY_ENGINE_KEEPALIVE_TIMEOUT_S": "1",
    "STREAMLAB_GATEWAY_DRAIN_GRACE_S": str(TEST_DRAIN_GRACE_S),
    "STREAMLAB_GATEWAY_ENGINE_IDLE_TIMEOUT_S": str(TEST_ENGINE_IDLE_S),
    "STREAMLAB_GATEWAY_MAX_STREAM_DURATION_S": str(TEST_MAX_STREAM_S),
    "STREAMLAB_GATEWAY_MAX_STREAMS": str(TEST_GATEWAY_STREAMS),
    "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": str(TEST_PER_CLIENT_STREAMS),
}
# The engine wire the whole suite runs on (the gateway's default, or the other
# one with `make test-wire-per-request`): the lab's gateways get it here; every
# other gateway and EngineClient the tests start reads the same variable from
# the environment they inherit.
ENGINE_WIRE = os.environ.get("STREAMLAB_GATEWAY_ENGINE_WIRE",
                             GatewaySettings.model_fields["engine_wire"].default)
TEST_GATEWAY_ENV["STREAMLAB_GATEWAY_ENGINE_WIRE"] = ENGINE_WIRE


def pytest_report_header() -> str:
    return f"streamlab engine wire: {ENGINE_WIRE}"


def free_lab_ports() -> Ports:
    """Every port of a lab, each one free now (for a lab of a test's own)."""
    names = [name for name in Ports.model_fields if name.endswith("_port")]
    return Ports.model_validate(
        {"host": "127.0.0.1", **dict(zip(names, free_ports(len(names)), strict=True))})


@pytest.fixture(scope="session")
def lab_ports() -> Ports:
    return free_lab_ports()


@pytest.fixture(scope="session")
def lab_options(tmp_path_factory: pytest.TempPathFactory) -> LabOptions:
    run_dir: Path = tmp_path_factory.mktemp("lab")
    return LabOptions(
        run_dir=run_dir,
        engine_env=dict(TEST_ENGINE_ENV),
        gateway_env=dict(TEST_GATEWAY_ENV),
        # nginx cuts a client that accepts nothing after the gateway's send timeout.
        nginx=NginxOptions(send_timeout_s=TEST_SEND_TIMEOUT_S),
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On the compose target, run only what uses the lab under test: a test that
    starts its own processes (a private lab, an hf engine, an in-process app)
    measures nothing of the containers and already ran against local processes
    in the same CI run, so running it twice only costs minutes. The same for a
    test marked `local_only(reason)`: an expensive one whose subject is the
    services' own logic (the same code and nginx template as the local lab),
    not the containers, the hops between them or the replicas."""
    if selected_target() != "compose":
        return
    skip = pytest.mark.skip(reason="does not use the compose lab (it starts its own "
                            "processes); it runs in the local suite")
    for item in items:
        if "lab" not in getattr(item, "fixturenames", ()):
            item.add_marker(skip)
        elif (local_only := item.get_closest_marker("local_only")) is not None:
            item.add_marker(pytest.mark.skip(
                reason=f"runs in the local suite only: {local_only.args[0]}"))


@pytest.fixture(scope="session")
def lab(request: pytest.FixtureRequest) -> Iterator[LabTarget]:
    if selected_target() == "compose":
        # STREAMLAB_TARGET=compose: attach to the compose project through its
        # published ports (scripts/compose_test.sh brings it up with this
        # suite's gateway settings and takes it down); never start or stop it.
        compose_lab = ComposeLab.from_env()
        compose_lab.wait_ready()
        yield compose_lab
        return
    lab = Lab(request.getfixturevalue("lab_ports"), request.getfixturevalue("lab_options"))
    lab.up()  # stops what it started if it fails
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture(autouse=True)
def _reset_toxics(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "lab" in request.fixturenames:
        lab: LabTarget = request.getfixturevalue("lab")
        client = lab.toxiproxy()
        try:
            client.reset()
        finally:
            client.close()


@pytest.fixture
def sdk(lab: LabTarget) -> Iterator[openai.OpenAI]:
    """The official OpenAI SDK pointed at the edge, as a user's client would be."""
    # No retries: a test must see the first answer, not a retried one.
    client = openai.OpenAI(base_url=f"{lab.edge_url}/v1", api_key="sk-unused",
                           max_retries=0, timeout=15.0)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    # The read timeout is every test's watchdog: no test can hang on a stream.
    timeout = httpx.Timeout(10.0, connect=5.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        yield client


@dataclass(frozen=True)
class ExtraGateway:
    url: str
    process: processes.Running


def start_extra_gateway(lab: Lab, log_dir: Path, name: str, **env: str) -> ExtraGateway:
    """Another gateway on the lab's engine (directly, not through the engine
    hop's Toxiproxy), with settings of its own, ready; the caller stops it
    (`processes.stop(gateway.process)`). Its output goes to log_dir/NAME.log."""
    port = free_ports(1)[0]
    url = f"http://{lab.ports.host}:{port}"
    spec = ServiceSpec(
        name, [sys.executable, "-m", "services.gateway"],
        env={"STREAMLAB_GATEWAY_HOST": lab.ports.host,
             "STREAMLAB_GATEWAY_PORT": str(port),
             "STREAMLAB_GATEWAY_ENGINE_TARGET": lab.engine_target, **env},
        ready=lambda: httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200,
        cwd=REPO_ROOT)
    running = processes.start(spec, log_dir)
    try:
        processes.wait_ready(running)
    except BaseException:
        processes.stop(running, grace_s=5.0)
        raise
    return ExtraGateway(url, running)


@pytest.fixture
def extra_gateway(lab: Lab, tmp_path: Path) -> Iterator[Callable[..., ExtraGateway]]:
    """`extra_gateway("name", STREAMLAB_GATEWAY_X="1").url`: start_extra_gateway
    for one test; every one is stopped at the end of it."""
    started: list[ExtraGateway] = []

    def start(name: str, **env: str) -> ExtraGateway:
        started.append(start_extra_gateway(lab, tmp_path / "logs", name, **env))
        return started[-1]

    try:
        yield start
    finally:
        for gateway in started:
            processes.stop(gateway.process, grace_s=5.0)


# ---- Toxiproxy as a Python API, for tests ---------------------------------------------
@pytest.fixture
def toxiproxy(lab: Lab) -> Iterator[Toxiproxy]:
    """A client for the lab's Toxiproxy (`add_toxic`, `set_enabled`, ...)."""
    with lab.toxiproxy() as client:
        yield client


AddToxic = Callable[[str, Toxic], dict[str, Any]]


@pytest.fixture
def add_toxic(toxiproxy: Toxiproxy) -> AddToxic:
    """`add_toxic("edge", Toxic("latency", {"latency": 300}))`; gone after the test
    (the autouse reset also re-enables every hop)."""
    return toxiproxy.add_toxic


# The transformers backend's and the upstream chain's fixtures live beside their tests.
from tests.integration.hf_fixtures import hf_lab, tiny_model_dir  # noqa: E402, F401
from tests.integration.redis_fixtures import redis_server, start_replicas, store_hop  # noqa: E402, F401
from tests.integration.upstream_fixtures import openai_lab, upstream_pair  # noqa: E402, F401


@contextmanager
def replica_test_lab(run_dir: Path, gateway_env: dict[str, str], **replicas: Any
                     ) -> Iterator[Lab]:
    """A private lab of local processes with the suite's service settings
    (plus `gateway_env`) and `replicas` (gateways, engines, store), on free
    ports, up for the block: for a module that needs replicas of its own."""
    options = LabOptions(
        run_dir=run_dir, engine_env=dict(TEST_ENGINE_ENV),
        gateway_env={**TEST_GATEWAY_ENV, **gateway_env},
        nginx=NginxOptions(send_timeout_s=TEST_SEND_TIMEOUT_S), console=False, **replicas)
    private = Lab(free_lab_ports_for(options), options)
    private.up()
    try:
        yield private
    finally:
        private.down()
