"""Runs the gateway under uvicorn, with a graceful drain on SIGTERM.

uvicorn's own SIGTERM handling closes the listener at once and, through
sse-starlette's hook, ends every stream. DrainingServer runs the drain first
(services/gateway/drain.py) and only then lets uvicorn shut down; a second
signal shuts down at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from services.common import tracing
from services.gateway.app import create_app
from services.gateway.drain import Drain
from services.gateway.settings import GatewaySettings

log = logging.getLogger("streamlab.gateway")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self._drain = drain
        self._drain_task: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain.draining or self._drain.grace_s == 0:
            super().handle_exit(sig, frame)  # second signal, or no drain wanted
            return
        log.info("SIGTERM: draining %d live streams for up to %.1f s",
                 self._drain.live, self._drain.grace_s)
        # We are in a signal handler: hand the work to the loop, waking it up.
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(self._start_drain, sig, frame)

    def _start_drain(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.get_running_loop().create_task(
                self._drain_then_exit(sig, frame))

    async def _drain_then_exit(self, sig: int, frame: FrameType | None) -> None:
        await self._drain.run()
        log.info("drain done; shutting down")
        super().handle_exit(sig, frame)


def uvicorn_config(app: FastAPI, settings: GatewaySettings) -> uvicorn.Config:
    # JSON logs: uvicorn's loggers go through the root logger's JSON handler
    # instead of their own plain ones.
    logging_config: dict[str, Any] = {"log_config": None} if tracing.json_logs() else {}
    return uvicorn.Config(app, **logging_config, host=settings.host, port=settings.port,
                          log_level="info",
                          # The drain already waited; this only bounds stragglers.
                          timeout_graceful_shutdown=5,
                          # The client's address, for its identity without auth
                          # (services/gateway/identity.py): from X-Forwarded-For
                          # when the peer is the proxy in front (nginx sets it).
                          proxy_headers=True,
                          forwarded_allow_ips=settings.forwarded_allow_ips,
                          # Both sized for thousands of streams opened at once
                          # (settings.py says why).
                          access_log=settings.access_log, backlog=settings.backlog)


def main() -> None:
    tracing.configure_logging()
    # Tracing on only if the OTEL_* variables ask for it (services/common/tracing.py).
    if tracing.setup("streamlab-gateway") is not None:
        log.info("tracing on: OTLP to %s", tracing.otlp_endpoint())
    settings = GatewaySettings()
    app = create_app(settings)
    # Everything built so far (modules, the app, its routes and models) lives as
    # long as the process: out of the collector's way, so the collections that
    # every stream's garbage triggers do not walk it again each time.
    gc.freeze()
    DrainingServer(uvicorn_config(app, settings), app.state.gateway.drain).run()
