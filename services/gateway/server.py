"""Runs the gateway under uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = GatewaySettings()
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        # Streams may be open at SIGTERM; give them a moment to end cleanly.
        timeout_graceful_shutdown=5,
    )
