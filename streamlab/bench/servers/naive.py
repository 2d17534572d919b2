"""The seed's relay: FastAPI `StreamingResponse`, `request.is_disconnected()`
before every token, the same engine client and chunk JSON as the gateway.

    python -m streamlab.bench.servers.naive --port 9001 --engine 127.0.0.1:8473
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from services.gateway.engine_client import EngineClient
from services.gateway.openai_api import ChatCompletionRequest, ChunkWriter
from services.gateway.settings import GatewaySettings


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
        writer = ChunkWriter(request_id, body.model)

        async def events() -> AsyncIterator[str]:
            async with stream:
                async for response in stream:
                    if await request.is_disconnected():  # the seed's per-token check
                        return
                    kind = response.WhichOneof("event")
                    if kind == "token":
                        yield f"data: {writer.token(response.token.text)}\n\n"
                    elif kind == "finish":
                        yield f"data: {writer.finish(response.finish)}\n\ndata: [DONE]\n\n"
                        return

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", required=True, help="host:port of the engine (or its hop)")
    args = parser.parse_args()
    # Same server settings as the gateway (services/gateway/server.py), access log included.
    uvicorn.run(create_app(args.engine), host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
