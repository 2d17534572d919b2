"""The gateway as `streamlab bench memory` runs it: the real app under uvicorn,
as services/gateway/server.py runs it (its settings from the environment, the
same uvicorn config, gc.freeze()), in its own process so its RSS is its own.

With STREAMLAB_MEMORY_TRACE=<path> it runs under tracemalloc, and SIGUSR1
writes a snapshot to <path>.<n> (n counting from 0): the driver takes one
before the streams open and one while they are held, and diffs them. Under
tracemalloc the RSS is inflated, so the driver reads RSS from a run without.

    python -m streamlab.experiments.bench.memory_gateway
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import signal
import tracemalloc

from services.gateway.app import create_app
from services.gateway.server import DrainingServer, uvicorn_config
from services.gateway.settings import GatewaySettings

TRACE_ENV = "STREAMLAB_MEMORY_TRACE"
# Frames kept per allocation: enough to name the per-stream object's owner
# (grpc's call under EngineStream under the lease under the route).
TRACE_FRAMES = 12


async def _serve(server: DrainingServer, trace: str | None) -> None:
    if trace:
        counter = itertools.count()

        def dump() -> None:
            # A collection first: the snapshot should hold what is live, not
            # what the next collection would free.
            gc.collect()
            # Written whole, then renamed: the driver waits for the name.
            path = f"{trace}.{next(counter)}"
            tracemalloc.take_snapshot().dump(f"{path}.part")
            os.replace(f"{path}.part", path)

        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump)
    await server.serve()


def main() -> None:
    trace = os.environ.get(TRACE_ENV)
    if trace:
        tracemalloc.start(TRACE_FRAMES)
    settings = GatewaySettings()
    app = create_app(settings)
    gc.freeze()
    config = uvicorn_config(app, settings)
    server = DrainingServer(config, app.state.gateway.drain)
    # uvicorn's own loop (uvloop when installed), as Server.run() picks it.
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(_serve(server, trace))


if __name__ == "__main__":
    main()
