"""Concurrency: N streams at once keep the cadence one stream has alone.

A server that serves one stream smoothly may stall its streams in turns when
several run at once (a batch that blocks on its slowest member, an event loop
doing work between writes, a proxy's buffer shared by all). The same request
is read first alone, then N times at once; each stream's gaps between reads
that carried tokens are pooled. A stall is a tail under concurrency that the
lone stream does not have: the N streams' p99 must stay within a multiple of
their typical gap (p50), under a floor no reader notices, or within what the
lone stream itself showed (a model that pauses to think mid-answer pauses
alone too: that is no concurrency stall, and the heartbeat check judges it).
"""

from __future__ import annotations

import statistics

import anyio

from services.client.openai_stream import StreamResult
from streamlab.experiments.check.registry import Session, check
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import Check, Figure, Report

TAIL_RATIO = 10.0  # p99 may be this many p50s ...
TAIL_FLOOR_S = 0.5  # ... or this long, whichever is more: a pause no reader minds ...
LONE_MARGIN = 1.5  # ... or this many times the lone stream's own longest gap
STORY = "streams at once keep the cadence one stream has alone"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@check("concurrency", STORY, headline=("streams", "gap_p50_s", "gap_p99_s", "lone_max_gap_s"),
       budget_s=lambda target: 2 * target.stream_deadline_s + 10.0)
async def cadence(session: Session) -> Report:
    target = session.target
    body = target.body("List twenty animals, one per line.", max_tokens=64,
                       lab={"prefill_ms": 50, "token_gap_ms": 20, "answer_tokens": 40})
    lone = await session.stream(body)
    records: list[StreamResult] = []

    async def one() -> None:
        records.append(await session.stream(body))

    async with anyio.create_task_group() as group:
        for _ in range(target.streams):
            group.start_soon(one)
    gaps = [gap for record in records for gap in record.gaps()]
    lone_gaps = lone.gaps()
    done = sum(record.done for record in records)
    figures: dict[str, Figure] = {
        "streams": target.streams, "completed": done,
        "finished": sum(bool(record.finish_reason) for record in records),
        "statuses": ",".join(sorted({str(r.status) for r in records})),
        "gaps": len(gaps), "lone_done": lone.done,
        "lone_max_gap_s": max(lone_gaps) if lone_gaps else None}
    if not lone.done:
        return not_applicable("concurrency", STORY, "the lone stream did not complete "
                              f"({lone.error_text or lone.status}): no cadence to compare",
                              figures)
    if len(gaps) < target.streams or not lone_gaps:
        return not_applicable("concurrency", STORY, f"too few tokens to time ({len(gaps)} gaps "
                              f"across {target.streams} streams, {len(lone_gaps)} alone)",
                              figures)
    p50, p99 = statistics.median(gaps), percentile(gaps, 0.99)
    limit = max(TAIL_RATIO * p50, TAIL_FLOOR_S, LONE_MARGIN * max(lone_gaps))
    figures |= {"gap_p50_s": p50, "gap_p99_s": p99, "gap_max_s": max(gaps),
                "p99_limit_s": limit}
    return judged("concurrency", STORY, figures, (
        Check("completed", "==", target.streams,
              "not every concurrent stream reached [DONE]: a concurrency limit should queue "
              "or answer 429, not cut streams"),
        Check("finished", "==", target.streams,
              "a concurrent stream reached [DONE] with no finish_reason: it was cut short "
              "(another request interrupted it?) and its reader cannot tell; queue a request "
              "for a free slot, or end the stream with a finish_reason or an error"),
        Check("gap_p99_s", "<=", limit,
              "streams stall in turns under concurrency, which one stream alone does not: "
              "look for blocking work between writes or a buffer shared by all streams"),
    ))
