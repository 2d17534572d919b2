"""`create_app(settings)`: the console's page, its static files and its control API.

The page is static (static/index.html, console.js, console.css: no build
step); it learns where the edge is from `GET /api/lab` and streams from there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from streamlab.console import control, trace
from streamlab.console.guard import ConsoleGuard, console_hosts
from streamlab.lab.console_settings import ConsoleSettings
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
    # Only the console's own page may change the lab (guard.py: Host, Origin,
    # and the token the page below carries).
    app.add_middleware(ConsoleGuard, token=state.token, hosts=console_hosts(
        settings.host, settings.port, settings.allowed_hosts))
    app.include_router(control.router)
    app.include_router(trace.router)  # /api/trace: a stream's waterfall (--tracing)
    control.install_error_handlers(app)
    trace.install_error_handlers(app)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # The page with this console's token in it: only a page read from here
    # (same origin) can learn it.
    page = (STATIC / "index.html").read_text().replace(
        'name="streamlab-console-token" content=""',
        f'name="streamlab-console-token" content="{state.token}"')

    @app.get("/", include_in_schema=False)
    async def index() -> HTMLResponse:
        # no-store: a page from an older console (an older token) must not
        # outlive a restart, and the token is kept by no cache.
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
