"""The console's control API (`/api`): what the page may not do from the browser.
Only the console's own page may call its changes (guard.py).

Toxics and hops go through the lab's own Toxiproxy client (streamlab/lab/toxiproxy.py,
validated by the same `parse_attributes` as `streamlab toxic add`); engine
counters and generation records through the same `engine_stats` as
`streamlab status` (GetStats, straight to the engine); the gateway's figures
from its /metrics. Streams are not here: the page opens them at the edge.

Errors keep their meaning across the boundary: Toxiproxy's refusals keep its
status (unreachable → 502), a bad toxic is 400, an engine that does not answer
is 503, each as `{"error": "..."}`.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any

import grpc
import httpx
from fastapi import APIRouter, Body, Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from streamlab.console import presets
from streamlab.console.metrics import gateway_figures
from streamlab.errors import StreamlabError
from streamlab.experiments.generation_end import state_name
from streamlab.experiments.scenarios import MODES, Mode
from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.endpoints import engine_stats
from streamlab.lab.topology import HOP_NAMES, is_hop_name
from streamlab.lab.toxiproxy import (
    TOXIC_TYPES,
    Direction,
    Toxic,
    ToxicSpecError,
    Toxiproxy,
    ToxiproxyError,
    parse_attributes,
)
from streamlab_protocol.engine.v1 import engine_pb2 as pb

# Stop marks kept for the "Stop → cancel" figure; the oldest go first.
MAX_STOP_MARKS = 1000
METRICS_TIMEOUT_S = 2.0


class UnknownName(StreamlabError, LookupError):
    """A hop, scenario or mode the lab does not have (→ 404)."""


class EngineUnreachable(StreamlabError, RuntimeError):
    """GetStats failed (→ 503)."""


@dataclass
class ConsoleState:
    """What the control API holds: its settings, one Toxiproxy client, and when
    each Stop was pressed (CLOCK_MONOTONIC, the clock the engine's records use)."""

    settings: ConsoleSettings
    toxiproxy: Toxiproxy
    stop_marks: OrderedDict[str, float] = field(default_factory=OrderedDict)
    # What the page sends with every change (guard.py); drawn per console run.
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def stats(self, request_id: str = "") -> pb.GetStatsResponse:
        try:
            return engine_stats(self.settings.engine_target, request_id)
        except grpc.RpcError as exc:
            raise EngineUnreachable(
                f"engine at {self.settings.engine_target}: {exc.code().name}") from exc

    def mark_stop(self, request_id: str) -> float:
        self.stop_marks[request_id] = now = time.monotonic()
        while len(self.stop_marks) > MAX_STOP_MARKS:
            self.stop_marks.popitem(last=False)
        return now

    def close(self) -> None:
        self.toxiproxy.close()


def console_state(request: Request) -> ConsoleState:
    state: ConsoleState = request.app.state.console
    return state


State = Annotated[ConsoleState, Depends(console_state)]
router = APIRouter(prefix="/api")


def _hop(hop: str) -> str:
    if not is_hop_name(hop):
        raise UnknownName(f"no hop {hop!r}; one of: {', '.join(HOP_NAMES)} "
                          "(and upstream-N, engine-N, store with replicas)")
    return hop


def _mode(mode: str) -> Mode:
    for known in MODES:
        if mode == known:
            return known
    raise UnknownName(f"no mode {mode!r}; one of: {', '.join(MODES)}")


# ---- the lab and its hops ------------------------------------------------------------
@router.get("/lab")
def lab(state: State) -> dict[str, Any]:
    """What the page needs to start: where the edge is, the hops, the toxic types."""
    return {"edge_url": state.settings.edge_url, "hops": list(HOP_NAMES),
            "toxic_types": TOXIC_TYPES, "transports": list(presets.TRANSPORTS),
            "panel_interval_ms": state.settings.panel_interval_ms}


@router.get("/hops")
def hops(state: State) -> dict[str, Any]:
    """Each hop: enabled or not, and its toxics (Toxiproxy's own JSON)."""
    proxies = state.toxiproxy.proxies()
    return {name: {"enabled": proxies[name]["enabled"],
                   "toxics": proxies[name].get("toxics") or []}
            for name in (*(n for n in HOP_NAMES if n in proxies),
                         *sorted(n for n in proxies if n not in HOP_NAMES and is_hop_name(n)))}


class ToxicRequest(BaseModel):
    """A toxic as the page sends it: Toxiproxy's own names."""

    type: str
    attributes: dict[str, int] = Field(default_factory=dict)
    stream: Direction = "downstream"
    name: str = Field("", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")


@router.post("/hops/{hop}/toxics", status_code=201)
def add_toxic(hop: str, toxic: ToxicRequest, state: State) -> dict[str, Any]:
    """Add a toxic, checked exactly as `streamlab toxic add` checks it."""
    checked = parse_attributes(toxic.type, [f"{k}={v}" for k, v in toxic.attributes.items()])
    return state.toxiproxy.add_toxic(
        _hop(hop), Toxic(toxic.type, dict(checked), toxic.stream, name=toxic.name))


@router.delete("/hops/{hop}/toxics/{name}", status_code=204)
def remove_toxic(hop: str, name: str, state: State) -> None:
    state.toxiproxy.remove_toxic(_hop(hop), name)


@router.post("/hops/{hop}/enabled")
def set_enabled(hop: str, state: State,
                enabled: Annotated[bool, Body(embed=True)]) -> dict[str, Any]:
    """Disabling cuts every open connection through the hop and refuses new ones."""
    state.toxiproxy.set_enabled(_hop(hop), enabled)
    return hops(state)


@router.post("/reset")
def reset(state: State) -> dict[str, Any]:
    """Every hop enabled, every toxic gone."""
    state.toxiproxy.reset()
    return hops(state)


# ---- presets: the scenario catalogue ------------------------------------------------------
@router.get("/presets")
def list_presets() -> list[dict[str, Any]]:
    return presets.presets()


@router.post("/presets/{scenario}/{mode}")
def apply_preset(scenario: str, mode: str, state: State) -> dict[str, Any]:
    """Reset, then the mode's toxics, as the scenario runner applies them."""
    try:
        setup = presets.setup_of(scenario, _mode(mode))
    except KeyError as exc:
        raise UnknownName(str(exc.args[0])) from exc
    state.toxiproxy.reset()
    for hop, toxic in setup.toxics:
        state.toxiproxy.add_toxic(hop, toxic)
    return hops(state)


# ---- the engine and the gateway -------------------------------------------------------------
@router.get("/engine")
def engine(state: State) -> dict[str, Any]:
    """The engine's counters and load (tokens/s is the page's: it has the clock)."""
    stats = state.stats()
    load = stats.load
    return {"backend": stats.backend, "running": load.running,
            "running_limit": load.running_limit, "queued": load.queue_waiting,
            "tokens_generated": stats.tokens_generated,
            "generations_started": stats.generations_started,
            "generations_completed": stats.generations_completed,
            "generations_cancelled": stats.generations_cancelled,
            "generations_failed": stats.generations_failed,
            "tokens_after_cancel": stats.tokens_after_cancel,
            "at": time.monotonic()}


def record_json(record: pb.GenerationRecord, stopped_at: float | None) -> dict[str, Any]:
    """A generation record, with the time from the page's Stop to the engine's
    cancel when both are known (the same clock: CLOCK_MONOTONIC on this host)."""
    now = time.monotonic()
    stop_to_cancel_ms = cancelled_ago_s = None
    if record.cancelled_at:
        # How long ago, so the page can place the cancel on its own timeline.
        cancelled_ago_s = round(now - record.cancelled_at, 4)
        if stopped_at is not None:
            stop_to_cancel_ms = round((record.cancelled_at - stopped_at) * 1000, 1)
    return {"request_id": record.request_id, "state": state_name(record),
            "tokens_generated": record.tokens_generated,
            "tokens_after_cancel": record.tokens_after_cancel,
            "running_s": round((record.ended_at or now) - record.started_at, 3),
            "cancelled_ago_s": cancelled_ago_s,
            "stopped": stopped_at is not None, "stop_to_cancel_ms": stop_to_cancel_ms}


@router.get("/engine/generations/{request_id}")
def generation(request_id: str, state: State) -> dict[str, Any]:
    found = state.stats(request_id).generations
    if not found:
        raise UnknownName(f"the engine has no record of {request_id!r} (yet)")
    return record_json(found[0], state.stop_marks.get(request_id))


@router.post("/engine/generations/{request_id}/stop")
def mark_stop(request_id: str, state: State) -> dict[str, float]:
    """The page calls this as its Stop button closes the stream: the moment the
    engine's cancel is measured from."""
    return {"stopped_at": state.mark_stop(request_id)}


@router.get("/gateway")
def gateway(state: State) -> dict[str, float | None]:
    """Live streams, heartbeats and the rest, from the gateway's /metrics."""
    response = httpx.get(f"{state.settings.gateway_url}/metrics", timeout=METRICS_TIMEOUT_S)
    response.raise_for_status()
    return gateway_figures(response.text)


# ---- errors: each lower layer's, translated once ----------------------------------------------
def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def install_error_handlers(app: FastAPI) -> None:
    async def toxiproxy_error(_: Request, exc: Exception) -> JSONResponse:
        status = exc.status_code if isinstance(exc, ToxiproxyError) else 0
        return _error(status or 502, str(exc))

    async def bad_toxic(_: Request, exc: Exception) -> JSONResponse:
        return _error(400, str(exc))

    async def unknown(_: Request, exc: Exception) -> JSONResponse:
        return _error(404, str(exc))

    async def engine_down(_: Request, exc: Exception) -> JSONResponse:
        return _error(503, str(exc))

    async def gateway_down(_: Request, exc: Exception) -> JSONResponse:
        return _error(502, f"gateway metrics: {exc!r}")

    app.add_exception_handler(ToxiproxyError, toxiproxy_error)
    app.add_exception_handler(ToxicSpecError, bad_toxic)
    app.add_exception_handler(UnknownName, unknown)
    app.add_exception_handler(EngineUnreachable, engine_down)
    app.add_exception_handler(httpx.HTTPError, gateway_down)
