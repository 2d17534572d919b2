"""The load generator's whole parser: count token events per read (a mark split
across reads counted once), note [DONE], refuse a non-200, and turn arrival
times into TTFT and inter-chunk figures (tokens in one read are bunched: 0)."""

from __future__ import annotations

import asyncio

import pytest

from streamlab.experiments.bench.load import SteadyWindow, _Stream, http_request, summarize

pytestmark = pytest.mark.anyio

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"


def event(text: str) -> bytes:
    return (b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"'
            + text.encode() + b'"},"finish_reason":null}]}\n\n')


FINISH = b'data: {"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True


async def test_tokens_are_counted_once_even_when_a_mark_straddles_two_reads() -> None:
    stream = _Stream(b"GET", 0.0)
    transport = Transport()
    stream.connection_made(transport)
    wire = HEAD + event("a") + event("b") + event("c") + FINISH + b"data: [DONE]\n\n"
    # One byte at a time: every mark is split across reads somewhere.
    for i in range(len(wire)):
        stream.data_received(wire[i:i + 1])
    assert stream.tokens == 3
    assert stream.finished
    assert transport.closed
    assert transport.written == b"GET"


async def test_a_refusal_is_an_error_not_a_stream() -> None:
    stream = _Stream(b"GET", 0.0)
    stream.connection_made(Transport())
    stream.data_received(b"HTTP/1.1 429 Too Many Requests\r\n\r\n{}")
    stream.connection_lost(None)
    assert stream.error == "HTTP 429"
    assert stream.tokens == 0


async def test_tokens_in_one_read_are_bunched_and_ttft_counts_from_the_request() -> None:
    stream = _Stream(b"GET", 10.0)
    stream.arrivals = [(10.1, 1), (10.12, 3)]
    stream.tokens, stream.finished = 4, True
    result = summarize([stream], {}, 1, 1.0, 2.0)
    assert result.completed == 1
    assert result.ttft_ms["p50"] == pytest.approx(100.0)
    # gaps: 20 ms to the second read, 0 for the two tokens that came with it
    assert result.icl_ms["p50"] == pytest.approx(0.0)
    assert result.icl_ms["p99"] == pytest.approx(19.6, abs=0.01)
    assert result.client_us_per_token == pytest.approx(500.0)


def test_the_request_is_plain_http_1_1_with_a_length() -> None:
    request = http_request("h", 1, "/v1/chat/completions", {"a": 1})
    head, body = request.split(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"Content-Length: 7" in head
    assert body == b'{"a":1}'


def streams_in_window(count: int) -> tuple[SteadyWindow, list[_Stream], list[int]]:
    """`count` streams sharing a steady window; its edges note the tokens read so far."""
    opened: list[_Stream] = []
    edges: list[int] = []
    window = SteadyWindow(lambda: edges.append(sum(s.tokens for s in opened)))
    window.arm(count, opened)
    for _ in range(count):
        stream = _Stream(b"GET", 0.0, steady=window)
        stream.connection_made(Transport())
        stream.data_received(HEAD)
        opened.append(stream)
    return window, opened, edges


async def test_the_steady_window_runs_from_the_last_first_token_to_the_first_end() -> None:
    window, (a, b, c), edges = streams_in_window(3)
    a.data_received(event("1") + event("2"))
    b.data_received(event("1"))
    a.data_received(event("3"))
    assert window.state == "waiting"
    assert edges == []
    c.data_received(event("1"))  # the last stream's first token opens it
    assert window.state == "open"
    assert edges == [5]
    b.data_received(event("2") + event("3"))
    c.data_received(event("2"))
    a.data_received(event("4") + FINISH + b"data: [DONE]\n\n")  # the first end closes it
    assert window.state == "closed"
    assert len(edges) == 2
    # In it: b's 2, c's 2nd, a's 4th; not c's first read (paid before it opened).
    assert window.tokens == 4
    assert window.seconds is not None
    assert window.seconds >= 0
    b.data_received(event("4") + FINISH + b"data: [DONE]\n\n")
    a.connection_lost(None)
    assert len(edges) == 2
    assert window.tokens == 4


async def test_a_stream_that_ends_before_all_have_begun_leaves_no_window() -> None:
    window, (a, b), edges = streams_in_window(2)
    a.data_received(event("1"))
    b.connection_lost(ConnectionResetError())  # cut before its first token
    a.data_received(event("2"))
    assert window.state == "closed"
    assert edges == []
    assert window.tokens is None
    assert window.seconds is None


async def test_a_refused_stream_leaves_no_window_and_a_new_run_forgets_the_last() -> None:
    window, (a, b), edges = streams_in_window(2)
    a.data_received(event("1"))
    b.data_received(event("1"))
    a.data_received(event("2") + FINISH + b"data: [DONE]\n\n")
    assert window.tokens == 1
    # Run again on the same window: the second stream is refused (503).
    opened: list[_Stream] = []
    window.arm(2, opened)
    for head in (HEAD, b"HTTP/1.1 503 Service Unavailable\r\n\r\n{}"):
        stream = _Stream(b"GET", 0.0, steady=window)
        stream.connection_made(Transport())
        opened.append(stream)
        stream.data_received(head)
    opened[0].data_received(event("1"))
    opened[1].connection_lost(None)
    assert opened[1].error == "HTTP 503"
    assert window.state == "closed"
    assert window.tokens is None
    assert window.seconds is None
    assert len(edges) == 2  # only the first run's
