"""Slow reader: a client that stops reading. Does the server pause its
generation (backpressure), cut the stream, or keep generating into a buffer
that grows with every token nobody reads?

The last is the one that hurts: the server's memory grows by the answer for
every stalled client (a phone in a tunnel, a tab in the background), and the
model spends its slot on tokens nobody is reading. From outside it shows two
ways, the first the server allows is used (the figure `observed_by` says which):

    metrics  the server's own gauge of running generations (metrics.py): a
             server that pauses still counts the generation when the reader
             comes back; one that buffers has finished it while the reader
             held a handful of tokens
    timing   how the rest of the answer comes once the reader reads again: a
             server that paused goes on at its generation pace (the rest takes
             about as long as it took unimpeded, less what the buffers held);
             one that buffered has it all made, and it comes at the network's
             speed. Judged when the answer has a pace to see (MIN_PACE_S), and
             only when the drain is clearly one or the other

    1. the answer read straight through: its size and how long it takes
    2. the same request read for READ_BEFORE tokens, then nothing for the pause
       (longer than the whole answer takes unimpeded), the gauge sampled at its
       end, then read to the end

Judged only on what can tell: the answer must be larger than what the
transport can hold for a reader that stopped (MIN_ANSWER_BYTES; Needs.LONG),
and the reader asks for a real network's buffers (a 16 KiB receive buffer, an
Ethernet MSS) instead of loopback's autotuned megabytes. It reads the server
straight, never through the check's own hop (a proxy's buffers would be
judged instead), so point it at the server, not at a proxy in front of it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any

import anyio
import httpcore
import httpx

from services.client.openai_stream import StreamResult
from streamlab.experiments.check.cancel import running_gauge, settled
from streamlab.experiments.check.metrics import read_gauge
from streamlab.experiments.check.registry import Session, check
from streamlab.experiments.check.target import CheckTarget, Needs
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import JSON, Check, Figure, Report

STORY = "a reader that stops reading pauses the generation (or is cut), never buffers it"
READ_BEFORE = 5  # tokens read before the reader stops
# ~2 MB of chunks. What the path can hold for a stopped reader, with the socket
# below: the reader's 32 KiB (the kernel doubles what is asked), the server's
# send buffer autotuned from its congestion window (at most 2 × the segments in
# flight, so a few hundred KB), and the server's own write buffer (asyncio's
# 64 KiB): well under MIN_ANSWER_BYTES, and the answer is twice that.
MIN_ANSWER_BYTES = 1 << 20
MIN_PAUSE_S = 3.0
MAX_UNIMPEDED_S = 30.0  # an answer slower than this needs too long a pause to judge
MIN_PACE_S = 0.5  # timing: an answer made faster than this has no pace to see after a pause
# timing: the rest of the answer came in this fraction of the time its making took
# unimpeded: below, it was made during the pause (buffered); above, it was made after
# (paused); between, the check cannot say.
BUFFERED_BELOW, PAUSED_ABOVE = 0.25, 0.5
RECEIVE_BUFFER = 16 * 1024
ETHERNET_MSS = 1460
FIX = ("let the socket's backpressure reach the generation: await each write (a bounded "
       "queue between the model and the response), never a queue nobody bounds; or cut "
       "a reader that does not read for long (a send timeout)")


class _Socket(httpcore.AsyncNetworkStream):
    """A connected plain socket as httpcore's stream (the event loop's own
    sock_recv / sock_sendall), timeouts and failures as httpcore's errors."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    # httpcore's interface passes the timeouts (ASYNC109: the signature is not ours).
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.sock_recv(self.sock, max_bytes), timeout)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_sendall(self.sock, buffer), timeout)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self.sock.close()

    def get_extra_info(self, info: str) -> Any:
        return self.sock if info == "socket" else None


class _SmallWindow(httpcore.AsyncNetworkBackend):
    """Connections whose receive buffer and MSS are set before connecting: the
    MSS is announced in the handshake, so httpx's socket_options (applied
    after it) come too late for it."""

    async def connect_tcp(self, host: str, port: int,
                          timeout: float | None = None,  # noqa: ASYNC109
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> _Socket:
        family, kind, proto, _, address = (await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM))[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            if hasattr(socket, "TCP_MAXSEG"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, ETHERNET_MSS)
            sock.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address),
                                   timeout)
        except TimeoutError as exc:
            sock.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return _Socket(sock)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def reader_transport() -> httpx.AsyncHTTPTransport:
    """A client socket as on a real network path: an explicit receive buffer
    (which also turns off its autotuning) and an Ethernet MSS, so the server's
    send buffer is sized as for one; on loopback both grow to megabytes (Linux
    sizes the autotuned send buffer from the MSS: 64 KiB there, so ~4 MiB) and
    hide any server's behaviour (services/client/silent.py does the same)."""
    transport = httpx.AsyncHTTPTransport()
    # httpx takes no network backend of its own; its pool (httpcore's) does.
    transport._pool = httpcore.AsyncConnectionPool(network_backend=_SmallWindow())
    return transport


def long_body(target: CheckTarget) -> dict[str, JSON]:
    tokens = target.answer_tokens
    return target.body(f"Count from 1 to {tokens}, one number per line.", max_tokens=tokens,
                       lab={"prefill_ms": 0, "token_gap_ms": 0, "answer_tokens": tokens})


def behaviour(record: StreamResult, running_before: float, running_at_end: float | None) -> str:
    """paused, cut or buffered: what the server did while the reader stopped."""
    if not record.done:
        return "cut"
    if running_at_end is not None and running_at_end > running_before:
        return "paused"
    return "buffered"


def behaviour_by_timing(whole: StreamResult, stalled: StreamResult
                        ) -> tuple[str, float | None]:
    """paused, cut, buffered or unclear, and the drain ratio: how long the rest
    of the answer took after the pause over how long making it took unimpeded."""
    if not stalled.done:
        return "cut", None
    if stalled.paused_at_s is None or stalled.paused_s is None:
        return "unclear", None
    resumed = stalled.paused_at_s + stalled.paused_s
    answer_bytes = sum(n for _, n in whole.reads)
    rest = sum(n for t, n in stalled.reads if t > stalled.paused_at_s)
    making_s = whole.total_s - (whole.first_token_s or 0.0)
    expected = making_s * rest / answer_bytes if answer_bytes else 0.0
    if expected <= 0:
        return "unclear", None
    ratio = (stalled.total_s - resumed) / expected
    if ratio < BUFFERED_BELOW:
        return "buffered", ratio
    return ("paused" if ratio > PAUSED_ABOVE else "unclear"), ratio


@check("slow-reader", STORY, headline=("observed_by", "behaviour", "answer_bytes"),
       budget_s=lambda target: 2 * target.stream_deadline_s + 2 * MAX_UNIMPEDED_S + 30.0)
async def slow_reader(session: Session) -> Report:
    metrics, target = session.client, session.target
    source, no_metrics = await running_gauge(session)
    straight = target.direct()
    timeout = httpx.Timeout(target.timeout_s, connect=10.0)
    # A client, so a connection, for each read: the straight read grows its
    # connection's congestion window, and with it the server's autotuned send
    # buffer, to megabytes; the stalled read must start from a fresh one.
    async with httpx.AsyncClient(transport=reader_transport(), timeout=timeout) as client:
        whole = await session.stream(long_body(straight), target=straight, client=client,
                                     deadline_s=MAX_UNIMPEDED_S + 2.0)
    answer_bytes = sum(n for _, n in whole.reads)
    figures: dict[str, Figure] = {
        "observed_by": f"metrics ({source.name})" if source else "timing (no running gauge)",
        "answer_bytes": answer_bytes, "answer_tokens": whole.token_chunks,
        "unimpeded_s": whole.total_s}
    if not whole.done:
        hint = (" (a smaller --answer-tokens)" if (whole.error or {}).get("code") == "deadline"
                else "")
        return not_applicable("slow-reader", STORY, "the long answer did not complete "
                              f"read straight through ({whole.error_text}){hint}", figures)
    if answer_bytes < MIN_ANSWER_BYTES:
        return not_applicable("slow-reader", STORY, f"needs {Needs.LONG}: the whole answer "
                              f"({answer_bytes} bytes) fits the transport's buffers, so a "
                              "stopped reader cannot be felt", figures)
    if whole.total_s > MAX_UNIMPEDED_S:
        return not_applicable("slow-reader", STORY, f"the answer takes {whole.total_s:.3g} "
                              "s unimpeded: too long a pause to outlast it (a smaller "
                              "--answer-tokens)", figures)
    if source is None and whole.total_s - (whole.first_token_s or 0.0) < MIN_PACE_S:
        return not_applicable("slow-reader", STORY, f"not observable: the answer was made in "
                              f"{whole.total_s:.3g} s, too fast for its pace to show after a "
                              f"pause, and {no_metrics}", figures)
    pause_s = max(MIN_PAUSE_S, 2 * whole.total_s)
    before = 0.0
    if source is not None:
        before = await settled(session, source, await read_gauge(metrics, source) or 0.0)
    at_end: float | None = None

    async def hold_off() -> None:  # read nothing; what does the server do meanwhile?
        nonlocal at_end
        await anyio.sleep(pause_s)
        if source is not None:
            at_end = await read_gauge(metrics, source)

    async with httpx.AsyncClient(transport=reader_transport(), timeout=timeout) as client:
        stalled = await session.stream(long_body(straight), target=straight, client=client,
                                       pause_after_tokens=READ_BEFORE, pause=hold_off)
    if stalled.paused_at_s is None:
        return not_applicable("slow-reader", STORY, f"the stream ended before {READ_BEFORE} "
                              f"tokens ({stalled.error_text}): nothing to stop reading", figures)
    paused_at = stalled.paused_at_s
    figures |= {
        "pause_s": pause_s, "bytes_after_pause": sum(n for t, n in stalled.reads if t > paused_at),
        "reached_done": stalled.done, "transport_error": stalled.error_text or None}
    if source is not None:
        shown = behaviour(stalled, before, at_end)
        figures |= {"gauge": source.name, "running_before": before,
                    "running_at_pause_end": at_end, "behaviour": shown}
        return judged("slow-reader", STORY, figures, (
            Check("behaviour", "!=", "buffered",
                  f"{source.name} was back down while the reader held {READ_BEFORE} tokens: "
                  "the whole answer was generated into a buffer nobody read; " + FIX),
        ))
    shown, ratio = behaviour_by_timing(whole, stalled)
    figures |= {"behaviour": shown, "drain_ratio": ratio, "confidence": "inferred from timing"}
    if shown == "unclear":
        return not_applicable("slow-reader", STORY, f"not observable by timing: the rest of "
                              f"the answer came in {ratio if ratio is not None else 0:.2f} of "
                              "the time its making took, neither clearly at once (buffered) "
                              f"nor at its pace (paused); {no_metrics}", figures)
    return judged("slow-reader", STORY, figures, (
        Check("behaviour", "!=", "buffered",
              f"the rest of the answer came {1 / max(ratio or 1e-9, 1e-9):.0f}x faster than "
              "it was made: it was generated during the pause, into a buffer nobody read "
              "(inferred by timing, no running gauge); " + FIX),
    ))
