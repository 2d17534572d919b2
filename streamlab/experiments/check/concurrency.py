"""Concurrency: N streams at once keep their cadence.

A server that serves one stream smoothly may stall its streams in turns when
several run at once (a batch that blocks on its slowest member, an event loop
doing work between writes, a proxy's buffer shared by all). Each stream's gaps
between reads that carried tokens are pooled; the slow tail (p99) must stay
within a multiple of the typical gap (p50), or under a floor no reader notices.
"""

from __future__ import annotations

import statistics

import anyio
import httpx

from services.client.openai_stream import StreamResult, stream_chat
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import Check, Report

TAIL_RATIO = 10.0  # p99 may be this many p50s ...
TAIL_FLOOR_S = 0.5  # ... or this long, whichever is more: a pause no reader minds
STORY = "streams at once keep their cadence"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def cadence(client: httpx.AsyncClient, target: CheckTarget) -> Report:
    body = target.body("List twenty animals, one per line.", max_tokens=64,
                       lab={"prefill_ms": 50, "token_gap_ms": 20, "answer_tokens": 40})
    records: list[StreamResult] = []

    async def one() -> None:
        records.append(await stream_chat(client, target.chat_url, body,
                                         headers=target.headers()))

    async with anyio.create_task_group() as group:
        for _ in range(target.streams):
            group.start_soon(one)
    gaps = [gap for record in records for gap in record.gaps()]
    done = sum(record.done for record in records)
    figures: dict[str, float | int | str | None] = {
        "streams": target.streams, "completed": done,
        "statuses": ",".join(sorted({str(r.status) for r in records})),
        "gaps": len(gaps)}
    if len(gaps) < target.streams:
        return not_applicable("concurrency", STORY, f"too few tokens to time ({len(gaps)} gaps "
                              f"across {target.streams} streams)", figures)
    p50, p99 = statistics.median(gaps), percentile(gaps, 0.99)
    limit = max(TAIL_RATIO * p50, TAIL_FLOOR_S)
    figures |= {"gap_p50_s": p50, "gap_p99_s": p99, "gap_max_s": max(gaps), "p99_limit_s": limit}
    return judged("concurrency", STORY, figures, (
        Check("completed", "==", target.streams,
              "not every concurrent stream reached [DONE]: a concurrency limit should queue "
              "or answer 429, not cut streams"),
        Check("gap_p99_s", "<=", limit,
              "streams stall in turns under concurrency: look for blocking work between "
              "writes or a buffer shared by all streams"),
    ))
