"""The textbook relay: FastAPI `StreamingResponse`, `request.is_disconnected()`
before every token, the same engine client and chunk JSON as the gateway.

    python -m streamlab.experiments.bench.servers.naive --port 9001 --engine 127.0.0.1:8473
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from services.gateway.engine_client import EngineClient
from services.gateway.openai_api import ChatCompletionRequest, ChunkWriter
from services.gateway.settings import GatewaySettings
from streamlab.experiments.bench.servers import arguments
from streamlab_protocol.engine.v1 import engine_pb2 as pb


def create_app(engine_target: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.engine = EngineClient(GatewaySettings(engine_target=engine_target))
        try:
            yield
        finally:
            await app.state.engine.close()

    app = FastAPI(lifespan=lifespan)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> StreamingResponse:
        request_id = uuid.uuid4().hex
        stream = await request.app.state.engine.open(body.to_engine_request(request_id))
        writer = ChunkWriter(request_id, body.model or "streamlab-fake")

        async def events() -> AsyncIterator[str]:
            try:
                async for event in stream:
                    if await request.is_disconnected():  # the textbook per-token check
                        return
                    if isinstance(event, pb.Finish):  # EngineStream stops after it
                        yield f"data: {writer.finish(event)}\n\ndata: [DONE]\n\n"
                        return
                    yield f"data: {writer.token(event.text)}\n\n"
            finally:
                stream.cancel()

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    return app


def main() -> None:
    args = arguments(__doc__)
    # Same server settings as the gateway (services/gateway/server.py), access log included.
    uvicorn.run(create_app(args.engine), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
