"""Builds and runs the engine's gRPC server.

`create_server()` is split from `serve()` so tests can start the engine on a
free port in-process. Shutdown is graceful: health goes NOT_SERVING first (so
the gateway and compose stop sending), then `server.stop(grace)` lets live
streams finish before cancelling them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services.common import tracing
from services.engine.backends.base import Backend
from services.engine.backends.fake import FakeModel
from services.engine.errors import EngineException
from services.engine.metrics import EngineMetrics
from services.engine.servicer import EngineServicer
from services.engine.settings import EngineSettings
from services.engine.stats import EngineStats
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

log = logging.getLogger("streamlab.engine")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EngineService"].full_name

# Keepalive must agree with the gateway's channel options: a server that
# allows pings less often than the client sends them answers GOAWAY
# "too_many_pings" and the gateway's calls fail. The gateway's interval is
# configurable down to 1 s (tests use that), so accept pings that often and
# never count strikes.
def server_options(settings: EngineSettings) -> list[tuple[str, int]]:
    return [
        ("grpc.keepalive_time_ms", int(settings.keepalive_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.http2.ping_timeout_ms", int(settings.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 1_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 1_000),
        ("grpc.http2.max_ping_strikes", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]


class BackendUnavailable(EngineException, RuntimeError):
    """The configured backend cannot start (missing extra, bad model path or URL)."""


class CannotListen(EngineException, OSError):
    """A port the engine was told to listen on is taken or not ours."""


def make_backend(settings: EngineSettings) -> Backend[Any]:
    """Blocking (a real model loads for seconds to minutes): call it off the loop."""
    if settings.backend == "fake":
        return FakeModel(settings.fake)
    if settings.backend == "openai":
        from services.engine.backends.openai_upstream import OpenAIUpstream

        try:
            return OpenAIUpstream(settings.openai, settings.fake)
        except ValueError as exc:
            raise BackendUnavailable(str(exc)) from exc
    if settings.backend == "hf":
        # Imported here so the default lab never needs torch (the `hf` extra).
        try:
            from services.engine.backends.hf import HFModel, ModelLoadError
        except ImportError as exc:
            raise BackendUnavailable(
                f"the hf backend needs the hf extra ({exc}): pip install -e '.[hf]', "
                "or STREAMLAB_WITH_HF=1 bash scripts/install.sh") from exc
        try:
            return HFModel(settings.hf)
        except ModelLoadError as exc:
            raise BackendUnavailable(str(exc)) from exc
    raise ValueError(f"unknown backend {settings.backend!r}")


class Engine:
    def __init__(self, server: grpc.aio.Server, health: HealthServicer, port: int,
                 backend: Backend[Any] | None = None,
                 servicer: EngineServicer | None = None,
                 metrics: EngineMetrics | None = None,
                 metrics_port: int | None = None) -> None:
        self.server = server
        self._servicer = servicer
        self.health = health
        self.port = port
        self.metrics = metrics
        self.metrics_port = metrics_port  # None: no /metrics listener
        self._owned_backend = backend  # closed on stop when create_server made it

    async def set_serving(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING for every service name, the server left
        running: a balanced gateway's channel (client-side health checks, see
        docs/topology.md) stops sending new calls to a NOT_SERVING engine while
        the calls it has run on."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)
        if self._servicer is not None:  # multiplexed Sessions tell their gateways
            self._servicer.set_serving(serving)

    async def stop(self, grace: float) -> None:
        if self._servicer is not None:  # Sessions refuse new calls, as the server will
            self._servicer.set_serving(False, stopping=True)
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
        if self._servicer is not None:
            # Detachable generations run in tasks of their own: no call ends them.
            await self._servicer.aclose()
        if self.metrics is not None:
            # Blocks up to its serve loop's poll interval (0.5 s): off the loop.
            await asyncio.to_thread(self.metrics.close)
        if self._owned_backend is not None:
            await self._owned_backend.aclose()


async def create_server(
    settings: EngineSettings, backend: Backend[Any] | None = None
) -> Engine:
    owned = None
    if backend is None:
        # Off the loop: loading a model blocks for as long as it takes.
        backend = owned = await asyncio.to_thread(make_backend, settings)
    server = grpc.aio.server(options=server_options(settings))
    stats = EngineStats(settings.stats_history)
    metrics = EngineMetrics()
    servicer = EngineServicer(backend, stats, settings, metrics)
    pb_grpc.add_EngineServiceServicer_to_server(servicer, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME),
        server,
    )
    port = server.add_insecure_port(f"{settings.host}:{settings.port}")
    if port == 0:
        raise CannotListen(f"engine could not bind {settings.host}:{settings.port}")
    metrics_port = None
    if settings.metrics_port is not None:
        try:
            metrics_port = metrics.serve(settings.host, settings.metrics_port)
        except OSError as exc:
            await server.stop(None)
            raise CannotListen(f"engine could not bind its /metrics on "
                          f"{settings.host}:{settings.metrics_port}: {exc}") from exc
    await server.start()
    engine = Engine(server, health, port, owned, servicer, metrics, metrics_port)
    await engine.set_serving(True)
    return engine


async def serve(settings: EngineSettings) -> None:
    engine = await create_server(settings)
    # What start-up built (modules, the server, the backend) lives as long as the
    # process: out of the collector's way, so the collections that every call's
    # garbage triggers do not walk it again each time.
    gc.freeze()
    log.info("engine (%s) listening on %s:%d", settings.backend, settings.host, engine.port)
    if engine.metrics_port is not None:
        log.info("engine /metrics on http://%s:%d/metrics", settings.host, engine.metrics_port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    # Drain without stopping (a rolling deploy's first step): SIGUSR1 turns health
    # NOT_SERVING, SIGUSR2 back to SERVING; calls keep being served either way.
    for sig, serving in ((signal.SIGUSR1, False), (signal.SIGUSR2, True)):
        loop.add_signal_handler(sig, _set_serving, engine, serving)
    await stopping.wait()
    log.info("draining: health NOT_SERVING, %.1f s grace", settings.shutdown_grace_s)
    await engine.stop(settings.shutdown_grace_s)


def _set_serving(engine: Engine, serving: bool) -> None:
    log.info("health %s (signal)", "SERVING" if serving else "NOT_SERVING: draining")
    task = asyncio.ensure_future(engine.set_serving(serving))
    _background.add(task)
    task.add_done_callback(_background.discard)


# Strong references to the signal handlers' tasks until they finish.
_background: set[asyncio.Future[None]] = set()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (uvicorn[standard] brings it, so every
    image has it), else asyncio's own. A stream's set-up in the engine is
    mostly grpc.aio's machinery running tasks and callbacks on the loop, which
    uvloop runs in C (docs/cost.md has the figures)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main() -> None:
    tracing.configure_logging()
    # Tracing on only if the OTEL_* variables ask for it (services/common/tracing.py).
    if tracing.setup("streamlab-engine") is not None:
        log.info("tracing on: OTLP to %s", tracing.otlp_endpoint())
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(serve(EngineSettings()))
    except (BackendUnavailable, CannotListen) as exc:
        log.error("engine cannot start: %s", exc)
        raise SystemExit(2) from exc
