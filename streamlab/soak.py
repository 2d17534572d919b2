"""Chaos soak: many streams with random client behaviour while toxics come and
go on every hop and the engine is killed and restarted. Bounded in streams
and time, loopback only; it stops by itself.

Every stream must end in exactly one known way: `complete` or
`resumed_complete` (its text equals a reference run: nothing lost, nothing
duplicated; the latter reconnected with Last-Event-ID on the way), `error_event` (an HTTP error
or an SSE error event), `connection_error` (the connection itself was cut: no
`[DONE]`, so never mistaken for success), or `abandoned` (the client left on
purpose). `hang` (past its deadline) and `corrupt` (a `[DONE]` stream whose
text differs) are failures, as is any generation still running at the engine
afterwards, or a gateway that does not give its memory back (RSS > 1.2x).

It runs against any LabTarget that has the `pids` capability (the gateway's
RSS is read by pid): a local-process lab. `streamlab soak` is its command.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import psutil

from services.client.openai_stream import chat_body, stream_chat
from services.client.resume_stream import ResumeError, create_stream, follow_stream
from services.client.silent import open_silent_reader
from streamlab.target import LabTarget, pids_of
from streamlab.topology import HOP_NAMES
from streamlab.toxiproxy import Toxic

ANSWER_LENGTHS = (20, 60, 120)
GAP_MS = 15
BEHAVIOURS = ("full", "full", "abandon", "stall", "resume", "resume")

# Toxics that come and go; each is sized to break streams, not to stop the soak.
CHAOS_TOXICS: tuple[tuple[str, dict[str, int | float]], ...] = (
    ("latency", {"latency": 200, "jitter": 100}),
    ("bandwidth", {"rate": 16}),
    ("slicer", {"average_size": 16, "size_variation": 8, "delay": 1000}),
    ("reset_peer", {"timeout": 300}),
    ("limit_data", {"bytes": 4000}),
    ("timeout", {"timeout": 500}),
    ("slow_close", {"delay": 500}),
)


@dataclass
class SoakReport:
    outcomes: Counter[str] = field(default_factory=Counter)
    toxics_applied: int = 0
    engine_restarts: int = 0
    engine_left_running: int = -1
    gateway_rss_start_mb: float = 0.0
    gateway_rss_end_mb: float = 0.0
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return (self.outcomes["hang"] == 0 and self.outcomes["corrupt"] == 0
                and self.engine_left_running == 0
                and self.gateway_rss_end_mb <= 1.2 * self.gateway_rss_start_mb)


def gateway_rss(lab: LabTarget) -> int:
    """The gateway process's resident memory, read by pid (the `pids` capability)."""
    pid = pids_of(lab, "the soak reads the gateway's RSS")["gateway"]
    return int(psutil.Process(pid).memory_info().rss)


def _chat_url(lab: LabTarget) -> str:
    return f"{lab.edge_url}/v1/chat/completions"


async def soak(lab: LabTarget, streams: int = 200, concurrency: int = 20,
               duration_s: float = 60.0, engine_kills: int = 2, seed: int = 7,
               progress: Callable[[], None] | None = None) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport()
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=3.0)) as http:
        references = {n: await _reference(http, _chat_url(lab), n) for n in ANSWER_LENGTHS}
        report.gateway_rss_start_mb = gateway_rss(lab) / 2**20
        stop = asyncio.Event()
        # The engine dies at evenly spread points of the run (by streams finished).
        kill_after = [streams * (k + 1) // (engine_kills + 1) for k in range(engine_kills)]
        chaos = asyncio.create_task(_chaos(lab, rng, stop, report, kill_after))
        limit = asyncio.Semaphore(concurrency)
        deadline = started + duration_s

        async def one(i: int) -> None:
            async with limit:
                if time.monotonic() > deadline:
                    report.outcomes["not_started"] += 1
                    return
                behaviour = rng.choice(BEHAVIOURS)
                answer = rng.choice(ANSWER_LENGTHS)
                try:
                    outcome = await asyncio.wait_for(
                        _stream(http, lab, behaviour, answer, references[answer], rng), 30.0)
                except TimeoutError:
                    outcome = "hang"
                report.outcomes[outcome] += 1
                if progress is not None:
                    progress()

        try:
            await asyncio.gather(*(one(i) for i in range(streams)))
        finally:
            stop.set()
            await chaos
    report.engine_left_running = await _settled(lambda: lab.engine_stats().generations_active, 15.0)
    report.gateway_rss_end_mb = await _rss_settled(lab, report.gateway_rss_start_mb)
    report.duration_s = time.monotonic() - started
    return report


async def _reference(http: httpx.AsyncClient, url: str, answer: int) -> str:
    result = await stream_chat(http, url, chat_body("soak", prefill_ms=5, token_gap_ms=GAP_MS,
                                                    answer_tokens=answer))
    if not result.done:
        raise RuntimeError(f"the lab cannot stream before the soak: {result.error}")
    return result.text


async def _stream(http: httpx.AsyncClient, lab: LabTarget, behaviour: str, answer: int,
                  reference: str, rng: random.Random) -> str:
    body = chat_body("soak", prefill_ms=5, token_gap_ms=GAP_MS, answer_tokens=answer)
    rid = f"soak-{uuid.uuid4().hex[:10]}"
    if behaviour == "resume":
        return await _resume(http, lab, body, reference)
    if behaviour == "stall":
        # Never reads; leaves after a while (a tab in the background, then closed).
        sock = await asyncio.to_thread(open_silent_reader, lab.ports.host, lab.ports.edge_port,
                                       "/v1/chat/completions", body, {"X-Request-Id": rid})
        try:
            await asyncio.sleep(rng.uniform(0.2, 2.0))
        finally:
            sock.close()
        return "abandoned"
    stop_after = rng.randint(1, answer - 1) if behaviour == "abandon" else None
    for attempt in range(4):
        result = await stream_chat(http, _chat_url(lab), body,
                                   headers={"X-Request-Id": f"{rid}-{attempt}"},
                                   stop_after_tokens=stop_after)
        # A polite client: refused before the first byte with a Retry-After
        # (engine restarting, load shed), it waits and tries again.
        if result.status not in (429, 502, 503):
            break
        await asyncio.sleep(min(2.0, float(result.retry_after_s or 1)))
    if result.closed_early:
        return "abandoned"
    if result.done:
        return "complete" if result.text == reference else "corrupt"
    if result.status != 200 or (result.error or {}).get("type"):
        return "error_event"
    return "connection_error"


async def _resume(http: httpx.AsyncClient, lab: LabTarget, body: dict[str, object],
                  reference: str) -> str:
    """The resume surface, as an EventSource would use it: reconnect with
    Last-Event-ID after every cut until a terminal event."""
    for _ in range(4):
        try:
            created = await create_stream(http, lab.edge_url, body)
            break
        except ResumeError as exc:
            if exc.status not in (429, 502, 503):
                return "error_event"
            await asyncio.sleep(1.0)
        except httpx.TransportError:
            return "connection_error"
    else:
        return "error_event"
    result = await follow_stream(http, lab.edge_url, created, max_connections=20,
                                 default_retry_ms=200)
    if result.terminal == "done":
        whole = result.text == reference and result.indexes == list(range(len(result.tokens)))
        if not whole or result.gaps:
            return "corrupt"
        return "resumed_complete" if len(result.connections) > 1 else "complete"
    if result.terminal in ("error", "cancelled") or result.error is not None:
        return "error_event"
    return "connection_error"


async def _chaos(lab: LabTarget, rng: random.Random, stop: asyncio.Event,
                 report: SoakReport, kill_after: list[int]) -> None:
    client = lab.toxiproxy()
    try:
        while not stop.is_set():
            if kill_after and report.outcomes.total() >= kill_after[0]:
                kill_after.pop(0)
                await asyncio.to_thread(lab.kill_service, "engine")
                await _sleep_or_stop(stop, rng.uniform(0.2, 1.0))
                await asyncio.to_thread(lab.start_service, "engine")
                report.engine_restarts += 1
                continue
            hop = rng.choice(HOP_NAMES)
            kind, attributes = rng.choice(CHAOS_TOXICS)
            name = f"soak_{kind}"
            await asyncio.to_thread(client.add_toxic, hop, Toxic(
                kind, attributes, stream=rng.choice(("upstream", "downstream")), name=name,
                toxicity=rng.choice((0.5, 1.0))))
            report.toxics_applied += 1
            await _sleep_or_stop(stop, rng.uniform(0.3, 1.5))
            await asyncio.to_thread(client.remove_toxic, hop, name)
            await _sleep_or_stop(stop, rng.uniform(0.05, 0.3))
    finally:
        await asyncio.to_thread(client.reset)
        client.close()


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


async def _rss_settled(lab: LabTarget, start_mb: float) -> float:
    end = time.monotonic() + 10.0
    while True:
        rss = gateway_rss(lab) / 2**20
        if rss <= 1.2 * start_mb or time.monotonic() > end:
            return rss
        await asyncio.sleep(0.2)


