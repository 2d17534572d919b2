"""Redis SIGKILLed mid-stream and started again on the same dir, with the
lab's persistence (streamlab/lab/endpoints.py REDIS_PERSISTENCE: the
append-only file) and without it (the broken mode): real redis-server,
gateways "a" and "b", one real engine (tests/integration/redis_fixtures.py).

A client reads the first tokens on a (the owner), then resumes on b, which
reads the shared log: with the AOF the log survived and the resume has no
gap; without it the log restarted empty, and the resume gets a `gap` of every
event written before the restart.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from services.engine.backends.fake import token_text
from streamlab.lab import processes
from streamlab.lab.endpoints import REDIS_NO_PERSISTENCE, REDIS_PERSISTENCE
from streamlab.lab.processes import ServiceSpec, free_ports
from streamlab_protocol.sse import Event, SSEDecoder
from tests.integration.redis_fixtures import REDIS_SERVER, StartReplicas, create_stream, redis_pings
from tests.wait import wait_until

pytestmark = pytest.mark.integration

TOKENS, GAP_MS = 150, 20  # 3 s: the restart lands mid-stream
READ_FIRST = 10
IN_LOG_BEFORE_KILL = 40  # events in the shared log when Redis dies
ENV = {"STREAMLAB_GATEWAY_REDIS_TIMEOUT_S": "1", "STREAMLAB_GATEWAY_RESUME_GRACE_S": "30"}
BODY = {"messages": [{"role": "user", "content": "survive a restart"}],
        "streamlab": {"prefill_ms": 10, "token_gap_ms": GAP_MS, "answer_tokens": TOKENS},
        "resume": {"retry_ms": 50}}


@dataclass
class Store:
    spec: ServiceSpec
    log_dir: Path
    port: int
    running: processes.Running | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.running = processes.start(self.spec, self.log_dir)
        processes.wait_ready(self.running)

    def kill(self) -> None:
        assert self.running is not None
        processes.stop(self.running, grace_s=0)  # SIGKILL: no shutdown save
        self.running = None


@contextlib.contextmanager
def started_store(tmp_path: Path, persistence: Sequence[str]) -> Iterator[Store]:
    """A Redis server of the test's own with these persistence flags, stopped
    after the block (unless the test killed it and left it down)."""
    if not REDIS_SERVER.exists():
        pytest.skip(f"{REDIS_SERVER} is not installed (Debian: apt-get install redis-server)")
    port = free_ports(1)[0]
    data = tmp_path / "redis"
    data.mkdir()
    spec = ServiceSpec("redis", [str(REDIS_SERVER), "--port", str(port), "--bind", "127.0.0.1",
                                 *persistence, "--dir", str(data)],
                       ready=lambda: redis_pings(port), ready_timeout_s=10.0)
    server = Store(spec, tmp_path / "redis-logs", port)
    server.start()
    try:
        yield server
    finally:
        if server.running is not None:
            processes.stop(server.running, grace_s=5.0)


@pytest.fixture(params=[True, False], ids=["aof", "broken-no-persistence"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with started_store(tmp_path, REDIS_PERSISTENCE if request.param
                       else REDIS_NO_PERSISTENCE) as server:
        yield server


def read(http: httpx.Client, url: str, last_event_id: str | None = None,
         stop_after: int | None = None) -> list[Event]:
    """One GET of the events: up to the terminal event (or `stop_after` tokens)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    events: list[Event] = []
    decoder = SSEDecoder()
    deadline = time.monotonic() + 20.0
    with http.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_bytes():
            assert time.monotonic() < deadline, f"no end after 20 s: {events[-3:]}"
            for item in decoder.feed(chunk):
                if not isinstance(item, Event):
                    continue
                events.append(item)
                tokens = sum(e.event == "token" for e in events)
                if item.event in ("done", "error", "cancelled") or tokens == stop_after:
                    return events
    return events


def test_a_resume_after_redis_restarts_mid_stream(
        store: Store, start_replicas: StartReplicas, request: pytest.FixtureRequest) -> None:
    aof = "aof" in request.node.callspec.id
    replicas = start_replicas(store.url, **ENV)
    a, b = replicas.gateways["a"], replicas.gateways["b"]
    with httpx.Client(timeout=httpx.Timeout(10.0, connect=5.0)) as http:
        stream_id = create_stream(http, a, BODY)
        events_url = f"/v1/streams/{stream_id}/events"
        first = read(http, a + events_url, stop_after=READ_FIRST)
        # The owner's log writer has put this much in Redis when it dies.
        wait_until(lambda: http.get(f"{b}/v1/streams/{stream_id}").json().get("last_seq", 0)
                   >= IN_LOG_BEFORE_KILL, timeout_s=10.0, interval_s=0.02,
                   what=f"{IN_LOG_BEFORE_KILL} events in the shared log")
        store.kill()
        store.start()
        # b finds the stream again once the owner's writer has reconnected (at
        # once with the AOF; without it, at the owner's next write).
        wait_until(lambda: http.get(f"{b}/v1/streams/{stream_id}").status_code == 200,
                   timeout_s=10.0, interval_s=0.05, what="the stream known to b again")
        rest = read(http, b + events_url, last_event_id=first[-1].id)
    gaps = [json.loads(e.data)["missed_events"] for e in rest if e.event == "gap"]
    text = "".join(json.loads(e.data)["text"] for e in [*first, *rest] if e.event == "token")
    print(f"\n{'AOF' if aof else 'no persistence'}: a resume after the restart got "
          f"gaps {gaps}")
    assert rest[-1].event == "done"
    if aof:
        assert gaps == [], "the log survived the restart"
        assert text == "".join(token_text(i) for i in range(TOKENS))
    else:
        assert len(gaps) == 1, gaps
        assert gaps[0] >= IN_LOG_BEFORE_KILL - READ_FIRST, "everything before the restart"
