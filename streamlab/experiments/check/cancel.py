"""The client leaves: the generation stops.

A server that keeps generating for a client that has gone burns the GPU for
nobody and holds a batch slot others wait for. Two ways to see it from outside,
the first that the server allows is used, and the verdict says which:

    metrics  the server's own gauge of generations running now (metrics.py
             finds it at the root's /metrics, or --metrics-url, by a known name
             or --running-gauge): read before a long stream, during it (it must
             have risen: the gauge counts this server's work) and after the
             client left, until it is back down or `stop_within_s` has passed.
    timing   no cooperation: on a server with few slots, a fresh request waits
             behind generations nobody reads. A fresh stream's time to first
             token is taken alone (the baseline), then beside K long streams
             being read (the control: it must wait, or the server has slots to
             spare and nothing can be felt), then again and again after the K
             clients left: a server that stops their generations serves it as
             fast as alone within `stop_within_s`; one that runs on keeps it
             waiting. Inferred, not counted: the verdict says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio

from services.client.openai_stream import StreamResult
from streamlab.experiments.check.metrics import RunningGauge, find_running_gauge, read_gauge
from streamlab.experiments.check.registry import Session, check
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import JSON, Check, Figure, Report

STORY = "a client that leaves stops its generation"
POLL_S = 0.1
# How long the gauge may take to drain earlier work before this check starts:
# the checks before it leave streams behind (an idle cut closes the client's
# side; the server notices at its next write), and a gauge still counting one
# of them would hide this check's own stream.
SETTLE_S = 5.0
# Timing: a fresh stream is slowed when its first token takes this many times
# as long as alone, and at least this much longer.
SLOWED_RATIO, SLOWED_EXTRA_S = 3.0, 0.5
LEAVER_TOKENS = 3  # tokens a long stream shows before the control is taken
FIX = ("cancel the generation when the connection closes (abort the request on "
       "disconnect; watch for it between tokens, not only at the next write)")


async def running_gauge(session: Session) -> tuple[RunningGauge | None, str]:
    """The running gauge, found once per run (the slow-reader check reads it too)."""
    async def make() -> tuple[RunningGauge | None, str]:
        return await find_running_gauge(session.client, session.target)
    found: tuple[RunningGauge | None, str] = await session.once("running-gauge", make)
    return found


async def settled(session: Session, source: RunningGauge, first: float) -> float:
    """The gauge once earlier work has drained: 0 as soon as it reads 0, else the
    lowest value seen within SETTLE_S (a busy server may never be idle)."""
    lowest, deadline = first, time.monotonic() + SETTLE_S
    while lowest > 0 and time.monotonic() < deadline:
        await anyio.sleep(POLL_S)
        value = await read_gauge(session.client, source)
        if value is not None:
            lowest = min(lowest, value)
    return lowest


def long_body(target: CheckTarget) -> dict[str, JSON]:
    """An answer long past stop_within_s: --answer-tokens, 20 ms apart on a lab gateway."""
    tokens = target.answer_tokens
    return target.body(f"Count from 1 to {tokens}, one number per line.", max_tokens=tokens,
                       lab={"prefill_ms": 0, "token_gap_ms": 20, "answer_tokens": tokens})


@check("cancel", STORY, headline=("observed_by", "stopped_after_s"),
       budget_s=lambda target: 3 * target.stream_deadline_s + 30.0)
async def client_leaves(session: Session) -> Report:
    source, why = await running_gauge(session)
    if source is None:
        return await by_timing(session, why)
    return await by_metrics(session, source)


async def by_metrics(session: Session, source: RunningGauge) -> Report:
    client, target = session.client, session.target
    now = await read_gauge(client, source)
    before = await settled(session, source, now or 0.0)
    during: float | None = None

    async def sample() -> None:  # while the stream is open: it must count it
        nonlocal during
        during = await read_gauge(client, source)

    record = await session.stream(long_body(target), stop_after_tokens=3, before_leaving=sample)
    left_at = time.monotonic()
    after, stopped_s = during, None
    while time.monotonic() - left_at < target.stop_within_s + 1.0:
        after = await read_gauge(client, source)
        if after is not None and after <= before:
            stopped_s = time.monotonic() - left_at
            break
        await anyio.sleep(POLL_S)
    figures: dict[str, Figure] = {
        "observed_by": f"metrics ({source.name})", "gauge": source.name,
        "metrics_url": source.url, "metrics_found": source.found,
        "running_before": before, "running_at_leave": during,
        "running_after": after, "stopped_after_s": stopped_s,
        "stop_within_s": target.stop_within_s, "tokens_read": record.token_chunks}
    if not record.closed_early:
        return not_applicable("cancel", STORY, f"the stream ended before 3 tokens (status "
                              f"{record.status}{', ' + record.error_text if record.error else ''}"
                              "): nothing to leave", figures)
    if during is None or during <= before:
        return not_applicable("cancel", STORY, f"not observable: {source.name} at "
                              f"{source.url} did not count the stream (is it this server's?)",
                              figures)
    return judged("cancel", STORY, figures, (
        Check("stopped_after_s", "<=", target.stop_within_s,
              f"{source.name} stayed up after the client left: the generation runs on for "
              "nobody; " + FIX),
    ))


@dataclass
class Probe:
    ttft_s: float | None  # None: no token within the limit (or refused)
    status: int


async def probe(session: Session, limit_s: float) -> Probe:
    """A fresh short stream's time to its first token, given up (left) at `limit_s`."""
    body = session.target.body("Say hello.", max_tokens=8,
                               lab={"prefill_ms": 0, "token_gap_ms": 5, "answer_tokens": 4})
    record = StreamResult()
    with anyio.move_on_after(limit_s):
        record = await session.stream(body, stop_after_tokens=1)
    ttft = record.first_token_s if record.status == 200 else None
    return Probe(ttft if ttft is not None and ttft <= limit_s else None, record.status)


async def by_timing(session: Session, no_metrics: str) -> Report:
    target = session.target
    figures: dict[str, Figure] = {"observed_by": "timing (no running gauge)",
                                  "no_metrics": no_metrics, "leave_streams": target.leave_streams,
                                  "stop_within_s": target.stop_within_s}
    alone = await probe(session, target.stream_deadline_s)
    figures["ttft_alone_s"] = alone.ttft_s
    if alone.ttft_s is None:
        return not_applicable("cancel", STORY, f"a short request got no token (status "
                              f"{alone.status}): no baseline to compare; {no_metrics}", figures)
    slowed = max(SLOWED_RATIO * alone.ttft_s, alone.ttft_s + SLOWED_EXTRA_S)
    figures["slowed_above_s"] = slowed
    counts = [0] * target.leave_streams
    first_at: list[float | None] = [None] * target.leave_streams
    ended = [False] * target.leave_streams
    shown = anyio.Event()  # a long stream has shown LEAVER_TOKENS, or every one ended

    async def read_long(i: int) -> None:
        def seen(_: str) -> None:
            counts[i] += 1
            if first_at[i] is None:
                first_at[i] = time.monotonic()
            if counts[i] >= LEAVER_TOKENS:
                shown.set()
        await session.stream(long_body(target), on_token=seen)
        ended[i] = True
        if all(ended):
            shown.set()

    async with anyio.create_task_group() as leavers:
        for i in range(target.leave_streams):
            leavers.start_soon(read_long, i)
        with anyio.move_on_after(target.stream_deadline_s / 2):
            await shown.wait()
        control = await probe(session, 2 * slowed) if max(counts) >= LEAVER_TOKENS else None
        still_running = not all(ended)
        leavers.cancel_scope.cancel()  # the K clients leave, closing their connections
    left_at = time.monotonic()
    rates = [counts[i] / max(left_at - at, 1e-3) for i, at in enumerate(first_at) if at]
    figures |= {"ttft_beside_s": control.ttft_s if control else None,
                "tokens_before_leaving": sum(counts),
                "leaver_rate_tps": max(rates) if rates else None}
    if control is None:
        return not_applicable("cancel", STORY, f"the long requests showed no {LEAVER_TOKENS} "
                              f"tokens within {target.stream_deadline_s / 2:g} s; {no_metrics}",
                              figures)
    if not still_running:
        return not_applicable("cancel", STORY, "a long answer ended before the clients left: "
                              "nothing to leave (a larger --answer-tokens, or --extra-body "
                              "'{\"ignore_eos\": true}')", figures)
    if control.ttft_s is not None and control.ttft_s <= slowed:
        return not_applicable("cancel", STORY, (
            f"not observable by timing: a fresh stream beside {target.leave_streams} running "
            f"ones got its first token in {control.ttft_s:.3g} s (alone {alone.ttft_s:.3g} s): "
            "the server has slots to spare, so generations left running cannot be felt; "
            f"{no_metrics}, or raise --leave-streams past its slots"), figures)
    freed_s: float | None = None
    tries = 0
    while (since := time.monotonic() - left_at) <= target.stop_within_s:
        tries += 1
        after = await probe(session, slowed)
        if after.ttft_s is not None:
            freed_s = since + after.ttft_s
            break
    runs_on_s = ((target.answer_tokens - max(counts)) / max(rates)) if rates else None
    figures |= {"stopped_after_s": freed_s, "probes_after": tries,
                "leftover_would_end_s": runs_on_s, "confidence": "inferred from timing"}
    if freed_s is not None and runs_on_s is not None and runs_on_s <= freed_s:
        return not_applicable("cancel", STORY, f"the long answers would have ended by "
                              f"themselves in {runs_on_s:.3g} s, before the fresh stream was "
                              "served: cannot tell a stop from an end (a larger "
                              "--answer-tokens)", figures)
    return judged("cancel", STORY, figures, (
        Check("stopped_after_s", "<=", target.stop_within_s,
              f"a fresh stream still waited (past {slowed:.3g} s for its first token) "
              f"{target.stop_within_s:g} s after {target.leave_streams} clients left, as it "
              "did beside them: their generations run on for nobody (inferred by timing, no "
              "running gauge); " + FIX),
    ))
