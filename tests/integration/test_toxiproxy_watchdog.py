"""The lab's Toxiproxy watchdog (streamlab/lab/watchdog.py) on the real lab:
a Toxiproxy process that stops answering is found, restarted with its proxies
and the toxics it held, and the chain serves through it again; an API that
answers /version but hangs on /proxies (the wedge's signature) is told apart
from one that is down."""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from streamlab.lab.local import Lab
from streamlab.lab.processes import free_ports
from streamlab.lab.toxiproxy import Toxic
from streamlab.lab.watchdog import ToxiproxyWatchdog, probe

pytestmark = pytest.mark.integration

LATENCY = Toxic("latency", {"latency": 20, "jitter": 0}, "downstream")


@pytest.mark.local_only("stops a Toxiproxy process by its pid")
def test_a_toxiproxy_that_stops_answering_is_restarted_with_its_toxics(lab: Lab) -> None:
    watchdog = ToxiproxyWatchdog(lab)
    with lab.toxiproxy() as toxiproxy:
        toxiproxy.add_toxic("edge", LATENCY)
    assert watchdog.check() == []  # healthy: nothing to do, its toxics remembered

    pid = lab.pids["toxiproxy"]
    os.kill(pid, signal.SIGSTOP)  # a process that holds its port and answers nothing
    try:
        [restart] = watchdog.check()
    finally:
        if lab.pids.get("toxiproxy") == pid:  # not restarted: leave the lab running
            os.kill(pid, signal.SIGCONT)

    assert (restart.process, restart.health, restart.toxics_restored) == ("toxiproxy", "down", 1)
    assert lab.pids["toxiproxy"] != pid
    with lab.toxiproxy() as toxiproxy:
        assert [t["name"] for t in toxiproxy.toxics("edge")] == ["latency_downstream"]
    ready = httpx.get(f"{lab.edge_url}/readyz", timeout=10)
    assert ready.status_code == 200
    assert watchdog.check() == []


class _HangingProxies(http.server.BaseHTTPRequestHandler):
    """/version answers at once; /proxies never does, as a wedged Toxiproxy."""

    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/version":
            body = b'{"version": "v2.12.0"}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.release.wait(timeout=30)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hanging_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HangingProxies)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _HangingProxies.release.set()
    server.shutdown()
    server.server_close()


def test_an_api_that_answers_version_but_not_proxies_is_wedged(hanging_api: str) -> None:
    started = time.monotonic()
    assert probe(hanging_api, timeout_s=0.5).health == "wedged"
    assert time.monotonic() - started < 5  # the probe's own timeout, not the server's


def test_an_api_that_does_not_answer_at_all_is_down() -> None:
    [port] = free_ports(1)  # bound, then closed: nothing listens there
    assert probe(f"http://127.0.0.1:{port}", timeout_s=0.5).health == "down"
