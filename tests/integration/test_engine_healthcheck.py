"""The engine's compose health check against a real engine: SERVING is healthy,
a draining engine (NOT_SERVING) and a stopped one are not."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from services.engine.healthcheck import main
from services.engine.server import create_server
from services.engine.settings import EngineSettings

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


async def test_serving_then_draining_then_gone() -> None:
    engine = await create_server(EngineSettings(host="127.0.0.1", port=0))
    target = f"127.0.0.1:{engine.port}"
    try:
        # A thread: the check is a blocking client, the engine runs on this loop.
        assert await asyncio.to_thread(main, [target]) == 0
        await engine.health.enter_graceful_shutdown()
        assert await asyncio.to_thread(main, [target]) == 1
    finally:
        await engine.stop(0)
    assert await asyncio.to_thread(main, [target]) == 1


async def test_as_a_module_it_asks_the_engines_own_port() -> None:
    engine = await create_server(EngineSettings(host="127.0.0.1", port=0))
    try:
        env = {**os.environ, "STREAMLAB_ENGINE_PORT": str(engine.port)}
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "services.engine.healthcheck"],
            env=env, capture_output=True, text=True, timeout=30)
    finally:
        await engine.stop(0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"engine 127.0.0.1:{engine.port}: SERVING"
