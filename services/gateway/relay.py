"""How engine responses travel from the gRPC call to the SSE writer.

`direct` (the default, and the right way): the SSE body iterates the call
itself. A slow client makes the body's `send` wait, so it stops reading the
call, and gRPC's flow control stops the engine's writes: memory stays bounded.
A client that leaves cancels the body, whose `close()` cancels the call.

`detached_unbounded` (the seed's anti-pattern, kept for contrast): a background
task drains the call into an unbounded queue that nobody bounds and nobody
cancels. A slow client grows the queue without limit; a client that leaves
does not stop the engine, which writes the whole answer for nobody. Select it
per request with `"streamlab": {"relay": "detached_unbounded"}` to see both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Literal

from services.gateway.engine_client import EngineStream
from services.gateway.errors import EngineError
from streamlab_protocol.engine.v1 import engine_pb2 as pb

RelayMode = Literal["direct", "detached_unbounded"]


class Relay:
    def __init__(self, responses: AsyncIterator[pb.GenerateResponse], stream: EngineStream,
                 cancel_on_close: bool) -> None:
        self.responses = responses
        self._stream = stream
        self._cancel_on_close = cancel_on_close

    def close(self) -> None:
        """Called on every exit path of the response (synchronous: it may run
        inside a cancelled task)."""
        if self._cancel_on_close:
            self._stream.cancel()


def direct(stream: EngineStream) -> Relay:
    return Relay(aiter(stream), stream, cancel_on_close=True)


def detached_unbounded(stream: EngineStream, background: set[asyncio.Task[None]]) -> Relay:
    # Unbounded: the bug. An engine error travels as the queue's last item.
    queue: asyncio.Queue[pb.GenerateResponse | EngineError] = asyncio.Queue()

    async def drain() -> None:
        try:
            async for response in stream:
                queue.put_nowait(response)
        except EngineError as exc:
            queue.put_nowait(exc)

    task = asyncio.create_task(drain())
    background.add(task)  # keep a reference, or the loop may drop the task
    task.add_done_callback(background.discard)

    async def responses() -> AsyncIterator[pb.GenerateResponse]:
        while True:
            item = await queue.get()
            if isinstance(item, EngineError):
                raise item
            yield item
            if item.HasField("finish"):
                return

    return Relay(responses(), stream, cancel_on_close=False)


def open_relay(mode: RelayMode, stream: EngineStream,
               background: set[asyncio.Task[None]]) -> Relay:
    if mode == "detached_unbounded":
        return detached_unbounded(stream, background)
    return direct(stream)
