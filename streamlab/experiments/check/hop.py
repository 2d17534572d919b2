"""The check's own hops in front of the target.

    toxiproxy_hop   the lab's patched Toxiproxy (find_toxiproxy), one proxy
                    "target" from a free local port to the target: every check
                    goes through it, so faults can be injected on the way (the
                    pytest plugin's `streamlab_toxics` does) without touching
                    the server under test
    idle_cut_relay  a TCP relay that closes a connection after `idle_s` with no
                    byte from the server, as a proxy's read timeout does (nginx's
                    proxy_read_timeout, a load balancer's idle timeout). Why not a
                    Toxiproxy toxic: its `timeout` toxic stops the data and closes
                    after a fixed time from when it is added, bytes or no bytes,
                    so it cuts a heartbeating stream too; an idle cut must count
                    from the last byte.
    idle_cut_relay_thread  the same relay on an event loop of its own in a
                    thread, for synchronous callers (the pytest plugin's
                    `streamlab_toxics.idle_cut`, which points a lab hop at it)
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from streamlab.lab.own_toxiproxy import own_toxiproxy

PROXY = "target"  # the one proxy's name on the check's Toxiproxy


@dataclass(frozen=True)
class Hop:
    api: str  # the Toxiproxy API's base URL
    port: int  # where the proxy listens on 127.0.0.1


@contextlib.contextmanager
def toxiproxy_hop(host: str, port: int, run_dir: Path | None = None) -> Iterator[Hop]:
    """A Toxiproxy of the check's own, with one proxy to host:port; stopped on exit."""
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="check-")))
        hop = stack.enter_context(own_toxiproxy({PROXY: f"{host}:{port}"}, run_dir))
        yield Hop(hop.api, hop.listen[PROXY])


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                idle_s: float | None) -> None:
    """Copy until EOF; with `idle_s`, give up after that long with no byte."""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), idle_s)
            if not chunk:
                break
            writer.write(chunk)
            await writer.drain()
    except (TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def idle_cut_relay(host: str, port: int, idle_s: float | None) -> AsyncIterator[int]:
    """A relay on a free local port to host:port that cuts a connection (both
    ways) after `idle_s` with no byte from the server (never, with None: a
    plain relay); yields its port."""
    tasks: set[asyncio.Task[None]] = set()

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, port)
        except OSError:
            client_w.close()
            return
        up = asyncio.create_task(_pipe(client_r, server_w, None))
        down = asyncio.create_task(_pipe(server_r, client_w, idle_s))
        tasks.update((up, down))
        # Whichever way ends first ends the connection: a cut closes both sides.
        await asyncio.wait((up, down), return_when=asyncio.FIRST_COMPLETED)
        server_w.close()
        client_w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def idle_cut_relay_thread(host: str, port: int, idle_s: float) -> Iterator[int]:
    """idle_cut_relay served from a thread with its own event loop; yields its
    port, and stops it (every connection closed) on exit."""
    ready: Future[tuple[int, asyncio.AbstractEventLoop, asyncio.Event]] = Future()

    async def serve() -> None:
        stop = asyncio.Event()
        async with idle_cut_relay(host, port, idle_s) as listening:
            ready.set_result((listening, asyncio.get_running_loop(), stop))
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # a relay that could not start: tell the caller
            if not ready.done():
                ready.set_exception(exc)
            raise

    thread = threading.Thread(target=run, name="idle-cut-relay", daemon=True)
    thread.start()
    listening, loop, stop = ready.result(timeout=10.0)
    try:
        yield listening
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=10.0)
