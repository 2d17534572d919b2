"""`streamlab bench engine-death`: a dead engine told from a blip, measured.

A lab of its own (1 gateway on the Redis store, so resumable generations are
detachable, and 2 engines, each behind its engine hop; free ports, taken down
after), and resumable streams read through the edge, each reader timing
every event it gets. Per round, on each engine wire and reattach window asked
for (the gateway restarted on each):

    blip   both engine hops off for `blip_s` (Toxiproxy: refused, every
           connection closed), then on: every stream must end `done` with
           every token once; how long after the blip began its tokens came
           again is the figure the window must outlast
    kill   SIGKILL the first engine under the streams: its streams' readers
           must get `event: retry` (`engine_reattaching`), then a terminal
           `error` (`generation_lost`) within the window and a slack; the
           other engine's streams end `done`, whole. The engine is started
           again for the next round.

The gateway cannot tell a silent dead engine from a dropped hop (both refuse
or reset the connection: docs/resume.md), so the kill's figure is the window
plus the last attempt's backoff; the blip's is what chose the window's
default (services/gateway/settings.py, `reattach_window_s`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.client.resume_stream import TERMINAL_EVENTS, create_stream
from services.engine.backends.fake import token_text
from services.gateway.settings import ENGINE_WIRES, GatewaySettings
from streamlab.experiments.bench.stats import percentile
from streamlab.experiments.report import JSON, Check, Figure, Figures, Report, Table, judge
from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.spare_ports import free_lab_ports
from streamlab_protocol.sse import Event, SSEDecoder

WIRES: tuple[str, ...] = ENGINE_WIRES
WINDOW_ENV = "STREAMLAB_GATEWAY_REATTACH_WINDOW_S"
WIRE_ENV = "STREAMLAB_GATEWAY_ENGINE_WIRE"
RETRY_CODE = "engine_reattaching"  # services/gateway/resume/streams.py
LOST_CODE = "generation_lost"
KILLED = "engine"  # the engine a kill round SIGKILLs (the other is `engine-2`)
TOKENS, GAP_MS = 150, 50  # 7.5 s of tokens: live through either fault
FAULT_AFTER_TOKENS = 5
# The bound a dead engine's readers are promised: the window, plus the last
# attempt's backoff (0.25 s) and a loaded event loop's lag.
BOUND_SLACK_S = 1.0
# Keepalive as the integration suite sets it; the faults here are found by a
# closed connection at once, never by keepalive.
GATEWAY_ENV = {"STREAMLAB_GATEWAY_HEARTBEAT_S": "1",
               "STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": "1000",
               "STREAMLAB_GATEWAY_RESUME_MAX_STREAMS": "1000"}
ENGINE_ENV = {"STREAMLAB_ENGINE_MAX_RUNNING_GENERATIONS": "1000"}


def default_window_s() -> float:
    return float(GatewaySettings.model_fields["reattach_window_s"].default)


def expected_text(tokens: int = TOKENS) -> str:
    return "".join(token_text(i) for i in range(tokens))


def stream_body(tokens: int = TOKENS, gap_ms: int = GAP_MS) -> dict[str, JSON]:
    return {"messages": [{"role": "user", "content": "an engine dies under me"}],
            "streamlab": {"prefill_ms": 10, "token_gap_ms": gap_ms, "answer_tokens": tokens},
            "resume": {"retry_ms": 200}}


@dataclass(frozen=True)
class Told:
    """An `event: retry` a reader got: when, its data, and how many tokens
    it had by then (a chunk's events share its arrival time: order, not
    time, says which tokens came after it)."""

    at: float
    data: dict[str, Any]
    after_tokens: int

    @property
    def code(self) -> str | None:
        code = self.data.get("code")
        return str(code) if code is not None else None


@dataclass
class TimedRead:
    """One reader's connection to a resumable stream: each event with the
    monotonic time it arrived (one connection: the gateway keeps it open
    through a re-attach, so a reconnect would be a finding, `ended`)."""

    stream_id: str
    tokens: list[tuple[int, str, float]] = field(default_factory=list)
    retries: list[Told] = field(default_factory=list)
    terminal: str | None = None
    terminal_data: dict[str, Any] | None = None
    terminal_at: float | None = None
    ended: str = ""  # terminal | eof | transport | timeout | http_<status>

    @property
    def text(self) -> str:
        return "".join(text for _, text, _ in self.tokens)

    @property
    def indexes(self) -> list[int]:
        return [index for index, _, _ in self.tokens]

    def whole(self, tokens: int = TOKENS) -> bool:
        return (self.terminal == "done" and self.indexes == list(range(tokens))
                and self.text == expected_text(tokens))

    def resumed_after(self, since: float) -> float | None:
        """When its tokens came again after the engine call dropped (the
        first `engine_reattaching` after `since`): the first token after it."""
        told = self.told_retry(since)
        if told is None or told.after_tokens >= len(self.tokens):
            return None
        return self.tokens[told.after_tokens][2]

    @property
    def error_code(self) -> str | None:
        """A terminal `error`'s code (its data is an OpenAI error body)."""
        if self.terminal != "error" or not isinstance(self.terminal_data, dict):
            return None
        error = self.terminal_data.get("error")
        return str(error.get("code")) if isinstance(error, dict) else None

    def told_retry(self, since: float) -> Told | None:
        """The first `engine_reattaching` it was told after `since` (always
        before its terminal event: nothing is read after that)."""
        return next((t for t in self.retries if t.at >= since and t.code == RETRY_CODE), None)

    def told_retry_before_end(self, since: float) -> float | None:
        """When it was first told `engine_reattaching` after `since`."""
        told = self.told_retry(since)
        return told.at if told is not None else None


async def read_timed(client: httpx.AsyncClient, base_url: str, events_url: str,
                     read: TimedRead) -> TimedRead:
    """Read the stream's events URL once, to its terminal event, into `read`
    (filled as it goes, so a caller can watch its progress)."""
    url = f"{base_url}{events_url}"
    decoder = SSEDecoder()
    try:
        # identity, as an EventSource: nginx gzips what a client accepts gzipped.
        headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        async with client.stream("GET", url, headers=headers) as response:
            if response.status_code != 200:
                read.ended = f"http_{response.status_code}"
                return read
            async for chunk in response.aiter_raw():
                now = time.monotonic()
                for item in decoder.feed(chunk):
                    if not isinstance(item, Event):
                        continue
                    data = json.loads(item.data) if item.data else {}
                    if item.event == "token":
                        read.tokens.append((int(data["index"]), str(data["text"]), now))
                    elif item.event == "retry":
                        read.retries.append(Told(now, data, len(read.tokens)))
                    elif item.event in TERMINAL_EVENTS:
                        read.terminal, read.terminal_data, read.terminal_at = (
                            item.event, data, now)
                        read.ended = "terminal"
                        return read
        read.ended = "eof"
    except httpx.TimeoutException:
        read.ended = "timeout"
    except httpx.TransportError:
        read.ended = "transport"
    return read


async def _poll(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.05)


@dataclass
class Round:
    """The readers of one fault, and when the fault began."""

    reads: list[TimedRead]
    fault_at: float
    on_killed: set[str] = field(default_factory=set)  # a kill's victims (stream ids)


async def run_round(lab: Lab, streams: int, fault: Callable[[], None],
                    victims: Callable[[list[str]], set[str]] | None = None,
                    read_timeout_s: float = 60.0, create_on: str | None = None,
                    read_on: Sequence[str] = ()) -> Round:
    """Open `streams` resumable streams (through the edge, or on the base URL
    `create_on`) with a reader each (through the edge, or on each of
    `read_on` in turn: a gateway that does not own a stream reads it from the
    shared log); once every reader has FAULT_AFTER_TOKENS tokens, note which
    streams `victims` picks, run `fault` (blocking, in a thread) and read
    them all to their end."""
    url = create_on or lab.edge_url
    readers_at = list(read_on) or [lab.edge_url]
    limits = httpx.Limits(max_connections=2 * streams + 10)
    async with httpx.AsyncClient(timeout=httpx.Timeout(read_timeout_s, connect=5.0),
                                 limits=limits) as client:
        created = await asyncio.gather(*(create_stream(client, url, stream_body())
                                         for _ in range(streams)))
        reads = [TimedRead(c["id"]) for c in created]
        tasks = [asyncio.create_task(read_timed(client, readers_at[k % len(readers_at)],
                                                str(c["events_url"]), r))
                 for k, (c, r) in enumerate(zip(created, reads, strict=True))]
        try:
            await _poll(lambda: all(len(r.tokens) >= FAULT_AFTER_TOKENS or r.ended
                                    for r in reads), 30.0, "every reader a few tokens in")
            chosen = (await asyncio.to_thread(victims, [r.stream_id for r in reads])
                      if victims is not None else set())
            fault_at = time.monotonic()
            await asyncio.to_thread(fault)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
    return Round(reads, fault_at, chosen)


def blip(lab: Lab, seconds: float) -> Callable[[], None]:
    def run() -> None:
        with lab.toxiproxy() as toxiproxy:
            hops = lab.hops_of("engine")
            for hop in hops:
                toxiproxy.set_enabled(hop, False)
            try:
                time.sleep(seconds)  # the blip itself
            finally:
                for hop in hops:
                    toxiproxy.set_enabled(hop, True)
    return run


def on_engine(lab: Lab, engine: str) -> Callable[[list[str]], set[str]]:
    """The streams whose generation runs on `engine` (its records)."""
    def pick(stream_ids: list[str]) -> set[str]:
        return {sid for sid in stream_ids if lab.engine_stats_of(engine, sid).generations}
    return pick


@dataclass
class Cell:
    """The figures of one engine wire and window: every round's readers."""

    wire: str
    window_s: float
    blip_s: float
    blips: list[Round] = field(default_factory=list)
    kills: list[Round] = field(default_factory=list)

    def figures(self) -> Figures:
        blip_reads = [(r, rnd.fault_at) for rnd in self.blips for r in rnd.reads]
        resumed = [t - at for r, at in blip_reads
                   if (t := r.resumed_after(at)) is not None]
        victims = [(r, rnd.fault_at) for rnd in self.kills for r in rnd.reads
                   if r.stream_id in rnd.on_killed]
        survivors = [r for rnd in self.kills for r in rnd.reads
                     if r.stream_id not in rnd.on_killed]
        terminal = [r.terminal_at - at for r, at in victims if r.terminal_at is not None]
        told = [t - at for r, at in victims
                if (t := r.told_retry_before_end(at)) is not None]
        lost = [r for r, _ in victims if r.error_code == LOST_CODE]

        def q(values: list[float], p: float) -> float | None:
            return round(percentile(values, p), 2) if values else None

        return {
            "window_s": self.window_s, "blip_s": self.blip_s,
            "blip_streams": len(blip_reads),
            "blip_whole": sum(r.whole() for r, _ in blip_reads),
            "blip_told_retry": sum(r.told_retry_before_end(at) is not None
                                   for r, at in blip_reads),
            "blip_resumed_p50_s": q(resumed, 50), "blip_resumed_p99_s": q(resumed, 99),
            "blip_resumed_max_s": round(max(resumed), 2) if resumed else None,
            "kill_streams": len(victims) + len(survivors),
            "kill_victims": len(victims),
            "kill_told_retry": len(told),
            "kill_generation_lost": len(lost),
            "kill_retry_p50_s": q(told, 50),
            "kill_terminal_p50_s": q(terminal, 50), "kill_terminal_p99_s": q(terminal, 99),
            "kill_terminal_max_s": round(max(terminal), 2) if terminal else None,
            "kill_survivors": len(survivors),
            "kill_survivors_whole": sum(r.whole() for r in survivors),
        }

    def checks(self) -> tuple[Check, ...]:
        n = len([r for rnd in self.blips for r in rnd.reads])
        victims = sum(len(rnd.on_killed) for rnd in self.kills)
        survivors = sum(len(rnd.reads) for rnd in self.kills) - victims
        bound = round(self.window_s + BOUND_SLACK_S, 2)
        return (
            Check("blip_whole", "==", n, f"a {self.blip_s:g} s blip of both engine hops: "
                  "every stream ends done, every token once"),
            Check("kill_victims", ">=", 1, "the killed engine ran some of the streams"),
            Check("kill_told_retry", "==", victims,
                  "every reader of the dead engine's streams was told event: retry first"),
            Check("kill_generation_lost", "==", victims,
                  "and then ended error generation_lost"),
            Check("kill_terminal_max_s", "<=", bound,
                  f"within the window + {BOUND_SLACK_S:g} s of the kill"),
            Check("kill_survivors_whole", "==", survivors,
                  "the other engine's streams end done, whole"),
        )


@contextmanager
def own_lab(wire: str, window_s: float) -> Iterator[Lab]:
    """A lab of this bench's own (see the module docstring); down after."""
    run_dir = Path(tempfile.mkdtemp(prefix="streamlab-engine-death-"))
    options = LabOptions(run_dir=run_dir, console=False, gateways=1, engines=2, store="redis",
                         gateway_env=gateway_env(wire, window_s), engine_env=dict(ENGINE_ENV))
    lab = Lab(free_lab_ports(options), options)
    lab.up()  # stops what it started if it fails
    try:
        yield lab
    finally:
        lab.down(grace_s=2.0)
        shutil.rmtree(run_dir, ignore_errors=True)


def gateway_env(wire: str, window_s: float) -> dict[str, str]:
    return {**GATEWAY_ENV, WIRE_ENV: wire, WINDOW_ENV: str(window_s)}


def restart_gateway(lab: Lab, wire: str, window_s: float) -> None:
    lab.options.gateway_env.update(gateway_env(wire, window_s))
    for name in lab.gateway_names:
        lab.stop_service(name)
        lab.start_service(name)


def run_cell(lab: Lab, wire: str, window_s: float, *, streams: int, rounds: int,
             blip_s: float, on_step: Callable[[str], None] | None = None) -> Cell:
    cell = Cell(wire, window_s, blip_s)
    for n in range(rounds):
        label = f"{wire}, window {window_s:g} s, round {n + 1}/{rounds}"
        if on_step is not None:
            on_step(f"{label}: {blip_s:g} s blip")
        cell.blips.append(asyncio.run(run_round(lab, streams, blip(lab, blip_s))))
        if on_step is not None:
            on_step(f"{label}: SIGKILL {KILLED}")
        try:
            cell.kills.append(asyncio.run(run_round(
                lab, streams, lambda: lab.kill_service(KILLED), victims=on_engine(lab, KILLED),
                read_timeout_s=window_s + 30.0)))
        finally:
            lab.start_service(KILLED)
    return cell


def bench_engine_death(wires: tuple[str, ...] = ("multiplexed",),
                       windows: tuple[float, ...] | None = None, *, streams: int = 20,
                       rounds: int = 3, blip_s: float = 2.0,
                       on_step: Callable[[str], None] | None = None) -> Report:
    """Every (wire, window) cell on one lab, the gateway restarted for each."""
    windows = windows or (default_window_s(),)
    cells: list[Cell] = []
    with own_lab(wires[0], windows[0]) as lab:
        for wire in wires:
            for window_s in windows:
                if (wire, window_s) != (wires[0], windows[0]):
                    restart_gateway(lab, wire, window_s)
                cells.append(run_cell(lab, wire, window_s, streams=streams, rounds=rounds,
                                      blip_s=blip_s, on_step=on_step))
    return report(cells, streams=streams, rounds=rounds, blip_s=blip_s)


def report(cells: list[Cell], *, streams: int, rounds: int, blip_s: float) -> Report:
    figures: Figures = {}
    checks: list[Check] = []
    rows: list[tuple[Figure, ...]] = []
    several = len(cells) > 1
    for cell in cells:
        prefix = f"{cell.wire}_{cell.window_s:g}s_" if several else ""
        cell_figures = cell.figures()
        figures.update({f"{prefix}{k}": v for k, v in cell_figures.items()})
        checks += [Check(f"{prefix}{c.figure}", c.op, c.bound,
                         f"{cell.wire}, window {cell.window_s:g} s: {c.why}" if several
                         else c.why) for c in cell.checks()]
        f = cell_figures
        rows.append((cell.wire, cell.window_s,
                     f"{f['blip_whole']}/{f['blip_streams']}", f["blip_resumed_p50_s"],
                     f["blip_resumed_p99_s"], f["blip_resumed_max_s"],
                     f"{f['kill_told_retry']}/{f['kill_victims']}",
                     f["kill_terminal_p50_s"], f["kill_terminal_p99_s"],
                     f["kill_terminal_max_s"],
                     f"{f['kill_survivors_whole']}/{f['kill_survivors']}"))
    table = Table(
        "engine hop blip vs engine SIGKILL, per engine wire and reattach window",
        ("wire", "window s", "blip whole", "resumed p50 s", "p99 s", "max s",
         "told retry", "terminal p50 s", "p99 s", "max s", "others whole"), tuple(rows),
        caption=f"{streams} streams a round, {rounds} rounds; resumed: blip start -> the "
                "first token after the re-attach began; terminal: SIGKILL -> the dead "
                "engine's readers' terminal error")
    return Report("bench engine-death",
                  story=f"{streams} resumable streams through the edge, {rounds} rounds: a "
                        f"{blip_s:g} s blip of both engine hops, then a SIGKILL of one engine",
                  figures=figures, checks=judge(tuple(checks), figures), tables=(table,))
