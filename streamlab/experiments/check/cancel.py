"""The client leaves: the generation stops.

A server that keeps generating for a client that has gone burns the GPU for
nobody and holds a batch slot others wait for. From outside, only the server's
own metrics can show it: a gauge of generations running now, whose name is
known (target.KNOWN_RUNNING_GAUGES). The check reads it before a long stream,
during it (it must have risen: the gauge counts this server's work), and after
the client left, polling until it is back down or `stop_within_s` has passed.
Without a metrics URL, or with none of the known gauges in it, the check is
n/a: not observable.
"""

from __future__ import annotations

import time

import anyio
import httpx

from services.client.openai_stream import stream_chat
from streamlab.experiments.check.target import KNOWN_RUNNING_GAUGES, CheckTarget, Needs
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import Check, Figure, Report

STORY = "a client that leaves stops its generation"
POLL_S = 0.1
# How long the gauge may take to drain earlier work before this check starts:
# the checks before it leave streams behind (an idle cut closes the client's
# side; the server notices at its next write), and a gauge still counting one
# of them would hide this check's own stream.
SETTLE_S = 5.0


def gauge(text: str, name: str) -> float | None:
    """The sum of a metric's samples (every label set) in Prometheus text, or
    None when it is not there."""
    total, seen = 0.0, False
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        head, _, value = raw.rpartition(" ")
        metric = head.split("{", 1)[0].strip()
        if metric != name:
            continue
        try:
            total += float(value)
        except ValueError:
            continue
        seen = True
    return total if seen else None


async def read_gauge(client: httpx.AsyncClient, url: str, name: str) -> float | None:
    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None
    return gauge(response.text, name) if response.is_success else None


async def settled(client: httpx.AsyncClient, url: str, name: str, first: float) -> float:
    """The gauge once earlier work has drained: 0 as soon as it reads 0, else the
    lowest value seen within SETTLE_S (a busy server may never be idle)."""
    lowest, deadline = first, time.monotonic() + SETTLE_S
    while lowest > 0 and time.monotonic() < deadline:
        await anyio.sleep(POLL_S)
        value = await read_gauge(client, url, name)
        if value is not None:
            lowest = min(lowest, value)
    return lowest


async def running_gauge(client: httpx.AsyncClient, target: CheckTarget
                        ) -> tuple[str | None, float, str]:
    """The known running gauge the target's metrics have and its value now, or
    None and why it is not observable."""
    if target.metrics_url is None:
        return None, 0.0, (f"not observable: needs {Needs.METRICS} (--metrics-url, a Prometheus "
                      f"/metrics with one of {', '.join(KNOWN_RUNNING_GAUGES)})")
    try:
        text = (await client.get(target.metrics_url)).text
    except httpx.HTTPError as exc:
        return None, 0.0, (f"not observable: {target.metrics_url} did not answer "
                      f"({type(exc).__name__})")
    for name in KNOWN_RUNNING_GAUGES:
        value = gauge(text, name)
        if value is not None:
            return name, value, ""
    return None, 0.0, f"not observable: the metrics have none of {', '.join(KNOWN_RUNNING_GAUGES)}"


async def client_leaves(client: httpx.AsyncClient, target: CheckTarget) -> Report:
    name, now, why = await running_gauge(client, target)
    if name is None or target.metrics_url is None:
        return not_applicable("cancel", STORY, why)
    before = await settled(client, target.metrics_url, name, now)
    # 1,000 tokens 20 ms apart: 20 s, long past stop_within_s, and within what
    # servers allow (an engine chained to another lab gateway: its limit is 1,000).
    body = target.body("Count from 1 to 1000, one number per line.", max_tokens=1000,
                       lab={"prefill_ms": 0, "token_gap_ms": 20, "answer_tokens": 1000})
    metrics_url = target.metrics_url
    during: float | None = None

    async def sample() -> None:  # while the stream is open: it must count it
        nonlocal during
        during = await read_gauge(client, metrics_url, name)

    record = await stream_chat(client, target.chat_url, body, headers=target.headers(),
                               stop_after_tokens=3, before_leaving=sample)
    left_at = time.monotonic()
    after, stopped_s = during, None
    while time.monotonic() - left_at < target.stop_within_s + 1.0:
        after = await read_gauge(client, target.metrics_url, name)
        if after is not None and after <= before:
            stopped_s = time.monotonic() - left_at
            break
        await anyio.sleep(POLL_S)
    figures: dict[str, Figure] = {
        "gauge": name, "running_before": before, "running_at_leave": during,
        "running_after": after, "stopped_after_s": stopped_s,
        "stop_within_s": target.stop_within_s, "tokens_read": record.token_chunks}
    if not record.closed_early:
        return not_applicable("cancel", STORY, f"the stream ended before 3 tokens (status "
                              f"{record.status}): nothing to leave", figures)
    if during is None or during <= before:
        return not_applicable("cancel", STORY, f"not observable: {name} did not count the "
                              "stream (is the metrics URL this server's?)", figures)
    return judged("cancel", STORY, figures, (
        Check("stopped_after_s", "<=", target.stop_within_s,
              f"{name} stayed up after the client left: the generation runs on for nobody; "
              "cancel it when the connection closes (abort the request on disconnect)"),
    ))
