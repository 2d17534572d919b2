"""What the resume store needs from the rest of the gateway, as Protocols: the
gateway hands these in (a route passes its lease to `ResumeStore.create`, the
app's lifespan passes itself to `ResumeStore.open`), so this package never
imports state.py or lease.py, which import it (pyproject.toml's import
contract keeps it so).

    Lease      one engine call a stream owns (lease.py's EngineLease is one)
    Gateway    what a store that takes streams over uses of the running
               gateway (state.py's GatewayState is one)
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from services.gateway.drain import Drain
from services.gateway.engine_client import Engine, EngineEvent, EngineStream
from services.gateway.openai_api import ChatCompletionRequest


class Lease(Protocol):
    @property
    def client_key(self) -> str | None:
        """The identity that asked: it owns the stream built on the call."""
        ...

    def events(self) -> AsyncIterator[EngineEvent]: ...

    async def attach(self, after_index: int | None) -> EngineStream:
        """Re-attach to a detachable generation another replica started."""
        ...

    @property
    def detachable(self) -> bool:
        """The generation outlives its call (it can be attached again)."""
        ...

    async def reattach(self, after_index: int | None) -> EngineStream:
        """Attach again to this lease's own generation after its call dropped."""
        ...

    def abandon_call(self) -> None:
        """Leave the generation running when the lease closes (handed over)."""
        ...

    def close(self) -> None: ...

    def trace_headers(self) -> dict[str, str]:
        """`traceresponse`: the call's span context, tracing on; else none."""
        ...


class Gateway(Protocol):
    @property
    def drain(self) -> Drain: ...

    @property
    def engine(self) -> Engine: ...

    def lease(self, body: ChatCompletionRequest | None, request_id: str,
              client_key: str | None, surface: str = "sse",
              detachable: bool = False, traceparent: str | None = None) -> Lease: ...
