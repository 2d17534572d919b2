"""Chaos soak: many clients with different behaviours while toxics come and go
on every hop and the engine is killed and restarted. Bounded in streams and
time, loopback only; it stops by itself. soak_verdict.py holds the figures,
the checks and the broken things each check is shown failing on.

The clients (every one through the edge, each with its own request id):

    full     reads a streamed answer to [DONE] (20, 60 or 120 tokens)
    think    the same through nginx's /short-timeout/, with a think pause longer
             than its idle timeout: only the gateway's heartbeats keep it open
    resume   the resume surface, reconnecting with Last-Event-ID after each cut
    abandon  closes after 1-20 tokens of a 400-token answer
    stall    never reads a word of a long answer, and keeps its socket open until
             the chain cuts it (nginx's send timeout, once the hops in front of it
             are full: slow-reader-edge's Flood) or the bound passes
    poll     starts a polling job, takes a few tokens, and walks away

Every stream ends in exactly one known way: `complete` / `resumed_complete`
(the reference text exactly), `error_event` (an HTTP error or an SSE error
event), `connection_error` (cut: no [DONE]), `abandoned`, `stalled` or
`polled_away` (left on purpose), `hang` (a whole watchdog without a byte,
longer than any legitimate silence, or past the stream's own deadline), or
`corrupt` (a text that is neither the reference nor, when cut, a prefix of it).

Every client that leaves (on purpose, or because its stream was cut) has its
generation looked up in the engine's records (GetStats by request id) right
away: it must be cancelled within its bound of the leave (cut streams: ended
in any way), or it counts as leaked.

It runs against any LabTarget that has the `pids` capability (the gateway's
RSS is read by pid): a local-process lab. `streamlab soak` is its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import httpx
import psutil

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from services.client.resume_stream import ResumeError, create_stream, follow_stream
from services.client.silent import open_silent_reader
from streamlab.experiments.generation_end import state_name
from streamlab.experiments.load_clients import Flood, LogTail
from streamlab.experiments.report import JSON, Report
from streamlab.experiments.soak_verdict import (
    BROKEN,
    SELF_TEST,
    Fault,
    SoakRun,
    StreamRun,
    report,
    self_test_part,
    self_test_report,
)
from streamlab.lab.target import Capability, LabTarget, pids_of, require
from streamlab.lab.toxiproxy import Toxic, ToxiproxyClient, ToxiproxyError
from streamlab_protocol.engine.v1 import engine_pb2 as pb

ANSWER_LENGTHS = (20, 60, 120)
GAP_MS = 15
# Each cycle of this many streams runs every behaviour at least once.
BEHAVIOURS = ("full", "full", "think", "resume", "abandon", "stall", "poll")
ABANDON_TOKENS = 400  # 6 s at 15 ms: the leave (≤ 20 tokens in) is far from the end
ABANDON_AFTER = (1, 20)
THINK_TOKENS = 20
THINK_AFTER_TOKEN = 2
POLL_TOKENS = 250  # 3.75 s: outlasts the job's TTL, a reaper interval and the bound
POLL_TTL_S = 1.0
POLL_LEAVE_AFTER = 3
# How long a generation may run on after its client closed: a cancel crosses
# the chain in tens of ms; this is for a loaded 2-core machine and the toxics.
CANCEL_BOUND_S = 2.0
# Added to the longest legitimate silence (the heartbeat interval) to make the
# clients' watchdog: covers a latency toxic, a 504 after the accept timeout.
WATCHDOG_SLACK_S = 5.0

# The hops the soak's clients cross (the HTTP/2 edge, if the lab has one, they do not).
CHAOS_HOPS = ("edge", "upstream", "engine")
# Toxics that come and go; each is sized to break streams, not to stop the soak.
# Destructive ones may cut a stream; the others only slow it down.
CHAOS_TOXICS: tuple[tuple[str, dict[str, int | float], bool], ...] = (
    ("latency", {"latency": 200, "jitter": 100}, False),
    ("bandwidth", {"rate": 16}, False),
    ("slicer", {"average_size": 16, "size_variation": 8, "delay": 1000}, False),
    ("reset_peer", {"timeout": 300}, True),
    ("limit_data", {"bytes": 4000}, True),
    ("timeout", {"timeout": 500}, True),
    ("slow_close", {"delay": 500}, False),
)


@dataclass(frozen=True)
class Bounds:
    """The soak's clocks, from the lab's own settings."""

    watchdog_s: float  # no byte for this long is a hang
    idle_timeout_s: float  # nginx /short-timeout/
    think_heartbeat_s: float
    cut_bound_s: float  # a cut stream's generation has ended within this
    resume_bound_s: float
    stall_bound_s: float  # from a stalled client's request to its cancel
    poll_bound_s: float

    @classmethod
    def of(cls, lab: LabTarget) -> Bounds:
        gateway = lab.options.gateway_settings()
        engine = lab.options.engine_settings()
        idle = lab.options.nginx.short_read_timeout_s
        think_heartbeat = idle / 4
        # Either end's keepalive finds a dead engine hop, whichever is slower.
        dead_after = max(gateway.engine_keepalive_s + gateway.engine_keepalive_timeout_s,
                         engine.keepalive_s + engine.keepalive_timeout_s)
        cut = dead_after + CANCEL_BOUND_S
        return cls(
            watchdog_s=max(gateway.heartbeat_s, think_heartbeat) + WATCHDOG_SLACK_S,
            idle_timeout_s=idle,
            think_heartbeat_s=think_heartbeat,
            cut_bound_s=cut,
            resume_bound_s=gateway.resume_grace_s + cut,
            stall_bound_s=Flood.for_lab(lab).cut_bound_s + CANCEL_BOUND_S,
            poll_bound_s=1.25 * POLL_TTL_S + CANCEL_BOUND_S,
        )


def gateway_rss(lab: LabTarget) -> int:
    """The gateway process's resident memory, read by pid (the `pids` capability)."""
    pid = pids_of(lab, "the soak reads the gateway's RSS")["gateway"]
    return int(psutil.Process(pid).memory_info().rss)


def soak_needs(engine_kills: int) -> frozenset[Capability]:
    """What a soak asks of the target: the gateway's RSS by pid, the engine's
    record (what is left running), hops to put toxics on and reset, and, to
    kill the engine mid-run, restarts."""
    needs = {Capability.PIDS, Capability.ENGINE_RECORD, Capability.TOGGLE_HOPS}
    return frozenset(needs | ({Capability.RESTART_SERVICE} if engine_kills else set()))


async def soak(lab: LabTarget, streams: int = 200, concurrency: int = 20,
               duration_s: float = 60.0, engine_kills: int = 2, seed: int = 7,
               toxics: bool = True, knobs: Mapping[str, JSON] | None = None,
               lab_fault: str = "", progress: Callable[[], None] | None = None,
               variant: str = "") -> Report:
    """`knobs` go into every request's `streamlab` options (a broken mode to
    show the verdict failing); `lab_fault` breaks the lab after the reference
    runs ("engine_disabled", "edge_black_hole"); `variant` names the broken
    thing in the report. MissingCapability, before anything runs, on a target
    without what the soak needs (soak_needs)."""
    require(lab, soak_needs(engine_kills), "the soak")
    rng = random.Random(seed)
    bounds = Bounds.of(lab)
    run = SoakRun(engine_kills_asked=engine_kills)
    knobs = dict(knobs or {})
    started = time.monotonic()
    timeout = httpx.Timeout(bounds.watchdog_s, connect=3.0)
    limits = httpx.Limits(max_connections=concurrency + 4)
    nginx_log = LogTail.of(lab, "nginx")
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        soaker = _Soaker(lab, http, bounds, rng, knobs)
        await soaker.fetch_references()
        run.gateway_rss_start_mb = gateway_rss(lab) / 2**20
        stop = asyncio.Event()
        # The engine dies at evenly spread points of the run (by streams finished).
        kill_after = [streams * (k + 1) // (engine_kills + 1) for k in range(engine_kills)]
        with _toxiproxy(lab) as toxiproxy:
            _break_lab(toxiproxy, lab_fault)
            chaos = asyncio.create_task(_chaos(lab, soaker, rng, stop, run, kill_after, toxics))
            limit = asyncio.Semaphore(concurrency)
            deadline = started + duration_s
            behaviours = _schedule(rng, streams)

            async def one(i: int) -> None:
                async with limit:
                    if time.monotonic() > deadline:
                        run.not_started += 1
                        return
                    stream = StreamRun(i, behaviours[i], started_at=time.monotonic())
                    run.streams.append(stream)
                    await soaker.stream(stream)
                    stream.ended_at = time.monotonic()
                    if progress is not None:
                        progress()
                # Outside the limit: judging waits up to the leave's bound.
                await soaker.judge_generation(stream)

            try:
                await asyncio.gather(*(one(i) for i in range(streams)))
            finally:
                stop.set()
                await chaos
                await _reset(toxiproxy)
    run.engine_left_running = await _settled(lambda: lab.engine_stats().generations_active,
                                             bounds.cut_bound_s)
    run.gateway_rss_end_mb = await _rss_settled(lab, run.gateway_rss_start_mb)
    run.nginx_idle_cuts = nginx_log.count("upstream timed out") if nginx_log else None
    run.duration_s = time.monotonic() - started
    return report(run, knobs, lab_fault, variant)


def _schedule(rng: random.Random, streams: int) -> list[str]:
    """Behaviours in shuffled cycles, so a short run still has each one."""
    order: list[str] = []
    while len(order) < streams:
        cycle = list(BEHAVIOURS)
        rng.shuffle(cycle)
        order += cycle
    return order[:streams]


def _break_lab(toxiproxy: ToxiproxyClient, lab_fault: str) -> None:
    if lab_fault == "engine_disabled":
        toxiproxy.set_enabled("engine", False)
    elif lab_fault == "edge_black_hole":
        toxiproxy.add_toxic("edge", Toxic("timeout", {"timeout": 0}, name="soak_black_hole"))
    elif lab_fault:
        raise ValueError(f"unknown lab fault {lab_fault!r}: engine_disabled, edge_black_hole")


class _Soaker:
    """The clients: one method per behaviour, each setting its StreamRun's outcome."""

    def __init__(self, lab: LabTarget, http: httpx.AsyncClient, bounds: Bounds,
                 rng: random.Random, knobs: Mapping[str, JSON]) -> None:
        self.lab, self.http, self.bounds, self.rng = lab, http, bounds, rng
        self.knobs = knobs
        self.references: dict[int, str] = {}
        self._jobs: dict[int, str] = {}  # stream index -> its job, deleted once judged
        # Toxiproxy (v2.12) cannot add or remove a toxic on a link whose writes
        # are held up by a reader that stopped: the link's last toxic never takes
        # the interrupt, and the API wedges for good. So stalled readers and
        # response-direction toxics on the HTTP hops never overlap.
        self.stalling = 0
        self.no_http_toxic = asyncio.Event()
        self.no_http_toxic.set()

    def body(self, answer: int, gap_ms: int = GAP_MS, **options: JSON) -> dict[str, JSON]:
        # The broken knobs win over the behaviour's own (e.g. heartbeat_s: 0).
        options = {"prefill_ms": 5, "token_gap_ms": gap_ms, "answer_tokens": answer,
                   **options, **self.knobs}
        return chat_body("soak", stream=True, max_tokens=answer, **options)

    async def fetch_references(self) -> None:
        """The reference text of every answer length, read as fast as the model goes
        (a lab still reconnecting to its engine gets a few seconds to serve)."""
        for answer in (*ANSWER_LENGTHS, THINK_TOKENS, ABANDON_TOKENS, POLL_TOKENS):
            if answer in self.references:
                continue
            body = chat_body("soak", prefill_ms=0, token_gap_ms=0, answer_tokens=answer,
                             max_tokens=answer)
            result = StreamResult()
            for _ in range(10):
                result = await stream_chat(
                    self.http, f"{self.lab.edge_url}/v1/chat/completions", body)
                if result.status not in (429, 502, 503):
                    break
                await asyncio.sleep(1.0)
            if not result.done:
                raise RuntimeError(f"the lab cannot stream before the soak: {result.error}")
            self.references[answer] = result.text

    async def stream(self, run: StreamRun) -> None:
        run.request_id = f"soak-{run.behaviour}-{uuid.uuid4().hex[:10]}"
        behaviour = getattr(self, f"_{run.behaviour}")
        expected_s = {"think": self.bounds.idle_timeout_s + 2, "stall": self.bounds.stall_bound_s,
                      "abandon": 1.0, "poll": 2.0}.get(run.behaviour, 2.0)
        # A stream's own deadline: far past its end, retries and reconnects included.
        cap = 3 * expected_s + 3 * self.bounds.watchdog_s + 10
        try:
            await asyncio.wait_for(behaviour(run), cap)
        except TimeoutError:
            run.outcome = "hang"
        if run.outcome in ("hang", "connection_error", "error_event") and run.left_at is None:
            run.left_at = time.monotonic()
            run.leave_bound_s = (self.bounds.resume_bound_s if run.behaviour == "resume"
                                 else self.bounds.cut_bound_s)

    # ---- the behaviours ------------------------------------------------------------
    async def _full(self, run: StreamRun) -> None:
        answer = self.rng.choice(ANSWER_LENGTHS)
        result = await self._chat(run, "/v1/chat/completions", self.body(answer))
        self._classify(run, result, self.references[answer])

    async def _think(self, run: StreamRun) -> None:
        pause_ms = int((self.bounds.idle_timeout_s + 1.0) * 1000)
        body = self.body(THINK_TOKENS, pauses=[{"after_token": THINK_AFTER_TOKEN,
                                                "pause_ms": pause_ms}],
                         heartbeat_s=self.bounds.think_heartbeat_s)
        result = await self._chat(run, "/short-timeout/v1/chat/completions", body)
        self._classify(run, result, self.references[THINK_TOKENS])

    async def _abandon(self, run: StreamRun) -> None:
        leave = self.rng.randint(*ABANDON_AFTER)
        result = await self._chat(run, "/v1/chat/completions", self.body(ABANDON_TOKENS),
                                  stop_after_tokens=leave)
        self._classify(run, result, self.references[ABANDON_TOKENS])
        if result.closed_early and run.outcome != "corrupt":
            run.outcome = "abandoned"
            run.left_at, run.leave_bound_s = result.left_at, CANCEL_BOUND_S

    async def _stall(self, run: StreamRun) -> None:
        """Never reads; holds the socket until the gateway gives up on it (its
        send timeout cancels the generation) or the bound passes."""
        flood = Flood.for_lab(self.lab)
        body = self.body(flood.tokens, gap_ms=flood.gap_ms)
        await self.no_http_toxic.wait()
        self.stalling += 1
        try:
            await self._stall_on(run, body)
        finally:
            self.stalling -= 1

    async def _stall_on(self, run: StreamRun, body: dict[str, JSON]) -> None:
        run.left_at, run.leave_bound_s = time.monotonic(), self.bounds.stall_bound_s
        sock = await asyncio.to_thread(open_silent_reader, self.lab.ports.host,
                                       self.lab.ports.edge_port, "/v1/chat/completions", body,
                                       {"X-Request-Id": run.request_id})
        try:
            run.outcome = "stalled"
            if await self._refused(run, sock):
                run.outcome, run.engine_state = "error_event", "unseen"
            else:
                await self.judge_generation(run)
        finally:
            sock.close()

    async def _refused(self, run: StreamRun, sock: socket.socket) -> bool:
        """Whether the gateway refused the stalled request (a status line that is
        not 200, peeked at, not read) before the engine took it."""
        for _ in range(50):
            with contextlib.suppress(Exception):
                if (await asyncio.to_thread(self.lab.engine_stats, run.request_id)).generations:
                    return False
            with contextlib.suppress(OSError):
                head = sock.recv(12, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                if head.startswith(b"HTTP/") and head[9:12] != b"200":
                    return True
            await asyncio.sleep(0.1)
        return False

    async def _poll(self, run: StreamRun) -> None:
        jobs = f"{self.lab.edge_url}/v1/jobs"
        body = self.body(POLL_TOKENS, job_ttl_s=POLL_TTL_S)
        try:
            started = await self._retrying(lambda: self.http.post(
                jobs, json=body, headers={"X-Request-Id": run.request_id}))
            if started.status_code != 201:
                run.outcome = "error_event"
                return
            job_id, texts = started.json()["id"], list[str]()
            while len(texts) < POLL_LEAVE_AFTER:
                polled = await self.http.get(f"{jobs}/{job_id}",
                                             params={"since": len(texts), "wait_s": 1.0})
                answer = polled.json() if polled.status_code == 200 else {}
                texts += answer.get("tokens", [])
                if polled.status_code != 200 or answer.get("error") or answer.get("done"):
                    run.outcome = "error_event"
                    break
        except httpx.TimeoutException:
            run.outcome = "hang"
            return
        except httpx.TransportError:
            run.outcome = "connection_error"
            return
        if not self.references[POLL_TOKENS].startswith("".join(texts)):
            run.outcome = "corrupt"
        elif not run.outcome:
            run.outcome = "polled_away"
            run.left_at, run.leave_bound_s = time.monotonic(), self.bounds.poll_bound_s
        # Walked away; the harness mops up after the judge has seen the job run.
        self._jobs[run.index] = f"{jobs}/{job_id}"

    async def _resume(self, run: StreamRun) -> None:
        """The resume surface, as an EventSource would use it: reconnect with
        Last-Event-ID after every cut until a terminal event."""
        answer = self.rng.choice(ANSWER_LENGTHS)
        reference = self.references[answer]
        created = None
        for _ in range(4):
            try:
                created = await create_stream(self.http, self.lab.edge_url, self.body(answer))
                break
            except ResumeError as exc:
                if exc.status not in (429, 502, 503):
                    run.outcome = "error_event"
                    return
                await asyncio.sleep(1.0)
            except httpx.TimeoutException:
                run.outcome = "hang"
                return
            except httpx.TransportError:
                run.outcome = "connection_error"
                return
        if created is None:
            run.outcome = "error_event"
            return
        run.request_id = created["id"]  # the stream's id is the engine's request id
        result = await follow_stream(self.http, self.lab.edge_url, created, max_connections=20,
                                     default_retry_ms=200)
        whole = result.indexes == list(range(len(result.tokens))) and not result.gaps
        if not whole or not reference.startswith(result.text):
            run.outcome = "corrupt"
        elif any(conn.ended == "timeout" for conn in result.connections):
            run.outcome = "hang"  # a whole watchdog without a byte, then a reconnect
        elif result.terminal == "done":
            if result.text != reference:
                run.outcome = "corrupt"
            else:
                run.outcome = "resumed_complete" if len(result.connections) > 1 else "complete"
        elif result.terminal in ("error", "cancelled") or result.error is not None:
            run.outcome = "error_event"
        else:
            run.outcome = "connection_error"

    # ---- helpers -------------------------------------------------------------------
    async def _chat(self, run: StreamRun, path: str, body: dict[str, JSON],
                    stop_after_tokens: int | None = None) -> StreamResult:
        result = StreamResult()
        for attempt in range(4):
            rid = run.request_id if attempt == 0 else f"{run.request_id}-{attempt}"
            result = await stream_chat(self.http, f"{self.lab.edge_url}{path}", body,
                                       headers={"X-Request-Id": rid},
                                       stop_after_tokens=stop_after_tokens)
            run.request_id = rid
            # A polite client: refused before the first byte with a Retry-After
            # (engine restarting, load shed), it waits and tries again.
            if result.status not in (429, 502, 503):
                break
            await asyncio.sleep(min(2.0, float(result.retry_after_s or 1)))
        return result

    async def _retrying(self, post: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        response = await post()
        for _ in range(3):
            if response.status_code not in (429, 502, 503):
                break
            await asyncio.sleep(1.0)
            response = await post()
        return response

    def _classify(self, run: StreamRun, result: StreamResult, reference: str) -> None:
        if result.status not in (0, 200):
            run.engine_state = "unseen"  # refused before the engine took it: nothing to judge
        if not reference.startswith(result.text):
            run.outcome = "corrupt"  # lost, duplicated or garbled on the way
        elif result.done:
            run.outcome = "complete" if result.text == reference else "corrupt"
        elif (result.error or {}).get("code") == "timeout":
            run.outcome = "hang"
        elif result.closed_early:
            run.outcome = "abandoned"
        elif result.status != 200 or (result.error or {}).get("type"):
            run.outcome = "error_event"
        else:
            run.outcome = "connection_error"

    async def judge_generation(self, run: StreamRun) -> None:
        """Look the generation up at the engine until it is no longer running,
        or its bound from the leave has passed."""
        try:
            if run.left_at is not None and not run.engine_state:
                await self._judge(run, run.left_at)
        finally:
            job = self._jobs.pop(run.index, None)
            if job is not None:  # the harness mops up its own leak
                with contextlib.suppress(httpx.HTTPError):
                    await self.http.delete(job)

    async def _judge(self, run: StreamRun, left_at: float) -> None:
        deadline = left_at + run.leave_bound_s
        record = None
        while True:
            with contextlib.suppress(Exception):  # the engine may be restarting
                found = (await asyncio.to_thread(self.lab.engine_stats,
                                                 run.request_id)).generations
                record = found[0] if found else None
            ended = record is not None and record.state != pb.GENERATION_STATE_RUNNING
            if ended or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        run.engine_state = state_name(record) if record is not None else "unseen"
        if record is not None and record.ended_at:
            run.engine_end_after_leave_s = round(record.ended_at - left_at, 3)


async def _chaos(lab: LabTarget, soaker: _Soaker, rng: random.Random, stop: asyncio.Event,
                 run: SoakRun, kill_after: list[int], toxics: bool) -> None:
    client = _toxiproxy(lab)
    try:
        await _sleep_or_stop(stop, rng.uniform(1.0, 3.0))  # a quiet start
        while not stop.is_set():
            finished = sum(1 for s in run.streams if s.outcome)
            if kill_after and finished >= kill_after[0]:
                kill_after.pop(0)
                killed = time.monotonic()
                await asyncio.to_thread(lab.kill_service, "engine")
                await _sleep_or_stop(stop, rng.uniform(0.2, 1.0))
                await asyncio.to_thread(lab.start_service, "engine")
                run.faults.append(Fault("engine_kill", killed, time.monotonic(), True))
                continue
            if not toxics:
                await _sleep_or_stop(stop, 0.1)
                continue
            hop = rng.choice(CHAOS_HOPS)
            kind, attributes, destructive = rng.choice(CHAOS_TOXICS)
            direction: Literal["upstream", "downstream"] = rng.choice(("upstream", "downstream"))
            held_up = hop != "engine" and direction == "downstream"
            if held_up and soaker.stalling:
                direction, held_up = "upstream", False  # see _Soaker.no_http_toxic
            name = f"soak_{kind}"
            on = time.monotonic()
            if held_up:
                soaker.no_http_toxic.clear()
            await asyncio.to_thread(client.add_toxic, hop, Toxic(
                kind, attributes, stream=direction, name=name,
                toxicity=rng.choice((0.5, 1.0))))
            await _sleep_or_stop(stop, rng.uniform(0.3, 1.2))
            # Toxiproxy flushes a toxic's queue before taking it off, which a slow
            # link can make outlast its API's timeout (503): the toxic then comes
            # off in the background, or at the final reset.
            with contextlib.suppress(ToxiproxyError):
                await asyncio.to_thread(client.remove_toxic, hop, name)
            soaker.no_http_toxic.set()
            run.faults.append(Fault(f"{hop}:{kind}", on, time.monotonic(), destructive))
            # Quiet spells longer than the noisy ones, so that streams no fault
            # touched are common enough to judge completion by.
            await _sleep_or_stop(stop, rng.uniform(1.0, 3.0))
    finally:
        await _reset(client)
        client.close()


async def _reset(client: ToxiproxyClient) -> None:
    """Every toxic off, every hop on; retried while a flush behind a stalled
    reader still holds Toxiproxy up (the soak's readers have all closed by now)."""
    for attempt in range(10):
        try:
            await asyncio.to_thread(client.reset)
            return
        except ToxiproxyError:
            if attempt == 9:
                raise
            await asyncio.sleep(1.0)


def _toxiproxy(lab: LabTarget) -> ToxiproxyClient:
    """Toxiproxy's API with a long timeout: taking a toxic off a hop whose link is
    held up by a stalled reader waits for the toxic's last write (up to 5 s).
    Every hop by name: the lab's client routes each to its Toxiproxy process."""
    return lab.toxiproxy(timeout_s=30.0)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _settled(probe: Callable[[], int], timeout_s: float) -> int:
    """Poll until the engine has no generation running, or the deadline."""
    end = time.monotonic() + timeout_s
    while True:
        active = await asyncio.to_thread(probe)
        if active == 0 or time.monotonic() > end:
            return active
        await asyncio.sleep(0.1)


async def _rss_settled(lab: LabTarget, start_mb: float | None) -> float:
    end = time.monotonic() + 10.0
    while True:
        rss = gateway_rss(lab) / 2**20
        if start_mb is None or rss <= 1.2 * start_mb or time.monotonic() > end:
            return rss
        await asyncio.sleep(0.2)


async def soak_broken(lab: LabTarget, name: str, streams: int = 200, concurrency: int = 20,
                      duration_s: float = 60.0, seed: int = 7, toxics: bool = True,
                      progress: Callable[[], None] | None = None) -> Report:
    """The soak against one of soak_verdict.SELF_TEST's broken things (its verdict
    is to fail: the soak's checks judged as they are)."""
    thing = BROKEN[name]
    return await soak(lab, streams, concurrency, duration_s, thing.engine_kills, seed, toxics,
                      thing.knobs, thing.lab_fault, progress, variant=name)


async def self_test(lab: LabTarget, streams: int = 200, concurrency: int = 20,
                    duration_s: float = 60.0, engine_kills: int = 2, seed: int = 7,
                    toxics: bool = True) -> Report:
    """Every broken thing alone, without toxics (its failure must be its own),
    each judged by self_test_part; then the lab as it is, which must pass."""
    parts = [self_test_part(thing, await soak_broken(
        lab, thing.name, streams, concurrency, duration_s, seed, toxics=False))
        for thing in SELF_TEST]
    parts.append(await soak(lab, streams, concurrency, duration_s, engine_kills, seed, toxics))
    return self_test_report(parts)


async def soak_as_asked(lab: LabTarget, broken: str | None = None, all_broken: bool = False,
                        streams: int = 200, concurrency: int = 20, duration_s: float = 60.0,
                        engine_kills: int = 2, seed: int = 7, toxics: bool = True,
                        progress: Callable[[], None] | None = None) -> Report:
    """`streamlab soak`: the self-test (`all_broken`), the soak against one
    `broken` thing, or the soak against the lab as it is. MissingCapability
    before the first run when the target lacks what any of them needs."""
    kills = engine_kills
    if all_broken:
        kills = max([engine_kills, *(thing.engine_kills for thing in SELF_TEST)])
    elif broken is not None:
        kills = BROKEN[broken].engine_kills
    require(lab, soak_needs(kills), "the soak")
    if all_broken:
        return await self_test(lab, streams, concurrency, duration_s, engine_kills, seed, toxics)
    if broken is not None:
        return await soak_broken(lab, broken, streams, concurrency, duration_s, seed, toxics,
                                 progress)
    return await soak(lab, streams, concurrency, duration_s, engine_kills, seed, toxics,
                      progress=progress)
