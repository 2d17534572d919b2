"""The lab's Toxiproxy keeps answering while a reader has stopped reading.

Upstream Toxiproxy wedges its control API for good when a toxic is added,
changed or removed on a proxy whose link is blocked writing to a reader that
stopped: the link's last toxic sits in a send no interrupt reaches, holding
the proxy's lock (upstream's open report "Toxiproxy control port hangs on
removing a toxic"). The lab makes such readers on purpose
(the slow-reader scenarios, the soak's stalled clients), so one catalogue run
could leave the edge unusable until the lab restarted. The lab builds
Toxiproxy with its own patch (scripts/build_toxiproxy.sh); this test runs the
binary the lab runs, over its HTTP API, against a real stalled TCP reader.
`scripts/build_toxiproxy.sh --show-wedge` shows the same scenario hanging on
the unpatched source (Go's test beside the patch).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streamlab.lab.own_toxiproxy import own_toxiproxy
from streamlab.lab.toxiproxy import Toxic, Toxiproxy
from tests.wait import wait_until

pytestmark = pytest.mark.integration

# A change that waits for the blocked writer never returns (the API's own
# timeout answers 503 after 25 s); a patched one returns in milliseconds.
API_TIMEOUT_S = 3.0


def pattern(start: int, length: int) -> bytes:
    """Byte i of the stream is a function of i: a lost, repeated or reordered
    chunk shows up as a wrong byte."""
    return bytes((i * 131 + (i >> 8)) & 0xFF for i in range(start, start + length))


@dataclass
class PatternServer:
    """Writes the pattern as fast as its one client lets it, counting what the
    kernel accepted; stops when the client goes."""

    listener: socket.socket
    written: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            while not self.stop.is_set():
                try:
                    conn.settimeout(0.2)
                    self.written += conn.send(pattern(self.written, 16384))
                except TimeoutError:
                    continue  # full: the reader is not reading; ask again
                except OSError:
                    return


@pytest.fixture
def pattern_server() -> Iterator[PatternServer]:
    listener = socket.create_server(("127.0.0.1", 0))
    server = PatternServer(listener)
    thread = threading.Thread(target=server.serve, daemon=True)
    thread.start()
    yield server
    server.stop.set()
    listener.close()
    thread.join(timeout=5)


@pytest.fixture
def stalled_hop(pattern_server: PatternServer, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The lab's Toxiproxy binary with one proxy `stalled` in front of the pattern server."""
    with own_toxiproxy({"stalled": f"127.0.0.1:{pattern_server.port}"},
                       tmp_path / "toxiproxy") as hop:
        yield hop.api, hop.listen["stalled"]


def stalled_reader(port: int) -> socket.socket:
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills fast
    reader.connect(("127.0.0.1", port))
    return reader


def until_still(server: PatternServer) -> int:
    """Waits until nothing more gets through for 300 ms: every buffer on the way
    is full and Toxiproxy's writer to the reader is blocked. Returns the count."""
    seen = {"count": -1, "since": time.monotonic()}

    def still() -> int | None:
        if server.written != seen["count"]:
            seen["count"], seen["since"] = server.written, time.monotonic()
            return None
        return server.written if time.monotonic() - seen["since"] >= 0.3 else None

    return wait_until(still, timeout_s=15, what="the link to fill up behind a stalled reader",
                      interval_s=0.02)


def read_exactly(reader: socket.socket, count: int) -> bytes:
    reader.settimeout(20)
    data = bytearray()
    while len(data) < count:
        chunk = reader.recv(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data[:count])


def test_toxic_changes_answer_while_a_reader_is_stalled_and_nothing_is_lost(
        stalled_hop: tuple[str, int], pattern_server: PatternServer) -> None:
    api, listen_port = stalled_hop
    reader = stalled_reader(listen_port)
    try:
        before = until_still(pattern_server)
        assert before > 0
        with Toxiproxy(api, timeout_s=API_TIMEOUT_S) as toxiproxy:
            # Each call fails with ToxiproxyError (timed out) on a wedged API.
            toxiproxy.add_toxic("stalled", Toxic("latency", {"latency": 5, "jitter": 0},
                                                 "downstream"))
            toxiproxy.add_toxic("stalled", Toxic("bandwidth", {"rate": 100_000}, "downstream"))
            toxiproxy.update_toxic("stalled", "latency_downstream", {"latency": 1, "jitter": 0})
            toxiproxy.remove_toxic("stalled", "latency_downstream")
            toxiproxy.reset()
            assert toxiproxy.toxics("stalled") == []
            assert "stalled" in toxiproxy.proxies()  # the whole API still answers
        # The reader reads again: every byte written before the changes arrives,
        # in order, none lost in a toxic that was taken off while it held it.
        assert read_exactly(reader, before) == pattern(0, before)
    finally:
        reader.close()
