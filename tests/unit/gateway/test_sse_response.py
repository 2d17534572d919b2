"""The SSE response without sse-starlette's task group (services/gateway/sse_response.py),
driven as uvicorn drives it (an ASGI call with a receive and a send): what each
way of ending does to the body, the hooks and what reaches the socket. Each test
names the broken shape it would catch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from sse_starlette import ServerSentEvent
from sse_starlette.sse import AppStatus

from services.gateway import sse_response
from services.gateway.sse_response import GuardedEventSourceResponse, last_events

pytestmark = pytest.mark.anyio
SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


class Client:
    """receive() and send() of one connection; `leave()` sends http.disconnect."""

    def __init__(self) -> None:
        self.sent: list[MutableMapping[str, Any]] = []
        self._left = asyncio.Event()

    async def receive(self) -> MutableMapping[str, Any]:
        await self._left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)

    def leave(self) -> None:
        self._left.set()

    def bodies(self) -> list[tuple[bytes, bool]]:
        return [(m["body"], m["more_body"]) for m in self.sent
                if m["type"] == "http.response.body"]


class Body:
    """An event generator that records how it ended."""

    def __init__(self, *events: ServerSentEvent | bytes, then_wait: bool = False) -> None:
        self.events = events
        self.then_wait = then_wait
        self.started = asyncio.Event()
        self.ended = ""

    async def run(self) -> AsyncIterator[ServerSentEvent | bytes]:
        try:
            for event in self.events:
                yield event
            self.started.set()
            if self.then_wait:
                await asyncio.Future()  # a prefill that never ends
            self.ended = "done"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise


def response(body: Body, hooks: list[str], ping_s: float = 0) -> GuardedEventSourceResponse:
    return GuardedEventSourceResponse(lambda: hooks.append("close"),
                                      lambda: hooks.append("disconnect"), body.run(),
                                      ping=ping_s, sep="\n")


async def test_the_last_events_end_the_body_in_the_same_send() -> None:
    """Broken: the tail sent event by event, then an empty end (four writes)."""
    client, hooks = Client(), list[str]()
    tail = last_events(ServerSentEvent(data="finish"), ServerSentEvent(data="[DONE]"))
    body = Body(b"data: token\n\n", tail)
    await response(body, hooks)(SCOPE, client.receive, client.send)
    assert client.sent[0]["type"] == "http.response.start"
    # The same bytes as the events one by one (each event's own encoding).
    same = ServerSentEvent(data="finish").encode() + ServerSentEvent(data="[DONE]").encode()
    assert client.bodies() == [(b"data: token\n\n", True), (same, False)]
    assert body.ended == "done"  # the generator ran to its end after the last chunk
    assert hooks == ["close"]


async def test_a_body_without_a_last_chunk_still_ends_with_an_empty_send() -> None:
    client, hooks = Client(), list[str]()
    await response(Body(b"data: a\n\n"), hooks)(SCOPE, client.receive, client.send)
    assert client.bodies() == [(b"data: a\n\n", True), (b"", False)]


async def test_a_client_that_leaves_cancels_the_body_and_the_response_returns() -> None:
    """Broken: the disconnect unnoticed (the body waits on), or the cancel
    escaping the response as an error."""
    client, hooks = Client(), list[str]()
    body = Body(b"data: a\n\n", then_wait=True)
    running = asyncio.create_task(response(body, hooks)(SCOPE, client.receive, client.send))
    await body.started.wait()
    client.leave()
    await asyncio.wait_for(running, 5)  # returns: no CancelledError, no error
    assert body.ended == "cancelled"
    assert hooks == ["disconnect", "close"]
    assert running.get_loop() is asyncio.get_running_loop()


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    """Broken: the response swallowing a cancel that was not its own (uvicorn's
    shutdown timeout cancelling the request)."""
    client, hooks = Client(), list[str]()
    body = Body(then_wait=True)
    running = asyncio.create_task(response(body, hooks)(SCOPE, client.receive, client.send))
    await body.started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert hooks == ["close"]


async def test_server_shutdown_ends_every_live_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken: a stream that outlives the server's exit (sse-starlette ended
    them through a listener per stream; here one watcher per loop does)."""
    monkeypatch.setattr(sse_response._ShutdownWatch, "POLL_S", 0.01)
    clients, hooks = [Client(), Client()], list[str]()
    bodies = [Body(then_wait=True), Body(then_wait=True)]
    running = [asyncio.create_task(response(b, hooks)(SCOPE, c.receive, c.send))
               for b, c in zip(bodies, clients, strict=True)]
    for body in bodies:
        await body.started.wait()
    monkeypatch.setattr(AppStatus, "should_exit", True)
    await asyncio.wait_for(asyncio.gather(*running), 5)
    assert [b.ended for b in bodies] == ["cancelled", "cancelled"]
    assert hooks == ["close", "close"]
    # Cut, as sse-starlette's task group cut them: no end of body is sent.
    assert [c.bodies() for c in clients] == [[], []]


async def test_a_heartbeat_that_cannot_be_sent_ends_the_response_with_its_error() -> None:
    """Broken: the heartbeat's failure lost in its task while the body waits on."""
    hooks: list[str] = []

    class Failing(Client):
        async def send(self, message: MutableMapping[str, Any]) -> None:
            if message.get("body", b"").startswith(b":"):
                raise OSError("the socket is gone")
            await super().send(message)

    client = Failing()
    body = Body(then_wait=True)
    with pytest.raises(OSError, match="the socket is gone"):
        await asyncio.wait_for(response(body, hooks, ping_s=0.01)(
            SCOPE, client.receive, client.send), 5)
    assert body.ended == "cancelled"
    assert hooks == ["close"]


class Stubborn:
    """A body under a library that swallows the first cancel (redis-py on
    Python 3.11) and streams on; or one whose cleanup outlasts RECANCEL_S."""

    def __init__(self, swallow: bool, cleanup_s: float = 0.0) -> None:
        self.swallow, self.cleanup_s = swallow, cleanup_s
        self.started = asyncio.Event()
        self.cleaned_up = False
        self.sent_after_leave = 0

    async def run(self) -> AsyncIterator[bytes]:
        swallowed = False
        try:
            while True:
                self.started.set()
                try:
                    await asyncio.sleep(0.02)
                except asyncio.CancelledError:
                    if not self.swallow or swallowed:
                        raise
                    swallowed = True
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                if swallowed:
                    self.sent_after_leave += 1
                yield b"data: t\n\n"
        finally:
            await asyncio.sleep(self.cleanup_s)  # the reader's removal from the store
            self.cleaned_up = True


async def leave_while_streaming(body: Stubborn) -> list[str]:
    """Run the response on `body`, leave once it streams, wait for the
    response to return (5 s at most); the hooks it called."""
    client, hooks = Client(), list[str]()
    running = asyncio.create_task(GuardedEventSourceResponse(
        lambda: hooks.append("close"), lambda: hooks.append("disconnect"), body.run(),
        sep="\n")(SCOPE, client.receive, client.send))
    await body.started.wait()
    client.leave()
    await asyncio.wait_for(running, 5)
    return hooks
async def test_a_body_that_swallowed_the_cancel_and_streams_on_is_cancelled_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken: a one-shot cancel: the body streams to nobody for as long as
    its generation runs."""
    monkeypatch.setattr(sse_response, "RECANCEL_S", 0.1)
    body = Stubborn(swallow=True)
    hooks = await leave_while_streaming(body)
    assert body.cleaned_up
    assert 0 < body.sent_after_leave < 20  # about RECANCEL_S of tokens, not forever
    assert hooks == ["disconnect", "close"]


async def test_a_body_whose_cleanup_is_slow_is_not_cancelled_into_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Broken: the re-cancel fires at a body that is unwinding (it sends
    nothing) and cuts its cleanup short: its reader stays in the record."""
    monkeypatch.setattr(sse_response, "RECANCEL_S", 0.05)
    body = Stubborn(swallow=False, cleanup_s=0.3)
    hooks = await leave_while_streaming(body)
    assert body.cleaned_up
    assert hooks == ["disconnect", "close"]
