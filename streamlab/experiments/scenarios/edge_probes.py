"""Edge probes: does this proxy, as configured, break a token stream?

Each probe measures one failure on any of the lab's edge proxies
(streamlab/lab/proxies/) in two forms, and judges each form's figures with
the probe's checks (what a whole stream looks like): a Report per form, in the
vocabulary of every other experiment (report.py):

    default  the proxy out of the box: its `/buffered/` location (or, for the
             reload and ceiling probes, its config less the directive that
             fixes it: the proxy's own default value)
    ready    the lab's streaming-ready config (`/`, or the config as the lab
             writes it)
    yours    a user's own config (`--proxy-config`): `/`, as it is

    buffering        tokens one by one, or one lump at the end
    compression      the same with `Accept-Encoding: gzip`
    idle-cut         a think pause longer than the idle timeout: silent, cut;
                     with heartbeats, whole
    websocket        the gateway's /ws upgrade through the proxy
    slow-reader      a client that reads nothing: does the proxy soak up the
                     whole answer (the engine runs to the end for nobody)?
    client-leaves    the client closes during a silent prefill: is the
                     engine's generation cancelled?
    client-address   does the client's address reach the gateway (its
                     per-client identity), or does every client look alike?
    headers-held     are the response headers held back until the first token?
    reload           the proxy reloads its config under live streams: cut, or
                     drained? How long the old workers linger
    ceiling          how many concurrent streams the config admits (a bounded
                     ramp) before it refuses or queues

Each proxy's class names, per probe, its own directive that fixes it
(`probe_fixes`; `fix_of`), and the directives the reload and ceiling probes
remove (`reload_bound`, `ceiling_pattern`); the matrix (edge_matrix.py) quotes
the fix. A probe that cannot measure (no job to ask for, a request the engine
never saw) raises: its Report is an error, with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import httpx
import psutil

from services.client.openai_stream import StreamResult, chat_body, stream_chat
from services.client.silent import open_silent_reader
from streamlab.experiments.generation_end import state_name, wait_for_end
from streamlab.experiments.report import JSON, Check, Figures, Report, judge
from streamlab.experiments.scenarios.measures import websocket_chat
from streamlab.experiments.scenarios.model import Setup, note_stream
from streamlab.experiments.timing import Timing
from streamlab.lab.local import Lab
from streamlab.lab.processes import wait_until
from streamlab.lab.proxies import PROXIES
from streamlab.lab.proxies.base import ProbeFix
from streamlab.lab.proxies.idle import cuts_streams, fill, idle_timeouts
from streamlab_protocol.engine.v1 import engine_pb2 as pb

Form = Literal["default", "ready", "yours"]
FORMS: tuple[Form, ...] = ("default", "ready")

# The fake model's pace for the timed streams: tokens far enough apart that a
# lump (everything at the end) cannot pass for a stream.
PREFILL_MS, GAP_MS, TOKENS = 300, 50, 20
# A think pause longer than the lab's short idle timeout (2 s), and pings well inside it.
PAUSE_S, HEARTBEAT_S = 3.0, 0.5
# A silent prefill the client leaves during, and when it leaves.
SILENT_PREFILL_MS, LEAVE_AT_S = 3000, 0.3
# The engine must hear of a leaving client within this, or the prefill ran for nobody.
CANCEL_BOUND_MS = 1000
# A flood for the slow reader, written as fast as the engine can: longer than
# every kernel buffer on the way holds (the hops' autotuned socket buffers grow
# to megabytes on loopback: 30,000 tokens, ~6 MB, fit), so only a proxy that
# buffers in its own memory or on disk takes it all.
FLOOD_TOKENS = 100_000
# Longer than the matrix lab's streaming idle timeout (edge_matrix.py), which
# a proxy's `/` may use as its client timeout, plus the time its buffers take to fill.
SLOW_READER_WINDOW_S = 20.0
# Tokens still growing over the window's last seconds: the proxy reads on.
STILL_GENERATING_S = 2.0
# Reload: streams live across it, and a hard stop shorter than what is left of them.
RELOAD_STREAMS, RELOAD_TOKENS, RELOAD_AT_S = 8, 80, 1.0
CUT_STOP_S = 1
# Ceiling: the bounded ramp, in steps, and how long a stream may take to be admitted.
CEILING_MAX, CEILING_STEP = 1200, 100
ADMIT_TIMEOUT_S = 8.0
CEILING_HEARTBEAT_S = 2.0
# The client addresses of the client-address probe (loopback is a /8 on Linux).
CLIENT_A, CLIENT_B = "127.0.0.2", "127.0.0.3"


@dataclass
class ProbeContext:
    """What a probe reaches: the running lab (its proxy at the edge), the user's
    config text when it runs one, and the form's path."""

    lab: Lab
    proxy: str
    user_config: str | None = None  # the user's config as the proxy reads it (filled in)

    @property
    def base(self) -> str:
        return self.lab.edge_url

    def completions(self, path: str) -> str:
        return f"{self.base}{path.rstrip('/')}/v1/chat/completions"


# A probe's measure: its figures, and a note on them ("" when none): the Report's story.
Measure = Callable[[ProbeContext, Form], Awaitable[tuple[Figures, str]]]


@dataclass(frozen=True)
class Probe:
    name: str
    failure: str  # what breaks, one line
    measure: Measure
    # What a whole stream looks like: every check holds where the proxy does not break it.
    checks: tuple[Check, ...]
    # Fast enough for the CI slice (a few seconds per form).
    fast: bool = True
    # The figures a table shows first.
    shown: tuple[str, ...] = ()

    async def run(self, ctx: ProbeContext, form: Form) -> Report:
        """The probe in one form, judged; a crash is an error Report with its reason."""
        try:
            figures, note = await self.measure(ctx, form)
        except Exception as exc:  # a probe's crash is its cell's, not the matrix's end
            return Report(self.name, form, status="error",
                          reason=f"{type(exc).__name__}: {exc}"[:200])
        return Report(self.name, form, note, figures, judge(self.checks, figures))


def default_path(probe: str, proxy: str) -> str:
    """The out-of-the-box location of a probe on a proxy: `/buffered/`, except
    nginx's for the client address, whose server-wide X-Forwarded-For the lab
    sets (so /buffered/ inherits it): `/no-forwarded-for/` is nginx without it."""
    if probe == "client-address" and proxy == "nginx":
        return "/no-forwarded-for/"
    return "/buffered/"


def path_of(ctx: ProbeContext, probe: str, form: Form) -> str:
    return default_path(probe, ctx.proxy) if form == "default" else "/"


# ---- timed streams (buffering, compression, idle cut, headers) ---------------------

def stream_figures(result: StreamResult) -> Figures:
    """A timed stream's figures, on the client's clock (httpx decodes gzip, so a
    compressed stream's tokens are timed as they decode)."""
    times = result.token_times
    return {
        "status": result.status,
        "headers_s": _round(result.headers_s),
        "first_byte_s": _round(result.first_byte_s),
        "first_token_s": _round(result.ttft_s),
        "total_s": _round(result.total_s),
        "tokens": len(times),
        "token_spread_s": _round(times[-1] - times[0] if len(times) > 1 else None),
        "pings": len(result.ping_times),
        "done": result.done,
        "content_encoding": result.content_encoding or "none",
        "error": result.error_text,
    }


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


async def timed(url: str, body: dict[str, JSON], *, gzip: bool = False, retry: bool = True
                ) -> tuple[StreamResult, Figures]:
    """One stream (stream_chat), once more if the first try failed before a
    byte came (a connection error, not what the probe looks at); the figure
    that says so (`retried_after`), when it was."""
    headers = {"Accept-Encoding": "gzip" if gzip else "identity"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(20.0, connect=5.0)) as http:
        result = await stream_chat(http, url, body, headers=headers)
        if not retry or not result.error or result.first_byte_s is not None:
            return result, {}
        again = await stream_chat(http, url, body, headers=headers)
    return again, {"retried_after": result.error_text}


def stream_body(**extra: Any) -> dict[str, JSON]:
    pace: dict[str, Any] = {"prefill_ms": PREFILL_MS, "token_gap_ms": GAP_MS,
                            "answer_tokens": TOKENS, "heartbeat_s": 0, **extra}
    return chat_body("probe", **pace)


async def buffering(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    result, retried = await timed(ctx.completions(path_of(ctx, "buffering", form)), stream_body())
    return {**stream_figures(result), "lump": result.lump, **retried}, ""


async def compression(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    result, retried = await timed(ctx.completions(path_of(ctx, "compression", form)),
                                  stream_body(), gzip=True)
    return {**stream_figures(result), "lump": result.lump, **retried}, ""


async def headers_held(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """A silent prefill (no pings): the gateway sends its headers at once; a
    proxy that holds them until the first body byte makes a client's
    time-to-headers its time-to-first-token."""
    body = stream_body(prefill_ms=1500)
    result, retried = await timed(ctx.completions(path_of(ctx, "headers-held", form)), body)
    first = result.ttft_s
    held = (result.headers_s is not None and first is not None
            and result.headers_s >= 0.8 * first)
    return {**stream_figures(result), "headers_held": held, **retried}, ""


async def idle_cut(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """default: `/short-timeout/` (the lab's 2 s idle timeout), a silent pause
    longer; ready: the same pause with heartbeats. yours: `/`, silent, a pause
    longer than the config's shortest idle timeout, named when it cuts."""
    pause_s, heartbeat_s, path = PAUSE_S, 0.0, "/short-timeout/"
    named: list[str] = []
    if form == "ready":
        heartbeat_s = HEARTBEAT_S
    elif form == "yours":
        path = "/"
        timeouts = idle_timeouts(ctx.proxy, ctx.user_config or "")
        shortest = min((t.seconds for t in timeouts), default=None)
        if shortest is not None and shortest < 20:
            pause_s = shortest + 1.0
        named = [t.describe() for t in cuts_streams(ctx.proxy, ctx.user_config or "", pause_s)]
    body = stream_body(answer_tokens=5, pauses=[{"after_token": 1,
                                                  "pause_ms": int(pause_s * 1000)}],
                       heartbeat_s=heartbeat_s)
    result, _ = await timed(ctx.completions(path), body, retry=False)
    figures = {**stream_figures(result), "pause_s": pause_s, "heartbeat_s": heartbeat_s}
    return figures, ("cut by " + ", ".join(named)) if not result.done and named else ""


# ---- the WebSocket upgrade -----------------------------------------------------------

async def websocket(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    figures = await websocket_chat(ctx.lab, Setup(location=path_of(ctx, "websocket", form)),
                                   Timing(prefill_ms=PREFILL_MS, gap_ms=GAP_MS, tokens=5))
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in figures.items()}, ""


# ---- a client that reads nothing -----------------------------------------------------

async def slow_reader(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """A reader that takes no byte (a closed TCP window). A proxy with a send
    timeout cuts it once the buffers in front of it are full, closes the
    upstream, and the gateway cancels the generation; without one (or with a
    proxy that reads on into memory or a temp file) the engine generates for
    nobody, or sits holding its slot, for as long as the client stays.
    Broken: not cut within the window. The tokens generated say how much the
    chain took in meanwhile (on loopback, the hops' autotuned socket buffers
    alone take megabytes)."""
    lab = ctx.lab
    rid = f"probe-slow-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("flood", prefill_ms=0, token_gap_ms=0, answer_tokens=FLOOD_TOKENS,
                     max_tokens=FLOOD_TOKENS, heartbeat_s=0)
    path = f"{path_of(ctx, 'slow-reader', form).rstrip('/')}/v1/chat/completions"
    asked = time.monotonic()
    sock = await asyncio.to_thread(open_silent_reader, lab.ports.host, lab.ports.edge_port,
                                   path, body, {"X-Request-Id": rid})
    samples: list[tuple[float, int]] = []  # (seconds since asked, tokens generated)
    record = None
    try:
        while time.monotonic() - asked < SLOW_READER_WINDOW_S:
            records = (await asyncio.to_thread(lab.engine_stats, rid)).generations
            record = records[0] if records else None
            if record is not None:
                samples.append((time.monotonic() - asked, record.tokens_generated))
                if record.state != pb.GENERATION_STATE_RUNNING:
                    break
            await asyncio.sleep(0.1)
    finally:
        sock.close()
    if record is None:
        raise RuntimeError("the engine never saw the request")
    state = state_name(record)
    cut_after = (round(record.cancelled_at - asked, 2)
                 if record.state == pb.GENERATION_STATE_CANCELLED else None)
    end_s, end_tokens = samples[-1]
    earlier = [tokens for at, tokens in samples if at <= end_s - STILL_GENERATING_S]
    generating = (record.state == pb.GENERATION_STATE_RUNNING and bool(earlier)
                  and end_tokens > earlier[-1])
    completed = record.state == pb.GENERATION_STATE_COMPLETED and cut_after is None
    figures: Figures = {
        "tokens_asked": FLOOD_TOKENS,
        "engine_state_at_end": state,
        "tokens_generated": record.tokens_generated,
        "generating_at_end": generating,
        "cut_after_s": cut_after,
        "window_s": SLOW_READER_WINDOW_S,
    }
    await asyncio.to_thread(wait_for_end, lab.engine_stats, rid, 10.0)
    return figures, "the whole answer generated for nobody" if completed else ""


# ---- the client leaves ---------------------------------------------------------------

async def client_leaves(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """The client takes the headers and closes during a silent prefill: only a
    proxy that watches the client's socket closes the upstream, and only then
    does the gateway cancel the engine's generation."""
    lab = ctx.lab
    rid = f"probe-leave-{uuid.uuid4().hex[:8]}"
    note_stream(rid)  # the run's report names it (`streamlab trace ID`)
    body = chat_body("think first", prefill_ms=SILENT_PREFILL_MS, token_gap_ms=GAP_MS,
                     answer_tokens=TOKENS, heartbeat_s=0)
    url = ctx.completions(path_of(ctx, "client-leaves", form))
    status = 0
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0)) as http:
        async with http.stream("POST", url, json=body, headers={"X-Request-Id": rid}) as response:
            status = response.status_code
            await anyio.sleep(LEAVE_AT_S)  # the client's own pace: it gives up
        left_at = time.monotonic()
    record = await asyncio.to_thread(wait_for_end, lab.engine_stats, rid,
                                     SILENT_PREFILL_MS / 1000 + 5)
    cancelled = record is not None and record.state == pb.GENERATION_STATE_CANCELLED
    latency = (round((record.cancelled_at - left_at) * 1000, 1)
               if record is not None and cancelled else None)
    figures: Figures = {"status": status, "left_after_s": LEAVE_AT_S,
                        "engine_state": state_name(record) if record else None,
                        "tokens_generated": record.tokens_generated if record else None,
                        "cancel_latency_ms": latency}
    return figures, ""


# ---- the client's address ------------------------------------------------------------

async def client_address(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """Two clients from two addresses, straight at the proxy (the edge hop in
    front of it would make every client 127.0.0.1): A starts a polling job, B
    asks for it. The gateway gives a job to the identity that started it, the
    address the proxy forwards (X-Forwarded-For); without the header both are
    the proxy's own address, and B reads A's job."""
    lab = ctx.lab
    path = path_of(ctx, "client-address", form).rstrip("/")
    base = f"http://{lab.ports.host}:{lab.ports.nginx_port}{path}"
    body = chat_body("whose job", prefill_ms=0, token_gap_ms=1, answer_tokens=2)

    def client(address: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address=address),
                                 timeout=httpx.Timeout(10.0))

    async with client(CLIENT_A) as a:
        started = await a.post(f"{base}/v1/jobs", json=body)
        job = started.json().get("id") if started.status_code == 201 else None
        own = (await a.get(f"{base}/v1/jobs/{job}")).status_code if job else None
    async with client(CLIENT_B) as b:
        other = (await b.get(f"{base}/v1/jobs/{job}")).status_code if job else None
    figures: Figures = {"job_started": started.status_code, "owner_reads_it": own,
                        "other_client_reads_it": other,
                        "clients_told_apart": other == 404}
    if job is None or own != 200:
        raise RuntimeError(f"no job to ask for (HTTP {started.status_code})")
    return figures, ""


# ---- reload under live streams -------------------------------------------------------

def rewrite(ctx: ProbeContext, edit: Callable[[str], str]) -> str:
    """Edit the running proxy's config file in place and reload it (no stream
    open: the old workers go at once, and are waited for); the text before,
    to restore."""
    config = ctx.lab.proxy_config_path
    before = config.read_text()
    config.write_text(edit(before))
    settled_reload(ctx)
    return before


def restore(ctx: ProbeContext, text: str) -> None:
    ctx.lab.proxy_config_path.write_text(text)
    settled_reload(ctx)


def settled_reload(ctx: ProbeContext, timeout_s: float = 15.0) -> None:
    """Reload, then wait until the old workers are gone and the chain serves:
    the next measure must not count a worker of this reload as its own."""
    old = workers(ctx) or set()
    reload_now(ctx)
    deadline = time.monotonic() + timeout_s
    while old & (workers(ctx) or set()) and time.monotonic() < deadline:
        time.sleep(0.1)
    wait_until(ctx.lab.chain_ready, timeout_s, f"the chain through {ctx.proxy} after a reload")


def reload_now(ctx: ProbeContext) -> None:
    """The proxy's own reload command on the file as it is (the lab's
    reload_proxy would rewrite it from its source first)."""
    lab, proxy = ctx.lab, ctx.lab.proxy
    setup = lab.proxy_setup
    command = proxy.reload_command(proxy.find(), lab.proxy_config_path, setup, lab.pids["nginx"])
    done = subprocess.run(command, env={**os.environ, **proxy.environment(setup)},
                          capture_output=True, text=True, timeout=20, check=False,
                          cwd=setup.run_dir)
    if done.returncode != 0:
        raise RuntimeError(f"{proxy.name} did not reload ({' '.join(command)}): "
                           f"{(done.stderr + done.stdout).strip()[-300:]}")
    if command[0] == "touch":
        time.sleep(1.0)  # a file provider's watch picks the change up


def workers(ctx: ProbeContext) -> set[int] | None:
    """The pids of the proxy's worker processes (its master's children); None
    for a one-process proxy (it has none: it reloads inside its process)."""
    try:
        return {child.pid for child in psutil.Process(ctx.lab.pids["nginx"]).children()} or None
    except psutil.Error:
        return None


async def streams_across_reload(ctx: ProbeContext) -> Figures:
    """RELOAD_STREAMS streams through `/`, a reload RELOAD_AT_S into them: how
    many finish whole, and how long the old workers outlive the reload."""
    lab = ctx.lab
    body = chat_body("reload", prefill_ms=100, token_gap_ms=GAP_MS, answer_tokens=RELOAD_TOKENS,
                     heartbeat_s=0)
    url = ctx.completions("/")
    before = workers(ctx)
    async with httpx.AsyncClient(timeout=httpx.Timeout(15.0),
                                 limits=httpx.Limits(max_connections=RELOAD_STREAMS * 2)) as http:
        tasks = [asyncio.create_task(stream_chat(http, url, body))
                 for _ in range(RELOAD_STREAMS)]
        await asyncio.sleep(RELOAD_AT_S)
        reloaded_at = time.monotonic()
        await asyncio.to_thread(reload_now, ctx)
        # Old workers gone: polled while the streams run and after.
        linger: float | None = None
        stream_s = RELOAD_TOKENS * GAP_MS / 1000
        deadline = reloaded_at + stream_s + 8
        while time.monotonic() < deadline and before:
            if not before & (workers(ctx) or set()):  # every old worker gone
                linger = round(time.monotonic() - reloaded_at, 2)
                break
            await asyncio.sleep(0.1)
        results = await asyncio.gather(*tasks)
    whole = sum(1 for r in results if r.done and len(r.texts) == RELOAD_TOKENS)
    del lab
    return {"streams": RELOAD_STREAMS, "whole": whole, "cut": RELOAD_STREAMS - whole,
            "stream_s": round(RELOAD_TOKENS * GAP_MS / 1000, 1),
            "old_workers_gone_after_s": linger}


async def reload(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """default: the proxy's own drain (the bounding directive removed); ready:
    the lab's config (a bound longer than a stream); figures of a third run
    with a hard stop of CUT_STOP_S show what a short bound does."""
    directive = ctx.lab.proxy.reload_bound
    if form == "yours" or directive is None:
        note = "its reload leaves the connections alone: nothing bounds it"
        return await streams_across_reload(ctx), "" if form == "yours" else note
    pattern, line = directive
    if form == "ready":
        figures = await streams_across_reload(ctx)
        original = rewrite(ctx, lambda text: pattern.sub(line(CUT_STOP_S), text))
        try:
            short = await streams_across_reload(ctx)
        finally:
            restore(ctx, original)
        figures.update({f"hard_stop_{CUT_STOP_S}s_cut": short["cut"],
                        f"hard_stop_{CUT_STOP_S}s_old_workers_gone_after_s":
                            short["old_workers_gone_after_s"]})
        return figures, ""
    original = rewrite(ctx, lambda text: pattern.sub("", text))
    try:
        return await streams_across_reload(ctx), ""
    finally:
        restore(ctx, original)


# ---- the connection ceiling ----------------------------------------------------------

async def _open_stream(host: str, port: int, request: bytes
                       ) -> tuple[str, asyncio.StreamWriter | None]:
    """One stream opened: "admitted" (a 200 status line), "refused" (closed,
    reset, or another status) or "queued" (no answer within ADMIT_TIMEOUT_S)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
    except (OSError, TimeoutError):
        return "refused", None
    try:
        writer.write(request)
        line = await asyncio.wait_for(reader.readline(), ADMIT_TIMEOUT_S)
    except TimeoutError:
        return "queued", writer
    except OSError:
        writer.close()
        return "refused", None
    if b" 200 " in line:
        return "admitted", writer
    writer.close()
    return "refused", None


async def ramp(ctx: ProbeContext, limit: int = CEILING_MAX) -> Figures:
    """Open streams CEILING_STEP at a time (each a long silent prefill, so it
    stays open and quiet) until one is refused or queued, or `limit` are open."""
    lab = ctx.lab
    # Pings inside the matrix lab's idle timeout, so no stream is cut (and its
    # connections freed) while the ramp runs.
    body = chat_body("ceiling", prefill_ms=60_000, token_gap_ms=GAP_MS, answer_tokens=1,
                     heartbeat_s=CEILING_HEARTBEAT_S)
    payload = json.dumps(body).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {lab.ports.host}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
               ).encode() + payload
    writers: list[asyncio.StreamWriter] = []
    counts = {"admitted": 0, "refused": 0, "queued": 0}
    started = time.monotonic()
    try:
        while counts["admitted"] < limit and not (counts["refused"] or counts["queued"]):
            step = min(CEILING_STEP, limit - counts["admitted"])
            opened = await asyncio.gather(*(_open_stream(lab.ports.host, lab.ports.edge_port,
                                                         request) for _ in range(step)))
            for outcome, writer in opened:
                counts[outcome] += 1
                if writer is not None:
                    writers.append(writer)
    finally:
        for writer in writers:
            writer.close()
    # The gateway cancels the abandoned generations; let them go before the next probe.
    await asyncio.sleep(2.0)
    return {"ramp_to": limit, "admitted": counts["admitted"], "refused": counts["refused"],
            "queued": counts["queued"], "ramp_s": round(time.monotonic() - started, 1)}


async def ceiling(ctx: ProbeContext, form: Form) -> tuple[Figures, str]:
    """default: the limit directive removed (the proxy's own default); ready
    and yours: the config as it is."""
    limit = ctx.lab.proxy.ceiling_pattern
    if form == "default" and limit is not None:
        original = rewrite(ctx, lambda text: limit.sub("", text))
        try:
            figures = await ramp(ctx)
        finally:
            restore(ctx, original)
    else:
        figures = await ramp(ctx)
    return figures, ("" if limit is not None or form != "default"
                     else f"{ctx.proxy} has no connection limit by default")


# What a whole stream looks like, per probe: the checks hold where the proxy does not break it.
DONE = Check("done", "==", True, "the stream ends with [DONE]")
NO_LUMP = Check("lump", "==", False, "tokens as they are made, not one lump at the end")

PROBES: tuple[Probe, ...] = (
    Probe("buffering", "tokens held back and sent as one lump", buffering, (NO_LUMP, DONE),
          shown=("first_byte_s", "total_s", "token_spread_s")),
    Probe("compression", "an event stream gzipped into one lump (Accept-Encoding: gzip)",
          compression, (NO_LUMP, DONE),
          shown=("content_encoding", "first_byte_s", "total_s", "token_spread_s")),
    Probe("idle-cut", "a silent think pause longer than the idle timeout cuts the stream",
          idle_cut, (Check("done", "==", True, "the think pause did not cut the stream"),),
          shown=("pause_s", "heartbeat_s", "pings", "done", "error")),
    Probe("websocket", "the WebSocket upgrade refused", websocket,
          (Check("handshake_status", "==", 101, "the upgrade accepted"), DONE),
          shown=("handshake_status", "tokens", "done")),
    Probe("slow-reader", "a reader that reads nothing is never cut: its generation runs on",
          slow_reader, (Check("cut_after_s", "!=", None, "cut within the window: the engine "
                              "stops generating for nobody"),),
          fast=False,
          shown=("engine_state_at_end", "tokens_generated", "generating_at_end",
                 "cut_after_s")),
    Probe("client-leaves", "the client leaves, the engine generates on", client_leaves,
          (Check("cancel_latency_ms", "<=", CANCEL_BOUND_MS,
                 "the engine's generation cancelled soon after the client left"),),
          shown=("engine_state", "cancel_latency_ms")),
    Probe("client-address", "every client reaches the gateway as the proxy's address",
          client_address, (Check("other_client_reads_it", "==", 404,
                                 "the gateway tells two clients apart (X-Forwarded-For)"),),
          shown=("owner_reads_it", "other_client_reads_it")),
    Probe("headers-held", "response headers held until the first token", headers_held,
          (Check("headers_held", "==", False, "the headers go out before the first token"),
           DONE), shown=("headers_s", "first_token_s")),
    Probe("reload", "a config reload cuts live streams", reload,
          (Check("cut", "==", 0, "every live stream outlives the reload"),),
          fast=False,
          shown=("whole", "cut", "old_workers_gone_after_s", f"hard_stop_{CUT_STOP_S}s_cut",
                 f"hard_stop_{CUT_STOP_S}s_old_workers_gone_after_s")),
    Probe("ceiling", "concurrent streams refused or queued below the ramp's top", ceiling,
          (Check("admitted", ">=", CEILING_MAX, "every stream of the ramp admitted"),),
          fast=False, shown=("admitted", "refused", "queued")),
)


def fix_of(probe: str, proxy: str) -> str:
    """The proxy's own directive that fixes what `probe` finds (or why none is needed)."""
    found = probe_fix(probe, proxy)
    return found.text if found is not None else ""


def probe_fix(probe: str, proxy: str) -> ProbeFix | None:
    """The proxy's answer for `probe`, or None for a proxy or probe it does not know."""
    found = PROXIES.get(proxy)
    return found.probe_fixes.get(probe) if found is not None else None


def probe_names() -> list[str]:
    return [p.name for p in PROBES]


def get_probe(name: str) -> Probe:
    for probe in PROBES:
        if probe.name == name:
            return probe
    raise KeyError(f"no probe {name!r}; one of: {', '.join(probe_names())}")


def user_config_text(lab: Lab) -> str | None:
    """A user's config as the proxy reads it (placeholders filled), or None."""
    source = lab.options.proxy_config
    if source is None:
        return None
    return fill(source.read_text(), lab.proxy_setup.environment())
