"""The lab's broken modes: named wrappers around a stream's events, registered
in one place and applied at one seam (`EngineLease.events()`), the way
Toxiproxy registers its toxics. The hot path of every surface stays the
correct one; a request that selects a mode gets its wrapper around the events.

    relay=detached_unbounded  a background task drains the call into an
                              unbounded queue and nobody cancels it: a slow
                              client grows the queue, a client that leaves does
                              not stop the engine, which writes on for nobody
    engine_errors=swallow     the bare `except: pass` around a relay loop: an
                              engine-hop failure ends the stream like a whole
                              answer (a finish, then `[DONE]` on SSE)
    job_ttl_s=0               a polling job that never expires (a value the job
                              store reads: services/gateway/jobs.py)

A request selects a mode with its `streamlab` options; a gateway with
`allow_broken_modes` off refuses any of them with a 400 that names them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from services.gateway.engine_client import EngineEvent
from services.gateway.errors import BadRequest, EngineError
from services.gateway.openai_api import StreamlabOptions
from streamlab_protocol.engine.v1 import engine_pb2 as pb

Events = AsyncIterator[EngineEvent]


class Call(Protocol):
    """What a mode uses of the lease that owns the call (lease.py's
    EngineLease is one; it applies the modes, so this module imports none of it)."""

    def abandon_call(self) -> None:
        """Leave the call running when the lease closes."""
        ...


Wrapper = Callable[[Call, Events, "BrokenModes"], Events]


async def detached_unbounded(lease: Call, events: Events, modes: BrokenModes) -> Events:
    queue: asyncio.Queue[EngineEvent | EngineError] = asyncio.Queue()  # unbounded: the bug

    async def drain_call() -> None:
        try:
            async for event in events:
                queue.put_nowait(event)
        except EngineError as exc:
            queue.put_nowait(exc)  # travels as the queue's last item

    lease.abandon_call()  # the task owns the call now, and nobody owns the task
    modes.spawn(drain_call())
    while True:
        item = await queue.get()
        if isinstance(item, EngineError):
            raise item
        yield item
        if isinstance(item, pb.Finish):
            return


async def swallow_engine_errors(lease: Call, events: Events, modes: BrokenModes
                                ) -> Events:
    try:
        async for event in events:
            yield event
    except EngineError:
        # Every error after the first byte alike (engine faults, deadlines, a
        # drain's retry): the client cannot tell the cut from a whole answer;
        # only the gateway's engine_errors counter knows.
        yield pb.Finish(reason=pb.FINISH_REASON_STOP)


@dataclass(frozen=True)
class BrokenMode:
    name: str  # how a refusal names it: the knob and its broken value
    selected_by: Callable[[StreamlabOptions], bool]
    wrap: Wrapper | None  # None: a value the surface reads itself


REGISTRY: tuple[BrokenMode, ...] = (
    BrokenMode("relay=detached_unbounded", lambda o: o.relay == "detached_unbounded",
               detached_unbounded),
    BrokenMode("engine_errors=swallow", lambda o: o.engine_errors == "swallow",
               swallow_engine_errors),
    BrokenMode("job_ttl_s=0", lambda o: o.job_ttl_s == 0, None),
)


def selected(options: StreamlabOptions | None) -> list[BrokenMode]:
    return [mode for mode in REGISTRY if options is not None and mode.selected_by(options)]


class BrokenModes:
    """One per app: refuses the modes unless allowed, applies them, and keeps a
    reference to each task a mode leaves behind (the loop keeps only weak ones)."""

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed
        self._background: set[asyncio.Task[None]] = set()

    def admit(self, options: StreamlabOptions | None) -> None:
        modes = selected(options)
        if modes and not self.allowed:
            raise BadRequest("broken_mode_disabled", "this gateway refuses the lab's broken "
                             f"modes: {', '.join(mode.name for mode in modes)}")

    def apply(self, lease: Call, options: StreamlabOptions | None, events: Events
              ) -> Events:
        for mode in selected(options):
            if mode.wrap is not None:
                events = mode.wrap(lease, events, self)
        return events

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
