"""Heartbeat: bytes keep coming through every long silence of an answer.

Every hop on the way (nginx's proxy_read_timeout, a cloud load balancer's idle
timeout, a corporate proxy) cuts a connection that carries nothing for its idle
timeout. A server that makes its reader wait longer than that for a token, be
it before the first (a long prefill, a queue) or between two (a reasoning model
that hides its thinking, a tool call being composed, a request preempted when
the KV cache fills), must send something meanwhile: SSE comments (`: ping`) or
empty chunks.

    heartbeat  the longest stretch with no byte over the whole answer, from the
               request to its end, is shorter than the idle cut (`--idle-cut-s`)
    idle-cut   the same request through the check's own idle-cutting hop
               (hop.idle_cut_relay, which cuts any silence longer than the cut,
               wherever it falls) reaches `data: [DONE]`

Both need a wait for a token longer than the idle cut (target.Needs.SILENCE):
on a streamlab gateway the request asks for one (`streamlab.prefill_ms`);
elsewhere a long prompt (`--prompt-words`) is the lever, and a server that
never made its reader wait that long needs no heartbeat for it: n/a, not pass.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from services.client.openai_stream import StreamResult
from streamlab.experiments.check.hop import idle_cut_relay
from streamlab.experiments.check.registry import Session, check, streams_budget
from streamlab.experiments.check.target import CheckTarget, Needs
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import JSON, Check, Figure, Report

FIX = ("send `: ping` comments (or empty chunks) every few seconds from the moment the "
       "headers go out until the last token, through every pause, well inside every hop's "
       "idle timeout")
HEARTBEAT = "bytes through every long silence of the answer"


def silence_body(target: CheckTarget) -> dict[str, JSON]:
    return target.body(target.long_prompt("Summarise the following notes in one sentence."),
                       max_tokens=32, lab={"prefill_ms": int(target.silence_s * 1000),
                                           "token_gap_ms": 10, "answer_tokens": 5})


def where(record: StreamResult, at: float) -> str:
    """Where a silence that started at `at` fell: before the first token or after token N."""
    before = sum(t <= at for t in record.token_reads)
    return "before the first token" if before == 0 else f"after token read {before}"


def silence_figures(record: StreamResult, target: CheckTarget) -> dict[str, Figure]:
    gap = record.longest_byte_gap
    wait = record.longest_wait_for_token
    return {"ttft_s": record.first_token_s,
            "longest_silence_s": gap[0] if gap else None,
            "silence_at_s": gap[1] if gap else None,
            "silence_where": where(record, gap[1]) if gap else None,
            "longest_wait_s": wait[0] if wait else None,
            "wait_where": where(record, wait[1]) if wait else None,
            "comments": record.comments, "tokens": record.token_chunks,
            "idle_cut_s": target.idle_cut_s}


def no_silence(record: StreamResult, target: CheckTarget) -> str | None:
    """Why this record cannot judge a heartbeat, or None when it can."""
    wait = record.longest_wait_for_token
    if record.status != 200 or wait is None:
        return (f"no token came back (status {record.status}"
                f"{', ' + record.error_text if record.error else ''})")
    if wait[0] < target.idle_cut_s:
        lever = ("the lab's prefill_ms" if target.lab_knobs
                 else f"a {target.prompt_words}-word prompt")
        return (f"needs {Needs.SILENCE}: the longest wait for a token was {wait[0]:.3g} s "
                f"({where(record, wait[1])}), shorter than the idle cut "
                f"({target.idle_cut_s:g} s), though {lever} asked for a long one: nothing to "
                "keep alive (a longer --prompt-words, or a shorter --idle-cut-s, makes one)")
    return None


async def silence(session: Session) -> StreamResult:
    """The long-prompt request read whole, made once for both checks."""
    async def make() -> StreamResult:
        return await session.stream(silence_body(session.target))
    record: StreamResult = await session.once("silence", make)
    return record


@check("heartbeat", HEARTBEAT, headline=("longest_silence_s", "comments"),
       budget_s=streams_budget())
async def heartbeat(session: Session) -> Report:
    target = session.target
    record = await silence(session)
    figures = silence_figures(record, target)
    why = no_silence(record, target)
    if why is not None:
        return not_applicable("heartbeat", HEARTBEAT, why, figures)
    return judged("heartbeat", HEARTBEAT, figures, (
        Check("longest_silence_s", "<", target.idle_cut_s,
              f"no byte for that long ({figures['silence_where']}): " + FIX),
    ))


@check("idle-cut", "a stream survives a hop that cuts a silence", headline=("reached_done",),
       budget_s=streams_budget(2))
async def idle_cut(session: Session) -> Report:
    """Through an idle-cutting relay in front of `target` (the Toxiproxy hop)."""
    target = session.target
    story = f"a stream survives a hop that cuts {target.idle_cut_s:g} s of silence"
    why = no_silence(await silence(session), target)
    if why is not None:
        return not_applicable("idle-cut", story, why)
    if not target.plain_http:
        return not_applicable("idle-cut", story, "the idle-cutting hop relays plain http only")
    parts = urlsplit(target.base_url)
    async with idle_cut_relay(parts.hostname or "", target.port, target.idle_cut_s) as port:
        cut_target = target.via("127.0.0.1", port)
        record = await session.stream(silence_body(cut_target), target=cut_target)
    gap = record.longest_byte_gap
    wait = record.longest_wait_for_token
    if record.done and (wait is None or wait[0] < target.idle_cut_s):
        return not_applicable("idle-cut", story, (
            f"the request through the hop did not wait as long for a token "
            f"({wait[0] if wait else 0:.3g} s, shorter than the idle cut): nothing to cut "
            "(a server that cached the prompt, or a silence it has only sometimes)"))
    figures: dict[str, Figure] = {
        "reached_done": record.done, "tokens": record.token_chunks,
        "cut_at_s": record.total_s if not record.done else None,
        "cut_where": (None if record.done else "before the headers" if gap is None
                      else where(record, gap[1])),
        "transport_error": record.error_text or None, "idle_cut_s": target.idle_cut_s}
    return judged("idle-cut", story, figures, (
        Check("reached_done", "==", True, "the hop cut the stream in its silence: " + FIX),
    ))
