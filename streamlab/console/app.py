"""`create_app(settings)`: the console's page, its static files and its control API.

The page is static (static/index.html, console.js, console.css: no build
step); it learns where the edge is from `GET /api/lab` and streams from there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from streamlab.console import control
from streamlab.console.settings import ConsoleSettings
from streamlab.lab.toxiproxy import Toxiproxy

STATIC = Path(__file__).resolve().parent / "static"


def create_app(settings: ConsoleSettings, toxiproxy: Toxiproxy | None = None) -> FastAPI:
    """The console for one lab; `toxiproxy` is a seam for a client of the caller's."""
    state = control.ConsoleState(settings, toxiproxy or Toxiproxy(
        settings.toxiproxy_url, routes=settings.toxiproxy_routes))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="streamlab console", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.state.console = state
    app.include_router(control.router)
    control.install_error_handlers(app)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        # no-cache: a page from an older console must not outlive a restart.
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
