"""What every new stream passes before the engine starts, in one place, for
every route that starts one (OpenAI SSE, resume; polling jobs pass the checks
but take no stream slot):

    check_new_stream   broken modes when refused (400), prompt size (400),
                       drain (503 + Retry-After)
    open_engine_stream stream caps (429 + Retry-After), then the engine call;
                       the slot is released if the call cannot start, and a
                       started call is tracked by the drain
"""

from __future__ import annotations

from typing import Any

from services.gateway.drain import DRAINING, Drain
from services.gateway.engine_client import EngineClient, EngineStream
from services.gateway.errors import BadRequest, EngineError, GatewayError
from services.gateway.limits import StreamLimiter, StreamSlot
from services.gateway.metrics import GatewayMetrics
from services.gateway.openai_api import Message, StreamlabOptions
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb


def check_new_stream(state: Any, messages: list[Message],
                     options: StreamlabOptions | None) -> None:
    settings: GatewaySettings = state.settings
    broken = options.broken_modes() if options else []
    if broken and not settings.allow_broken_modes:
        raise BadRequest("broken_mode_disabled",
                         f"this gateway refuses the lab's broken modes: {', '.join(broken)}")
    prompt_chars = sum(len(m.content) for m in messages)
    if prompt_chars > settings.max_prompt_chars:
        raise BadRequest("prompt_too_long", f"messages hold {prompt_chars} characters; "
                         f"the limit is {settings.max_prompt_chars}")
    drain: Drain = state.drain
    if drain.draining:
        raise GatewayError(503, DRAINING, "gateway is draining for a restart; retry shortly",
                           headers={"Retry-After": str(settings.retry_after_s)})


async def open_engine_stream(state: Any, client_key: str, request: pb.GenerateRequest
                             ) -> tuple[EngineStream, StreamSlot]:
    limiter: StreamLimiter = state.limiter
    engine: EngineClient = state.engine
    metrics: GatewayMetrics = state.metrics
    slot = limiter.acquire(client_key)  # 429 before anything starts
    try:
        stream = await engine.open(request)
    except BaseException as exc:
        slot.release()
        if isinstance(exc, EngineError):
            metrics.engine_errors.labels(exc.code).inc()
        raise
    state.drain.track(stream)
    return stream, slot
