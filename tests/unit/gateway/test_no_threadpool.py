"""Every route runs on the event loop: no dependency or endpoint that FastAPI
would hand to its thread pool.

A plain `def` dependency (or endpoint) is run by FastAPI through anyio's worker
threads, one hop per request. `gateway_state` was one: profiling 2,500 stream
set-ups at once (docs/results/profile-gateway-2500-slow-streams.txt) found 4.4 s of
57 in that hop, and set-ups queued behind it past the engine's accept deadline
(504). The gateway's work per request is all non-blocking, so nothing needs
the pool."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, APIWebSocketRoute

from services.gateway.app import create_app
from services.gateway.settings import GatewaySettings
from tests.unit.gateway.scripted_engine import ScriptedEngine


def _calls(dependant: Dependant) -> Iterator[Any]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def _routes(routes: list[Any]) -> Iterator[APIRoute | APIWebSocketRoute]:
    """The app's routes, with those of every included router (FastAPI keeps an
    included router whole, behind a wrapper that holds the original)."""
    for route in routes:
        if isinstance(route, APIRoute | APIWebSocketRoute):
            yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _routes(included.routes)


def _runs_on_the_loop(call: Any) -> bool:
    target = call if inspect.isroutine(call) else getattr(call, "__call__", call)  # noqa: B004
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def test_no_route_hands_work_to_the_thread_pool() -> None:
    app = create_app(GatewaySettings(), engine=ScriptedEngine())
    routes = list(_routes(app.routes))
    assert len(routes) > 10  # every surface's routes, not an empty walk
    sync = sorted({f"{route.path}: {getattr(call, '__qualname__', call)}"
                   for route in routes
                   for call in [route.endpoint, *_calls(route.dependant)]
                   if not _runs_on_the_loop(call)})
    assert sync == [], f"run in FastAPI's thread pool on every request: {sync}"
