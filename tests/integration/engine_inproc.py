"""An engine started in this process on a free port, and a gRPC client to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from services.engine.backends.base import Backend
from services.engine.server import create_server
from services.engine.settings import EngineSettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc


@asynccontextmanager
async def running_engine(settings: EngineSettings, backend: Backend[Any] | None = None
                         ) -> AsyncIterator[pb_grpc.EngineServiceStub]:
    engine = await create_server(settings.model_copy(update={"host": "127.0.0.1", "port": 0}),
                                 backend)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{engine.port}")
    try:
        yield pb_grpc.EngineServiceStub(channel)
    finally:
        await channel.close()
        await engine.stop(0)


async def stats(stub: pb_grpc.EngineServiceStub, request_id: str = "") -> pb.GetStatsResponse:
    response: pb.GetStatsResponse = await stub.GetStats(
        pb.GetStatsRequest(request_id=request_id), timeout=5)
    return response


async def record(stub: pb_grpc.EngineServiceStub, request_id: str) -> pb.GenerationRecord:
    found = (await stats(stub, request_id)).generations
    assert found, f"the engine has no record of {request_id}"
    return found[0]

