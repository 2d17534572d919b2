"""Time to first byte vs time to first token: a server (or a proxy in front of
it) that holds the response until the model has produced something is a
buffering one. The client sees nothing, not even the headers, through the
whole prefill: no progress, no heartbeat, and an idle-cutting hop on the way
cuts a long prefill. A server that sends its tokens in one write at the end
looks the same from the client: one read with every token in it.

Judged only on what can tell: headers held is a claim about a silence, so it
needs one (a first token later than MIN_SILENCE_S); tokens in one read needs
enough tokens to have arrived apart.
"""

from __future__ import annotations

from streamlab.experiments.check.registry import Session, check, streams_budget
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import Check, Report

MIN_SILENCE_S = 0.3  # a first token sooner than this cannot show held headers
MIN_TOKENS = 5  # fewer tokens may fairly come in one read
PREFILL_MS = 1000  # on a lab gateway: the silence to ask for
STORY = "headers before the first token, tokens as they are made"


@check("first-byte", STORY, headline=("ttfb_s", "ttft_s"), budget_s=streams_budget())
async def first_byte(session: Session) -> Report:
    target = session.target
    body = target.body("Write one sentence about rivers, then stop.", max_tokens=32,
                       lab={"prefill_ms": PREFILL_MS, "token_gap_ms": 20, "answer_tokens": 20})
    record = await session.stream(body)
    ttfb, ttft = record.headers_s, record.first_token_s
    figures = {"ttfb_s": ttfb, "ttft_s": ttft, "tokens": record.token_chunks,
               "token_reads": len(record.token_reads),
               "headers_held": (ttfb is not None and ttft is not None
                                and ttfb >= 0.8 * ttft)}
    if record.status != 200 or ttft is None:
        return not_applicable("first-byte", STORY, f"no token came back (status "
                              f"{record.status}{', ' + record.error_text if record.error else ''})",
                              figures)
    checks = []
    if ttft >= MIN_SILENCE_S:
        checks.append(Check("headers_held", "==", False,
                            "the headers waited for the first token: a buffering server or "
                            "proxy (nginx: proxy_buffering off / X-Accel-Buffering: no; "
                            "send the headers, or a first empty chunk, at once)"))
    if record.token_chunks >= MIN_TOKENS:
        checks.append(Check("token_reads", ">=", 2,
                            "every token came in one read: the answer was buffered and sent "
                            "at the end; flush each chunk as it is made (no gzip or "
                            "response buffering on SSE)"))
    if not checks:
        return not_applicable("first-byte", STORY, f"the first token came at {ttft:.3g} s with "
                              f"{record.token_chunks} tokens: too soon and too few to tell "
                              "(needs a silence: a longer prompt)", figures)
    return judged("first-byte", STORY, figures, checks)
