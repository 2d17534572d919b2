"""`streamlab bench cancel`'s load: open many streams, leave each after a few
tokens, then ask the engine when it saw each cancel and what it wasted.

Cancel latency is `engine cancelled_at - client left_at`, both CLOCK_MONOTONIC
on one machine. Wasted tokens are the engine's `tokens_after_cancel` (decode
steps run after the cancel reached it) plus tokens generated after the client
left but before the cancel arrived (the relay's lag).

`--wire both` runs the same abandonment once per engine wire (the gateways
restarted on each, put back after): a cancelled gRPC call (RST_STREAM) against
an abort message on the multiplexed Session, side by side.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from services.client.openai_stream import chat_body, stream_chat
from services.gateway.settings import ENGINE_WIRES
from streamlab.experiments.bench.lab_settings import lab_settings
from streamlab.experiments.bench.load import LoadResult, run_load
from streamlab.experiments.generation_end import wait_for_end
from streamlab.experiments.report import Check, Figure, Figures, Report, Table, judge
from streamlab.lab.target import Capability, LabTarget, MissingCapability, require
from streamlab_protocol.engine.v1 import engine_pb2 as pb

BACKGROUND_GAP_MS = 1000  # --background streams: a token a second
WIRES: tuple[str, ...] = ENGINE_WIRES
WIRE_ENV = "STREAMLAB_GATEWAY_ENGINE_WIRE"


@dataclass
class AbandonReport:
    streams: int
    cancelled: int
    still_running: int
    latencies_ms: list[float] = field(default_factory=list)
    tokens_after_cancel: int = 0
    tokens_after_leaving: int = 0
    # With `background`: the streams that ran meanwhile.
    background: LoadResult | None = None

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    def figures(self) -> Figures:
        out: Figures = {
            "streams": self.streams, "cancelled": self.cancelled,
            "still_running": self.still_running,
            "cancel_latency_p50_ms": round(self.p50_ms, 1),
            "cancel_latency_p99_ms": round(self.percentile(0.99), 1),
            "cancel_latency_max_ms": round(max(self.latencies_ms, default=float("nan")), 1),
            "tokens_after_cancel": self.tokens_after_cancel,
            "tokens_after_client_left": self.tokens_after_leaving,
        }
        if self.background is not None:
            out.update(background_streams=self.background.streams,
                       background_completed=self.background.completed,
                       background_failed=self.background.failed,
                       background_errors=", ".join(
                           f"{k}: {v}" for k, v in sorted(self.background.errors.items())))
        return out

    def checks(self) -> tuple[Check, ...]:
        """What the command exits 1 on: a cancel that did not reach the engine, a
        generation left running, a background stream that did not complete."""
        checks = [Check("cancelled", "==", self.streams,
                        "every abandoned stream's cancel reached the engine"),
                  Check("still_running", "==", 0, "no abandoned generation runs on")]
        if self.background is not None:
            checks.append(Check("background_completed", "==", self.background.streams,
                                "every stream running beside them completed: a cancel took "
                                "none of them down"))
        return tuple(checks)

    def report(self, gap_ms: int) -> Report:
        figures = self.figures()
        beside = f" beside {self.background.streams} running" if self.background else ""
        return Report("bench cancel", story=f"{self.streams} streams abandoned after 1-8 "
                      f"tokens, {gap_ms} ms apart{beside}: how fast the engine saw each cancel",
                      figures=figures, checks=judge(self.checks(), figures))


async def abandon_streams(
    url: str,
    stats: Callable[[str], pb.GetStatsResponse],
    streams: int = 200,
    concurrency: int = 20,
    gap_ms: int = 20,
    seed: int = 1,
    progress: Callable[[], None] | None = None,
) -> AbandonReport:
    rng = random.Random(seed)
    plan = [(f"abandon-{uuid.uuid4().hex[:10]}", rng.randint(1, 8)) for _ in range(streams)]
    left: dict[str, tuple[float, int]] = {}
    limit = asyncio.Semaphore(concurrency)

    async def one(http: httpx.AsyncClient, rid: str, after: int) -> None:
        async with limit:
            body = chat_body("abandon me", prefill_ms=20, token_gap_ms=gap_ms,
                             answer_tokens=after + 200)
            result = await stream_chat(http, url, body, headers={"X-Request-Id": rid},
                                       stop_after_tokens=after)
            if result.left_at is not None:
                left[rid] = (result.left_at, len(result.texts))
            if progress is not None:
                progress()

    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0),
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(one(http, rid, after) for rid, after in plan))

    report = AbandonReport(streams=streams, cancelled=0, still_running=0)
    deadline = time.monotonic() + 10  # for all of them together
    for rid, (left_at, _) in left.items():
        record = await asyncio.to_thread(wait_for_end, stats, rid,
                                         max(0.0, deadline - time.monotonic()))
        if record is None:
            continue
        if record.state == pb.GENERATION_STATE_RUNNING:
            report.still_running += 1
            continue
        if record.state == pb.GENERATION_STATE_CANCELLED:
            report.cancelled += 1
            report.latencies_ms.append((record.cancelled_at - left_at) * 1000)
        report.tokens_after_cancel += record.tokens_after_cancel
        report.tokens_after_leaving += max(0, record.tokens_generated - left[rid][1])
    return report


async def abandon_under_load(
    url: str,
    stats: Callable[[str], pb.GetStatsResponse],
    host: str,
    port: int,
    background: int,
    streams: int = 200,
    concurrency: int = 20,
    gap_ms: int = 20,
    progress: Callable[[], None] | None = None,
) -> AbandonReport:
    """abandon_streams while `background` other streams run through the same chain
    (cancel latency with 1,000 streams running). The background
    streams are slow (a token a second, the raw-socket load generator: it costs
    the machine little beyond what the chain spends on them), all open before
    the first stream is abandoned, and last past the last one."""
    ramp_s = min(10.0, max(2.0, background / 200))
    # Long enough for the ramp, the abandoned streams (generously: a loaded
    # machine), and the wait for their records.
    answer_tokens = int(ramp_s + 30 + streams * 0.5 / concurrency) + 1
    body = chat_body("background", max_tokens=answer_tokens, prefill_ms=0,
                     token_gap_ms=BACKGROUND_GAP_MS, answer_tokens=answer_tokens)
    load = asyncio.create_task(run_load(
        host, port, "/v1/chat/completions", body, streams=background, ramp_s=ramp_s,
        timeout_s=ramp_s + answer_tokens * 3 + 60))
    await asyncio.sleep(ramp_s + 1.0)  # every background stream open (the ramp, then a second)
    report = await abandon_streams(url, stats, streams=streams, concurrency=concurrency,
                                   gap_ms=gap_ms, progress=progress)
    report.background = await load
    return report


def needs(background: int) -> frozenset[Capability]:
    """The engine's record of every cancel; with background streams, restarts to
    raise the caps (and the local lab's pids, whose settings it rewrites)."""
    return frozenset({Capability.ENGINE_RECORD} | (
        {Capability.RESTART_SERVICE, Capability.PIDS} if background else set()))


def bench_cancel(lab: LabTarget, *, location: str = "/", streams: int = 200,
                 concurrency: int = 20, gap_ms: int = 20, background: int = 0,
                 progress: Callable[[], None] | None = None) -> Report:
    """`streamlab bench cancel`: abandon `streams` through the edge (at nginx's
    `location`), with `background` slow streams running beside them if asked
    (the caps raised for them, the engine restarted on its own clock, all put
    back after: a local lab only). MissingCapability before any stream opens
    on a target without needs(background)."""
    require(lab, needs(background), "bench cancel" + (" --background" if background else ""))

    url = f"{lab.edge_url}{location.rstrip('/')}/v1/chat/completions"
    if not background:
        return asyncio.run(abandon_streams(url, lab.engine_stats, streams=streams,
                                           concurrency=concurrency, gap_ms=gap_ms,
                                           progress=progress)).report(gap_ms)
    with lab_settings(lab, background + concurrency) as use_clock:
        use_clock(lab.options.engine_env.get("STREAMLAB_FAKE_CLOCK", "batched"))
        return asyncio.run(abandon_under_load(
            url, lab.engine_stats, lab.ports.host, lab.ports.edge_port, background,
            streams=streams, concurrency=concurrency, gap_ms=gap_ms,
            progress=progress)).report(gap_ms)


@contextmanager
def gateway_wire(lab: LabTarget, wire: str) -> Iterator[None]:
    """Every gateway of a local lab restarted on `wire`; put back after."""
    from streamlab.lab.local import Lab

    if not isinstance(lab, Lab):
        raise MissingCapability("pids", "bench cancel --wire restarts the gateways")
    env = lab.options.gateway_env
    saved = env.get(WIRE_ENV)

    def restart() -> None:
        for name in lab.gateway_names:
            lab.stop_service(name)
            lab.start_service(name)

    env[WIRE_ENV] = wire
    restart()
    try:
        yield
    finally:
        if saved is None:
            env.pop(WIRE_ENV, None)
        else:
            env[WIRE_ENV] = saved
        restart()


def bench_cancel_wires(lab: LabTarget, wires: tuple[str, ...], *, location: str = "/",
                       streams: int = 200, concurrency: int = 20, gap_ms: int = 20,
                       background: int = 0,
                       progress: Callable[[], None] | None = None) -> Report:
    """bench_cancel once per wire: a table of the cancel latencies side by
    side, each wire's figures prefixed by its name, and each wire's checks kept
    (a cancel lost on either wire fails the run)."""
    figures: Figures = {}
    checks: list[Check] = []
    rows: list[tuple[Figure, ...]] = []
    story = ""
    for wire in wires:
        with gateway_wire(lab, wire):
            report = bench_cancel(lab, location=location, streams=streams,
                                  concurrency=concurrency, gap_ms=gap_ms,
                                  background=background, progress=progress)
        story = report.story
        figures.update({f"{wire}_{name}": value for name, value in report.figures.items()})
        checks += [Check(f"{wire}_{r.check.figure}", r.check.op, r.check.bound,
                         f"{wire}: {r.check.why}") for r in report.checks]
        rows.append((wire, *(report.figures.get(f"cancel_latency_{q}_ms")
                             for q in ("p50", "p99", "max")),
                     report.figures.get("tokens_after_cancel")))
    table = Table("cancel latency by engine wire (client left -> engine cancelled)",
                  ("wire", "p50 ms", "p99 ms", "max ms", "tokens after cancel"), tuple(rows))
    return Report("bench cancel", story=f"{story}; on each engine wire", figures=figures,
                  checks=judge(tuple(checks), figures), tables=(table,))
