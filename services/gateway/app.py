"""The gateway's FastAPI application, built from its settings (no import-time state)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from services.gateway.auth import BearerAuth
from services.gateway.engine_client import Engine, EngineClient
from services.gateway.errors import GatewayError, error_body, error_json, validation_problem
from services.gateway.limits import BodySizeLimit, replayed_receive
from services.gateway.model_routes import router as model_router
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.openai_routes import CHAT_PATH, chat_response
from services.gateway.openai_routes import router as openai_router
from services.gateway.polling_routes import router as polling_router
from services.gateway.responses_routes import router as responses_router
from services.gateway.resume_routes import router as resume_router
from services.gateway.settings import GatewaySettings
from services.gateway.state import GatewayState
from services.gateway.ws_routes import router as ws_router

log = logging.getLogger("streamlab.gateway")


def validation_error_body(exc: RequestValidationError) -> dict[str, Any]:
    """The first problem, named: which field (dotted path) and what is wrong.
    Never the value itself: it may be anything, a lone surrogate included."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "invalid JSON")
        message, param = f"request body is not valid JSON: {reason}", None
    else:
        param, message = validation_problem(exc.errors())
    return error_body(400, "invalid_request", message, param)


class ErrorResponse(JSONResponse):
    """An error's JSON, as ASCII: nothing a client sent can make it unencodable."""

    def render(self, content: Any) -> bytes:
        return error_json(content)


class GatewayApp(FastAPI):
    """FastAPI, with `POST /v1/chat/completions` taken before FastAPI's own
    stack (ChatFastPath): every other request, and every chat request the
    fast path hands back, goes through FastAPI as before."""

    chat_fast_path: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.chat_fast_path is not None and scope["type"] == "http"
                and scope["path"] == CHAT_PATH and scope["method"] == "POST"
                and not scope.get("root_path")):
            scope["app"] = self  # as Starlette sets it: the route reads app.state
            await self.chat_fast_path(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def fastapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The request through FastAPI's whole stack (middleware, routing, handlers)."""
        await super().__call__(scope, receive, send)


def _content_type(scope: Scope) -> bytes | None:
    name: bytes
    value: bytes
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value  # the first, as Starlette's Headers.get reads it
    return None


def parse_chat(scope: Scope, body: bytes) -> ChatCompletionRequest | None:
    """The request, when FastAPI would take it as it is: a JSON content type,
    JSON that parses, and a body the model accepts. None for anything else:
    FastAPI then answers it, so every refusal (its status, its message) is
    FastAPI's and the exception handlers' below, byte for byte."""
    content_type = _content_type(scope)
    # FastAPI parses JSON for application/json with any parameters (and for
    # other types it is handed back: +json, none at all, anything else).
    if content_type is None or content_type.split(b";")[0].strip().lower() != b"application/json":
        return None
    try:
        data = json.loads(body)  # as Starlette's Request.json() parses it
        # The model FastAPI validates the route's body with, in the same mode.
        return ChatCompletionRequest.model_validate(data)
    except Exception:
        # Whatever it is (bad JSON, bytes that are no Unicode text, nesting past
        # the recursion limit, a ValidationError), FastAPI names it.
        return None


def gateway_error_response(exc: GatewayError) -> JSONResponse:
    """How every route answers a GatewayError (the app's handler and the
    chat fast path alike)."""
    return ErrorResponse(exc.body(), status_code=exc.status_code, headers=exc.headers)


def unexpected_error_response(request: Request) -> JSONResponse:
    """A bug, never a client's fault: logged (the traceback follows when the
    caller re-raises, as Starlette does after the app's handler), and the
    client still gets JSON."""
    log.error("unhandled error on %s %s", request.method, request.url.path)
    return ErrorResponse(error_body(500, "internal_error", "internal error in the gateway"),
                         status_code=500)


class ChatFastPath:
    """`POST /v1/chat/completions` without FastAPI's per-request machinery.

    In a profile of 1,000 two-token streams (docs/cost.md) FastAPI's stack
    around the chat route (its error, telemetry, body-limit, exception and
    exit-stack middleware, the router's walk over every route, the request
    wrappers, dependency solving and body validation) was about a fifth of the
    gateway's set-up CPU. Here the body is read once, parsed and validated
    with the same model, and the route's own code answers (`chat_response`).
    The gateway's own middleware runs around it as before (the auth, then the
    body-size limit: create_app composes them). A body that is not plainly
    valid goes to FastAPI's stack instead, replayed: a refusal is rare, and
    so it is answered exactly as before. What the route raises is answered as
    the app's handlers answer it."""

    def __init__(self, app: GatewayApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        more = True
        while more:  # BodySizeLimit in front has read and bounded it: one message
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        parsed = parse_chat(scope, body)
        if parsed is None:
            await self._app.fastapi(scope, replayed_receive(body, receive), send)
            return
        request = Request(scope, receive)
        try:
            response: Response = await chat_response(parsed, request, self._app.state.gateway)
        except GatewayError as exc:
            response = gateway_error_response(exc)
        except Exception:
            # As the app's catch-all handler, and Starlette after it: a JSON
            # 500, then raised for the server to log its traceback.
            await unexpected_error_response(request)(scope, receive, send)
            raise
        await response(scope, receive, send)


def create_app(settings: GatewaySettings, engine: Engine | None = None) -> FastAPI:
    """The gateway's app. `engine`: a client a test hands in (it is not closed
    here); None opens the gRPC client to `settings.engine_target` for the
    app's lifetime."""
    gateway = GatewayState(settings, engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owns_engine = not gateway.has_engine
        if owns_engine:
            gateway.engine = EngineClient(settings)
        gateway.jobs.open()
        await gateway.streams.open(gateway)
        try:
            yield
        finally:
            # Shutdown: what still runs is cancelled at the engine, then the channel closes.
            await gateway.jobs.close()
            await gateway.streams.close()
            if gateway.shared_caps is not None:
                await gateway.shared_caps.close()
            if owns_engine:
                await gateway.engine.close()

    # The API's description only when asked for (settings.api_docs): through
    # the edge it would answer anyone, key or not.
    docs: dict[str, Any] = {} if settings.api_docs else {
        "openapi_url": None, "docs_url": None, "redoc_url": None}
    app = GatewayApp(title="streamlab gateway", lifespan=lifespan, **docs)
    app.state.gateway = gateway
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # Added last, so it runs first: an unauthenticated request costs nothing.
    app.add_middleware(BearerAuth, keys=settings.api_keys)
    # The chat route's fast path, behind the same two, in the same order.
    app.chat_fast_path = BearerAuth(BodySizeLimit(ChatFastPath(app),
                                                  max_bytes=settings.max_body_bytes),
                                    keys=settings.api_keys)
    # The routers' routes go straight into the app's own router, in this order.
    # FastAPI's include_router() keeps each router as a branch whose routes it
    # re-checks for changes on every request (a walk over all of them): 7% of
    # the gateway's CPU per stream set-up in a profile (docs/cost.md). These
    # routers take no prefix, dependencies or tags, so nothing is lost.
    for router in (openai_router,
                   model_router,  # GET /v1/models, as OpenAI SDKs list them
                   resume_router,  # /v1/streams and /demo (Last-Event-ID resume)
                   polling_router,  # /v1/jobs: short and long polling
                   ws_router,  # /ws: one prompt in, one message per token
                   responses_router):  # /v1/responses: streamed, background, resumable
        app.router.routes.extend(router.routes)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return gateway_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return ErrorResponse(validation_error_body(exc), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own refusals (405, 404, a body that is not UTF-8) in the
        # same OpenAI-style shape as everything else.
        body = error_body(exc.status_code, f"http_{exc.status_code}", str(exc.detail))
        return ErrorResponse(body, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(request)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if gateway.drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Ready when the engine answers its health check through the engine hop."""
        if gateway.drain.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if await gateway.engine.healthy():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "engine unavailable"}, status_code=503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(
            generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return app
