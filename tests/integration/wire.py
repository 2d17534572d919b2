"""Raw HTTP/1.1 captures: the exact bytes a hop carries, for aiming cuts.

Toxiproxy's `limit_data` counts every byte of a connection (status line,
headers, chunk framing), so a cut "right after `na\\xc3`" needs the wire
offset, not the body offset. A reference capture of an identical stream on
the same hop gives it: stream ids have a fixed length, so every later stream
has the same layout (on `upstream` exactly, since uvicorn writes one chunk per
event; through nginx a few bytes may shift if two events share one read).
"""

from __future__ import annotations

import asyncio

TERMINATOR = b"\r\n0\r\n\r\n"  # the last chunk of a chunked response


async def capture(host: str, port: int, path: str, timeout_s: float = 10.0) -> bytes:
    """GET `path` on host:port with a keep-alive request (as nginx and browsers
    send, so the response has the same headers) and return every byte read up
    to the end of the chunked body."""
    request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
               "Accept: text/event-stream\r\nAccept-Encoding: identity\r\n\r\n").encode()
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(request)
            await writer.drain()
            wire = bytearray()
            while not wire.endswith(TERMINATOR):
                chunk = await reader.read(65536)
                if not chunk:
                    break
                wire += chunk
            return bytes(wire)
        finally:
            writer.close()


def header_length(wire: bytes) -> int:
    return wire.index(b"\r\n\r\n") + 4


def offset_after(wire: bytes, marker: bytes, occurrence: int = 1) -> int:
    """The offset just past the n-th occurrence of `marker` in the body."""
    at = header_length(wire)
    for _ in range(occurrence):
        at = wire.index(marker, at) + len(marker)
    return at
