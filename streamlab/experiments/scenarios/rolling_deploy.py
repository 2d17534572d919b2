"""rolling-deploy: restart every gateway, one at a time, under live resumable streams.

A private lab (replica_lab.py) of 3 gateways behind nginx and one engine;
200 clients (`Timing.load_scale` of them: the suite runs 30), each with one
live stream at a time (the next one when it ends), each read by an
EventSource-like reader (resuming_readers.py) through the edge. Then each
gateway in turn is drained (SIGTERM: new streams 503, live ones run on for
the drain grace), stopped, started, and the chain waited for.

    broken  STREAMLAB_GATEWAY_RESUME_STORE=memory: each gateway holds its own
            streams' logs. A reader that reconnects lands (nginx least_conn)
            on a gateway that never heard of its stream: 404, the stream is
            lost; a drained owner ends its own with `cancelled`.
    fixed   the shared log in Redis, the drain's hand-off (the owner releases
            its streams with `retry:`; the gateway a reader reconnects to
            re-attaches to the engine's generation): every reader ends with the
            whole text, each token once.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

import httpx

from services.client.openai_stream import chat_body
from services.engine.backends.fake import token_text
from streamlab.experiments.report import JSON, Check, Figures
from streamlab.experiments.scenarios.model import Scenario, Setup, Variant
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.scenarios.replica_lab import private_lab, say
from streamlab.experiments.scenarios.resuming_readers import Reader, tally
from streamlab.experiments.timing import Timing
from streamlab.lab.local import Lab
from streamlab.lab.target import LabTarget

GATEWAYS = 3
STREAMS = 200
GAP_MS = 100
TOKENS = 40  # 4 s a stream: several streams per client across one deploy
DRAIN_GRACE_S = 0.5
RETRY_MS = 250  # the `retry:` of every stream and of the drain
# SIGTERM, then SIGKILL if the gateway has not exited after this long (a
# deploy's termination grace). A stop that reaches it was no graceful drain:
# `stops_past_grace` counts them.
STOP_GRACE_S = 15.0

GATEWAY_ENV = {
    "STREAMLAB_GATEWAY_DRAIN_GRACE_S": str(DRAIN_GRACE_S),
    "STREAMLAB_GATEWAY_DRAIN_RETRY_MS": str(RETRY_MS),
    "STREAMLAB_GATEWAY_RESUME_RETRY_MS": str(RETRY_MS),
    "STREAMLAB_GATEWAY_HEARTBEAT_S": "1",
    # One client (this process) opens every stream.
    "STREAMLAB_GATEWAY_MAX_STREAMS": "4096",
    "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": "4096",
    "STREAMLAB_GATEWAY_RESUME_MAX_STREAMS": "4096",
}
ENGINE_ENV = {
    "STREAMLAB_ENGINE_MAX_RUNNING_GENERATIONS": "1024",
    "STREAMLAB_ENGINE_MAX_QUEUED_GENERATIONS": "1024",
}


def client_count(timing: Timing, full: int = STREAMS) -> int:
    return max(4, math.ceil(full * timing.load_scale))


def request_body() -> dict[str, JSON]:
    body: dict[str, JSON] = chat_body("rolling deploy", prefill_ms=100, token_gap_ms=GAP_MS,
                     answer_tokens=TOKENS, max_tokens=TOKENS)
    body["resume"] = {"retry_ms": RETRY_MS}
    return body


@dataclass
class Clients:
    """`count` clients, each with one live stream at a time: when its stream
    ends it starts the next, until the deploy is over. So every restart
    happens under `count` live streams however long a restart takes (a
    gateway starts in 2 s on an idle machine, 10 s on a loaded one)."""

    lab: Lab
    count: int
    readers: list[Reader] = field(default_factory=list)
    creates_refused: int = 0
    deploy_over: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        body = request_body()
        async with httpx.AsyncClient(timeout=httpx.Timeout(15.0)) as http:
            await asyncio.gather(*(self._client(http, body, i) for i in range(self.count)))

    async def _client(self, http: httpx.AsyncClient, body: dict[str, JSON], i: int) -> None:
        await asyncio.sleep(i * 0.02)  # a ramp, not one burst of connects
        while not self.deploy_over.is_set():
            path = await self._create(http, body)
            if path is None:
                continue
            reader = Reader(self.lab.ports.host, self.lab.ports.edge_port, path,
                            retry_ms=RETRY_MS)
            self.readers.append(reader)
            await reader.run()
            if reader.terminal != "done":  # lost: the user asks again, not at once
                await asyncio.sleep(1.0)

    async def _create(self, http: httpx.AsyncClient, body: dict[str, JSON]) -> str | None:
        try:
            response = await http.post(f"{self.lab.edge_url}/v1/streams", json=body)
        except httpx.HTTPError:
            response = None
        if response is None or response.status_code != 201:
            # A draining gateway refuses new streams (503): a client retries.
            self.creates_refused += 1
            await asyncio.sleep(RETRY_MS / 1000)
            return None
        return str(response.json()["events_url"])

    def all_streaming(self) -> bool:
        return len(self.readers) >= self.count and all(
            r.tokens or r.terminal is not None or r.error is not None for r in self.readers)

    def live(self) -> int:
        return sum(r.terminal is None and r.error is None for r in self.readers)


async def rolling_deploy(target: LabTarget, setup: Setup, timing: Timing) -> Figures:
    store = str(setup.knobs["store"])
    async with private_lab(target, "rolling-deploy", gateways=GATEWAYS, store=store,
                           gateway_env=GATEWAY_ENV, engine_env=ENGINE_ENV) as lab:
        clients = Clients(lab, client_count(timing))
        running = asyncio.create_task(clients.run())
        try:
            # Every client's first stream streaming before the deploy starts.
            deadline = time.monotonic() + 30
            while not clients.all_streaming() and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            lost_before = sum(r.terminal not in (None, "done") or r.error is not None
                              for r in clients.readers)
            live_at, restart_s, past_grace = [], [], 0
            for name in lab.gateway_names:
                live_at.append(clients.live())
                began = time.monotonic()
                say("rolling-deploy", f"draining and stopping {name} "
                    f"({live_at[-1]} streams live)")
                await asyncio.to_thread(lab.stop_service, name, STOP_GRACE_S)
                stopped = time.monotonic()
                past_grace += stopped - began >= STOP_GRACE_S
                await asyncio.to_thread(lab.start_service, name)
                restart_s.append(f"{stopped - began:.1f}+{time.monotonic() - stopped:.1f}")
            clients.deploy_over.set()
            async with asyncio.timeout(TOKENS * GAP_MS / 1000 + 30):
                await running
        finally:
            clients.deploy_over.set()
            running.cancel()
    reference = "".join(token_text(i) for i in range(TOKENS))
    return {
        **tally(clients.readers, reference, TOKENS),
        "clients": clients.count,
        "tokens_per_stream": TOKENS,
        "creates_refused": clients.creates_refused,
        "gateways_restarted": len(restart_s),
        "stops_past_grace": past_grace,
        "streams_lost_before_deploy": lost_before,
        "live_at_each_restart": " / ".join(map(str, live_at)),
        "live_at_last_restart": live_at[-1] if live_at else 0,
        "restart_s": " / ".join(restart_s),  # stop (drain included) + start
    }


RESTARTED = Check("gateways_restarted", "==", GATEWAYS,
                  "every gateway was drained, stopped, started")
UNDER_LOAD = (
    RESTARTED,
    Check("live_at_last_restart", ">=", 1, "streams were live when the last gateway restarted"),
)
ROLLING_DEPLOY = Scenario(
    name="rolling-deploy",
    summary=f"restart {GATEWAYS} gateways one at a time (drain, stop, start) under "
            f"{STREAMS} live resumable streams: does every client end with its whole text?",
    measure=rolling_deploy,
    broken=Variant(
        Setup(knobs={"store": "memory"}),
        # Not UNDER_LOAD: with each gateway's own log a reader's first GET may
        # already land elsewhere (least_conn's ties go round-robin, so at low
        # load the GET after a POST goes to the next gateway every time), and
        # then no stream is live at any restart: lost before the deploy.
        (RESTARTED,
         Check("streams_lost", ">", 0, "clients lost their streams"),
         Check("resume_404s", ">", 0, "a reconnect to another gateway: 404, unknown stream")),
        "STREAMLAB_GATEWAY_RESUME_STORE=memory: each gateway its own logs"),
    fixed=Variant(
        Setup(knobs={"store": "redis"}),
        (*UNDER_LOAD,
         Check("streams_lost", "==", 0, "every client ends with the whole text and done"),
         Check("tokens_lost", "==", 0, "no token lost"),
         Check("tokens_duplicated", "==", 0, "no token twice"),
         Check("readers_reconnected", ">=", 1, "readers really were moved between gateways")),
        "the shared log in Redis, the drain hands streams off with retry:, another "
        "gateway re-attaches"),
    shown=("clients", "streams", "tokens_per_stream", "creates_refused", "streams_whole",
           "streams_lost",
           "streams_lost_before_deploy", "tokens_lost", "tokens_duplicated", "reconnects",
           "readers_reconnected", "resume_404s", "gap_events", "longest_stall_s",
           "median_longest_stall_s", "live_at_each_restart", "restart_s", "stops_past_grace",
           "cuts", "ends_other_than_done"),
)
register(ROLLING_DEPLOY)
