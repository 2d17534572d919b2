"""reconnect-storm: cut the edge under hundreds of live resumable streams at
once, restore it, and watch them come back.

    broken  every stream gets the same `retry:` (500 ms) and a resume is
            refused like a new stream when the gateway's connect rate is spent:
            the clients come back in lockstep, the peak of connection attempts
            is many times the steady rate, and the rate limit may answer the
            storm with 429s (shown, not checked: how many depends on how
            tightly the storm arrives), which come back on the same tick again
    fixed   the shipped settings: a per-stream jittered `retry:` (1 s + [0,
            4 s), from the stream id: STREAMLAB_GATEWAY_RESUME_RETRY_JITTER_MS)
            and resumes admitted first (STREAMLAB_GATEWAY_RESUME_ADMISSION=
            first): the peak stays within 4x the steady rate, no resume is
            refused, and every stream is back within 10 s with its whole text
            exactly once

The lab: a private one (streamlab/experiments/scenarios/replica_lab.py), 2 gateways sharing
Redis, so the resumes land on either gateway. Both modes have the same connect
rate limit per gateway (1.5x what the ramp needs), so what differs is only
the jitter and the admission.

The client is a cheap one: raw asyncio sockets, HTTP/1.0 (the body is the SSE
text itself, no chunked framing), a minimal SSE split, the EventSource rules
(wait `retry:` after any loss, then GET with Last-Event-ID). It notes every
connection attempt: the reconnect timeline, which the run writes as its
report's artifact (load_timelines reads it back, plot_timeline draws it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from services.client.openai_stream import chat_body
from services.gateway.settings import GatewaySettings
from streamlab.experiments import report
from streamlab.experiments.report import JSON, Check, Report
from streamlab.experiments.scenarios.history import History, judge
from streamlab.experiments.scenarios.model import Measured, Scenario, Setup, Timeline, Variant
from streamlab.experiments.scenarios.registry import register
from streamlab.experiments.scenarios.replica_lab import private_lab
from streamlab.experiments.timing import Timing
from streamlab.lab.target import LabTarget

RAMP_S = 5.0  # streams open evenly over this: the steady rate is N / RAMP_S per second
CUT_AFTER_RAMP_S = 0.5
CUT_S = 1.5  # how long the edge stays down
TOKENS, GAP_MS = 30, 200  # 6 s of tokens: every stream is live at the cut
RECOVERY_TARGET_S = 10.0
PEAK_FACTOR = 4.0  # the bound: a peak of at most 4x the steady rate
GIVE_UP_AFTER_S = 40.0  # past the restore: a client still not done is counted lost
BROKEN_RETRY_MS = 500
# The fixed mode's spread: the gateway's shipped defaults.
FIXED_RETRY_MS = int(GatewaySettings.model_fields["resume_retry_ms"].default)
FIXED_JITTER_MS = int(GatewaySettings.model_fields["resume_retry_jitter_ms"].default)
EVENT_END = re.compile(rb"\r\n\r\n|\n\n")
TERMINAL = {"done", "error", "cancelled"}

def gateway_env(mode: str, streams: int) -> dict[str, str]:
    """The fixed mode is the shipped settings (jittered `retry:`, resumes
    admitted first, the 10 s grace and attach timeout) plus the lab's own
    condition, the same in both modes: a connect rate limit per gateway."""
    # Each gateway gets about half the ramp's creates and first GETs: N/RAMP_S
    # connections/s; 1.5x that leaves the steady state unthrottled.
    rate = max(10.0, 1.5 * streams / RAMP_S)
    env = {"STREAMLAB_GATEWAY_RESUME_CONNECT_RATE_PER_S": f"{rate:g}"}
    if mode == "fixed":
        return env
    return {**env,
            "STREAMLAB_GATEWAY_RESUME_ADMISSION": "same",
            "STREAMLAB_GATEWAY_RESUME_RETRY_MS": str(BROKEN_RETRY_MS),
            "STREAMLAB_GATEWAY_RESUME_RETRY_JITTER_MS": "0"}


@dataclass
class Client:
    stream_id: str = ""
    retry_ms: int = 1000
    last_event_id: str | None = None
    seqs: list[int] = field(default_factory=list)
    data: dict[int, bytes] = field(default_factory=dict)  # token data by sequence
    token_times: list[float] = field(default_factory=list)  # perf_counter at each token
    tokens: int = 0
    terminal: str | None = None
    first_get_at: float | None = None
    back_at: float | None = None  # first 200 after the restore
    cut: bool = False  # its connection was lost
    terminal_data: bytes = b""  # the terminal event's data (a cancel's reason)
    history: History = field(default_factory=History)  # every event, for history.judge


async def _request(host: str, port: int, head: str, body: bytes = b""
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int, bytes]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
    writer.write(head.encode() + body)
    await writer.drain()
    data = b""
    while b"\r\n\r\n" not in data:
        more = await asyncio.wait_for(reader.read(65536), 10.0)
        if not more:
            break
        data += more
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    status_line = head_bytes.split(b"\r\n", 1)[0].split()
    status = int(status_line[1]) if len(status_line) > 1 else 0
    return reader, writer, status, rest


class Storm:
    def __init__(self, host: str, port: int, body: dict[str, JSON]) -> None:
        self.host, self.port = host, port
        self.payload = json.dumps(body).encode()
        self.t0 = time.perf_counter()
        self.attempts: list[tuple[float, str]] = []  # (s since t0, outcome) of every GET
        self.creates: Counter[int] = Counter()
        self.create_errors: Counter[str] = Counter()
        self.restored_at: float | None = None
        self.cut_at: float | None = None

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def create(self, client: Client) -> None:
        head = (f"POST /v1/streams HTTP/1.0\r\nHost: {self.host}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(self.payload)}\r\n\r\n")
        reader, writer, status, rest = await _request(self.host, self.port, head, self.payload)
        try:
            while more := await asyncio.wait_for(reader.read(65536), 10.0):
                rest += more
        finally:
            writer.close()
        self.creates[status] += 1
        if status != 201:
            raise RuntimeError(f"create: HTTP {status}: {rest[:200]!r}")
        created = json.loads(rest)
        client.stream_id, client.retry_ms = created["id"], int(created["retry_ms"])

    def launch(self, clients: list[Client], give_up_at: float
               ) -> tuple[list[asyncio.Task[None]], asyncio.Event]:
        """Each client creates its stream, the creates spread over RAMP_S, then
        follows it until give_up_at. The event is set once every create has
        answered (201 or not): the moment a storm may cut."""
        all_open = asyncio.Event()
        opened = 0

        async def one(k: int, client: Client) -> None:
            nonlocal opened
            await asyncio.sleep(k * RAMP_S / len(clients))
            try:
                await self.create(client)
            except (OSError, TimeoutError, RuntimeError, ValueError) as exc:
                self.create_errors[f"{type(exc).__name__}: {exc}"[:80]] += 1
                return
            finally:
                opened += 1
                if opened == len(clients):
                    all_open.set()
            await self.follow(client, give_up_at)

        return [asyncio.create_task(one(k, c)) for k, c in enumerate(clients)], all_open

    async def follow(self, client: Client, give_up_at: float) -> None:
        while client.terminal is None and self.now() < give_up_at:
            await self._connect_once(client)
            if client.terminal is None:
                # Cut by the storm: a connection that ended without the end
                # once the cut had come. One that failed before it (a connect
                # timing out in a loaded ramp) is no cut: its stream may end
                # before the cut, with no reconnect after the restore, and it
                # was counted lost.
                client.cut = client.cut or (client.first_get_at is not None
                                            and self.cut_at is not None)
                await asyncio.sleep(client.retry_ms / 1000)

    async def _connect_once(self, client: Client) -> None:
        resume = f"Last-Event-ID: {client.last_event_id}\r\n" if client.last_event_id else ""
        head = (f"GET /v1/streams/{client.stream_id}/events HTTP/1.0\r\nHost: {self.host}\r\n"
                f"Accept: text/event-stream\r\n{resume}\r\n")
        at = self.now()
        if client.first_get_at is None:
            client.first_get_at = at
        try:
            reader, writer, status, rest = await _request(self.host, self.port, head)
        except (TimeoutError, OSError):
            self.attempts.append((at, "refused"))
            return
        self.attempts.append((at, "5xx" if status >= 500 else str(status)))
        try:
            if status == 204:
                client.terminal = "done"  # it had the end already
                return
            if status != 200:
                return
            if self.restored_at is not None and client.back_at is None:
                client.back_at = self.now()
            buffer = rest
            while True:
                *events, buffer = EVENT_END.split(buffer)
                for event in events:
                    self._event(client, event)
                if client.terminal is not None:
                    return
                more = await reader.read(65536)
                if not more:
                    return
                buffer += more
        except (TimeoutError, OSError):
            return
        finally:
            writer.close()

    @staticmethod
    def _event(client: Client, event: bytes) -> None:
        kind = "message"
        event_id = None
        data = b""
        for line in event.split(b"\n"):
            name, _, value = line.rstrip(b"\r").partition(b":")
            value = value.removeprefix(b" ")
            if name == b"retry":
                client.retry_ms = int(value)
            elif name == b"id":
                event_id = value.decode()
            elif name == b"event":
                kind = value.decode()
            elif name == b"data":
                data = value
        if event_id is None:
            if kind in ("gap", "retry"):
                client.history.saw(kind, None, time.perf_counter(), data)
            return
        client.last_event_id = event_id
        client.seqs.append(int(event_id.rsplit(":", 1)[1]))
        client.history.saw(kind, client.seqs[-1], time.perf_counter(), data)
        if kind == "token":
            client.tokens += 1
            client.data[client.seqs[-1]] = data
            client.token_times.append(time.perf_counter())
        elif kind in TERMINAL:
            client.terminal = kind
            client.terminal_data = data


def peak_per_s(times: list[float], window_s: float = 1.0) -> int:
    """The most attempts in any window of `window_s` (sliding)."""
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] > window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


async def storm(lab: LabTarget, setup: Setup, timing: Timing) -> Measured:
    mode = str(setup.knobs.get("mode", "fixed"))
    n = timing.streams or timing.storm_streams
    async with private_lab(lab, "reconnect-storm", gateways=2,
                           gateway_env=gateway_env(mode, n)) as private:
        body = chat_body("reconnect storm", prefill_ms=timing.prefill_ms, token_gap_ms=GAP_MS,
                         answer_tokens=TOKENS)
        run = Storm(private.ports.host, private.ports.edge_port, body)
        clients = [Client() for _ in range(n)]
        give_up_at = RAMP_S + CUT_AFTER_RAMP_S + CUT_S + GIVE_UP_AFTER_S

        tasks, all_open = run.launch(clients, give_up_at)
        with private.toxiproxy() as toxiproxy:
            # Cut once every stream is open (a busy machine may lag the ramp).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_open.wait(), RAMP_S + 10)
            await asyncio.sleep(CUT_AFTER_RAMP_S)
            run.cut_at = run.now()
            toxiproxy.set_enabled("edge", False)  # closes every connection through it
            await asyncio.sleep(CUT_S)
            # The restore's time is taken as it is asked for: a client that
            # gets through while the API call is still returning (a loaded
            # machine) counts as back, not lost; recovery is timed from here.
            run.restored_at = run.now()
            toxiproxy.set_enabled("edge", True)
        await asyncio.gather(*tasks)

    cut_at, restored_at = run.cut_at or 0.0, run.restored_at or 0.0
    storm_attempts = [t for t, _ in run.attempts if t >= cut_at]
    ramp_gets = sorted(c.first_get_at for c in clients if c.first_get_at is not None)
    steady = len(ramp_gets) / max(ramp_gets[-1] - ramp_gets[0], 1e-3) if ramp_gets else 0.0
    peak = peak_per_s(storm_attempts)
    outcomes = Counter(outcome for t, outcome in run.attempts if t >= cut_at)
    cut = [c for c in clients if c.cut]
    back = [c.back_at - restored_at for c in cut if c.back_at is not None]
    # Each cut stream's next token: its first after the restore, s past it.
    since = [[t - run.t0 - restored_at for t in c.token_times if t - run.t0 >= restored_at]
             for c in cut]
    next_token = [min(times) for times in since if times]
    complete = [c for c in clients if c.terminal == "done" and c.tokens == TOKENS
                and sorted(c.seqs) == list(range(1, len(c.seqs) + 1))]
    duplicates = sum(len(c.seqs) - len(set(c.seqs)) for c in clients)
    incomplete = Counter(why_incomplete(c) for c in clients if c not in complete)
    # Every connection attempt, for plot_timeline: the runner writes it as the
    # report's "timeline" artifact.
    timeline = Timeline("attempts", f"reconnect timeline ({mode}, {n} streams)", {
        "mode": mode, "attempts": [[t, outcome] for t, outcome in run.attempts],
        "cut_at": cut_at, "restored_at": restored_at, "streams": n, "steady_per_s": steady})
    return Measured({
        "streams": n, "created": run.creates[201],
        "create_error": run.create_errors.most_common(1)[0][0] if run.create_errors else "",
        "cut_streams": len(cut),
        "steady_per_s": round(steady, 1), "peak_per_s": peak,
        "peak_ratio": round(peak / steady, 2) if steady else None,
        "attempts_after_cut": len(storm_attempts), "refused": outcomes["refused"],
        "http_429": outcomes["429"], "http_5xx": outcomes["5xx"],
        "recovered": len(back), "lost": len(cut) - len(back),
        "recovery_s": round(max(back), 2) if back and len(back) == len(cut) else None,
        "next_token_s": round(max(next_token), 2) if next_token else None,
        "complete_exactly_once": len(complete), "duplicates": duplicates,
        # Every client's events (history.py): no silent gap, no reader left waiting.
        **{k: v for k, v in judge([c.history for c in clients], TOKENS).items()
           if k in ("silent_gaps", "readers_hung", "histories_sound", "retries_told")},
        "all_complete": len(complete) == n,
        # What kept the others from whole: a table that says "no" says why.
        "incomplete": ", ".join(f"{why} {count}" for why, count in incomplete.most_common()),
    }, (timeline,))


def why_incomplete(client: Client) -> str:
    """One word for a stream that did not end whole and exactly once."""
    if not client.stream_id:
        return "not created"
    if client.terminal is None:
        return "gave up (no end by the deadline)"
    if client.terminal != "done":
        try:
            reason = json.loads(client.terminal_data).get("reason", "")
        except (ValueError, AttributeError):
            reason = ""
        return f"ended {client.terminal} {reason}".rstrip()
    if client.tokens != TOKENS:
        return "done short"
    return "out of order"


SHOWN = ("streams", "created", "create_error", "cut_streams", "steady_per_s", "peak_per_s",
         "peak_ratio", "http_429", "http_5xx", "refused", "recovered", "lost", "recovery_s",
         "complete_exactly_once", "duplicates", "retries_told", "incomplete")

RECONNECT_STORM = Scenario(
    name="reconnect-storm",
    summary="the edge cut under hundreds of live resumable streams (2 gateways, Redis): "
            "a jittered retry: and resumes admitted first keep the reconnect peak ≤ 4x "
            "the steady rate, and every stream recovers within 10 s",
    measure=storm,
    broken=Variant(
        Setup(knobs={"mode": "broken"}),
        (Check("cut_streams", ">=", 1, "the cut really cut live streams"),
         Check("peak_ratio", ">", PEAK_FACTOR,
               "the clients come back in lockstep: a peak far above the steady rate")),
        f"every stream retry: {BROKEN_RETRY_MS} ms, resumes counted like new streams"),
    fixed=Variant(
        Setup(knobs={"mode": "fixed"}),
        (Check("cut_streams", ">=", 1, "the cut really cut live streams"),
         Check("peak_ratio", "<=", PEAK_FACTOR, "peak ≤ 4x the steady rate"),
         Check("http_429", "==", 0, "no resume refused"),
         Check("http_5xx", "==", 0),
         Check("lost", "==", 0, "every cut stream came back"),
         Check("recovery_s", "<=", RECOVERY_TARGET_S, "all back within 10 s of the restore"),
         Check("all_complete", "==", True, "every stream's whole text"),
         Check("duplicates", "==", 0, "exactly once"),
         Check("histories_sound", "==", True, "no silent gap, no reader left waiting")),
        f"the shipped settings: retry: {FIXED_RETRY_MS} ms + [0, {FIXED_JITTER_MS}) ms per "
        "stream, resumes first"),
    shown=SHOWN,
)
register(RECONNECT_STORM)


def fixed_storm(lab: LabTarget, streams: int) -> Report:
    """The fixed mode's measurement (a jittered retry:, resumes admitted first),
    `streams` resumable streams on its private 2-gateway lab, judged on the
    fixed checks: `bench scale`'s cell e (the command hands it in; a bench
    imports no scenario)."""
    fixed = RECONNECT_STORM.fixed
    timing = Timing(storm_streams=streams)
    measured = asyncio.run(storm(lab, fixed.setup, timing))
    figures = dict(measured.figures)
    return Report("reconnect-storm", "fixed", story=f"{streams} resumable streams cut at "
                  "once at the edge and restored (reconnect-storm, fixed)", figures=figures,
                  checks=report.judge(fixed.expect, figures, timing))


class StormTimeline(TypedDict):
    """A timeline file as storm() writes it: every GET of the events URL."""

    mode: str
    attempts: list[tuple[float, str]]  # (s since the storm began, outcome)
    cut_at: float
    restored_at: float
    streams: int
    steady_per_s: float


def load_timelines(paths: Iterable[Path]) -> dict[str, StormTimeline]:
    """The timeline files `scenario run reconnect-storm` wrote (its reports'
    artifacts: <run dir>/scenarios/reconnect-storm-<mode>-attempts.json), per
    mode: the input of plot_timeline."""
    timelines: list[StormTimeline] = [json.loads(path.read_text()) for path in paths]
    return {timeline["mode"]: timeline for timeline in timelines}


def plot_timeline(timelines: dict[str, StormTimeline], path: Path) -> None:
    """Connection attempts per 100 ms, both modes, with the cut shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in ("broken", "fixed") if m in timelines]
    fig, axes = plt.subplots(len(modes), 1, figsize=(11, 3.2 * len(modes)), sharex=True,
                             layout="constrained", squeeze=False)
    colours = {"200": "#2ca02c", "204": "#2ca02c", "refused": "#999999", "429": "#d62728",
               "5xx": "#9467bd"}
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        line = timelines[mode]
        cut = line["cut_at"]
        kinds = ("200", "refused", "429", "5xx")
        bins = [round(i * 0.1, 1) for i in range(-20, 160)]
        bottoms = [0.0] * len(bins)
        for kind in kinds:
            counts = Counter(round((t - cut) // 0.1 * 0.1, 1) for t, k in line["attempts"]
                             if (k == kind or (kind == "200" and k == "204")) and t >= cut - 2)
            heights = [counts.get(b, 0) * 10 for b in bins]  # per second
            ax.bar(bins, heights, width=0.1, bottom=bottoms, align="edge",
                   color=colours[kind], label=kind if kind != "200" else "200 (resumed)")
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        steady = line["steady_per_s"]
        ax.axvspan(0, line["restored_at"] - cut, color="#ffdddd", alpha=0.5, label="edge cut")
        ax.axhline(PEAK_FACTOR * steady, color="black", linestyle="--",
                   label=f"{PEAK_FACTOR:g}x steady ({steady:.0f}/s)")
        ax.set_title(f"{mode}: {line['streams']} streams")
        ax.set_ylabel("attempts / s (100 ms bins)")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the cut")
    fig.suptitle("reconnect-storm: GETs of the events URL through the edge")
    fig.savefig(path, dpi=110)
    plt.close(fig)
