"""Builds and runs the engine's gRPC server.

`create_server()` is split from `serve()` so tests can start the engine on a
free port in-process. Shutdown is graceful: health goes NOT_SERVING first (so
the gateway and compose stop sending), then `server.stop(grace)` lets live
streams finish before cancelling them.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services.engine.backends.base import Backend
from services.engine.backends.fake import FakeModel
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


class BackendUnavailable(RuntimeError):
    """The configured backend cannot start (missing extra, bad model path or URL)."""


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
                 backend: Backend[Any] | None = None) -> None:
        self.server = server
        self.health = health
        self.port = port
        self._owned_backend = backend  # closed on stop when create_server made it

    async def stop(self, grace: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
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
    servicer = EngineServicer(backend, stats, settings)
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
        raise OSError(f"engine could not bind {settings.host}:{settings.port}")
    await server.start()
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Engine(server, health, port, owned)


async def serve(settings: EngineSettings) -> None:
    engine = await create_server(settings)
    log.info("engine (%s) listening on %s:%d", settings.backend, settings.host, engine.port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("draining: health NOT_SERVING, %.1f s grace", settings.shutdown_grace_s)
    await engine.stop(settings.shutdown_grace_s)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        asyncio.run(serve(EngineSettings()))
    except BackendUnavailable as exc:
        log.error("engine cannot start: %s", exc)
        raise SystemExit(2) from exc
