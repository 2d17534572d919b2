"""Waiting for a scenario's readers: past the deadline every reader is
cancelled and has unwound before the tally (no reader still moving figures)."""

from __future__ import annotations

import asyncio

import pytest

from streamlab.experiments.scenarios.history import judge_one
from streamlab.experiments.scenarios.resuming_readers import Reader, readers_done

pytestmark = pytest.mark.anyio


async def test_readers_that_outlive_the_deadline_have_unwound_when_it_returns() -> None:
    unwound: list[int] = []

    async def reader(n: int, forever: bool) -> None:
        try:
            if forever:
                await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # unwinding takes a turn of the loop
            unwound.append(n)

    reading = asyncio.gather(reader(0, False), reader(1, True), reader(2, True))
    await readers_done(reading, 0.05)
    assert sorted(unwound) == [0, 1, 2]
    assert reading.done()


async def test_readers_that_end_in_time_are_waited_for() -> None:
    reading = asyncio.gather(asyncio.sleep(0.01, result="a"), asyncio.sleep(0, result="b"))
    await readers_done(reading, 5.0)
    assert list(reading.result()) == ["a", "b"]


async def test_a_reader_records_a_replayed_token_and_an_id_less_error_as_they_are() -> None:
    """The decoder gives every event the last id in force: a replayed token
    (its id repeated) is still a duplicate, and a terminal `error` sent with
    no id of its own is the reader's end, not a repeat of the token before."""
    body = (b"retry: 100\n\n"
            b'id: s:1\nevent: token\ndata: {"index": 0, "text": "a"}\n\n'
            b'id: s:2\nevent: token\ndata: {"index": 1, "text": "b"}\n\n'
            b'id: s:2\nevent: token\ndata: {"index": 1, "text": "b"}\n\n'
            b'event: error\ndata: {"code": "resume_store_unavailable"}\n\n')

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        read = await Reader("127.0.0.1", port, "/v1/streams/s/events", watchdog_s=5.0).run()
    assert [(s.kind, s.seq) for s in read.history.seen] == [
        ("token", 1), ("token", 2), ("token", 2), ("error", None)]
    verdict = judge_one(read.history, tokens=2)
    assert verdict.duplicates == 1
    assert not verdict.hung
    assert verdict.end == "error resume_store_unavailable"
