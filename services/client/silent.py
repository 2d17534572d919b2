"""A client that sends its request and then never reads: the slow-reader case.

It shrinks its receive buffer before connecting, so the TCP window it offers
closes after a few KB, and it announces an Ethernet-sized MSS: on loopback the
MSS is 64 KiB, and Linux sizes the server's autotuned send buffer from it
(2 × cwnd × MSS, ~4 MiB), a loopback artefact that would hide backpressure
behind megabytes no real network path gives a connection. The caller owns the
socket and must close it.
"""

from __future__ import annotations

import json
import socket
from typing import Any


def open_silent_reader(host: str, port: int, path: str, body: dict[str, Any],
                       headers: dict[str, str] | None = None, rcvbuf: int = 4096, mss: int = 1448,
                       timeout_s: float = 5.0) -> socket.socket:
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}",
            "Content-Type: application/json", f"Content-Length: {len(payload)}",
            "Accept: text/event-stream"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
        sock.settimeout(timeout_s)
        sock.connect((host, port))
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    except OSError:
        sock.close()
        raise
    return sock
