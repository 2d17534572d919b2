"""Bytes the kernel holds on each TCP connection of the chain, read from
/proc/net/tcp: how much of a stream sits in socket buffers between the
gateway and a client that stopped reading.

Each established socket has a send queue (`tx_queue`: written by its
process, not yet acknowledged by the peer) and a receive queue (`rx_queue`:
arrived, not yet read by its process). A connection's bytes in flight are
the sender's send queue plus the receiver's receive queue. Grouped by the
port each side listens on or dials, they say which hop holds what:

    client ◀── edge (Toxiproxy) ◀── nginx ◀── upstream (Toxiproxy) ◀── gateway
          conn 1               conn 2     conn 3                  conn 4

Only sockets in this host's network namespace are seen: a local-process lab
(a compose lab's services live in their containers' namespaces).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ESTABLISHED = 0x01
PROC_NET_TCP = Path("/proc/net/tcp")


@dataclass(frozen=True)
class SocketQueue:
    local: tuple[str, int]
    remote: tuple[str, int]
    tx: int  # send queue: written, not yet acknowledged by the peer
    rx: int  # receive queue: arrived, not yet read by the process


def _address(field: str) -> tuple[str, int]:
    host, port = field.split(":")
    # /proc/net/tcp prints the IPv4 address as a native-endian 32-bit hex word.
    packed = struct.pack("=I", int(host, 16))
    return socket.inet_ntoa(packed), int(port, 16)


def parse(text: str) -> list[SocketQueue]:
    """Established sockets of a /proc/net/tcp listing."""
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 5 or int(fields[3], 16) != ESTABLISHED:
            continue
        tx, rx = (int(q, 16) for q in fields[4].split(":"))
        sockets.append(SocketQueue(_address(fields[1]), _address(fields[2]), tx, rx))
    return sockets


def read(path: Path = PROC_NET_TCP) -> list[SocketQueue] | None:
    """This namespace's established TCP sockets; None where there is no /proc."""
    try:
        return parse(path.read_text())
    except OSError:
        return None


def held_by(sockets: Iterable[SocketQueue], *, listens_on: int | None = None,
            dials: int | None = None) -> int:
    """Bytes queued in the sockets a process holds on one side of a hop: the ones it
    accepted on `listens_on` (send queues: towards its client) or dialled to `dials`
    (receive queues: from its upstream). Send queues count towards the client side,
    receive queues towards the upstream side, as a stream flows to the client."""
    total = 0
    for s in sockets:
        if listens_on is not None and s.local[1] == listens_on:
            total += s.tx
        if dials is not None and s.remote[1] == dials:
            total += s.rx
    return total
