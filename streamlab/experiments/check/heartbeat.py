"""Heartbeat: bytes keep coming through a long silence before the first token.

Every hop on the way (nginx's proxy_read_timeout, a cloud load balancer's idle
timeout, a corporate proxy) cuts a connection that carries nothing for its idle
timeout. A streaming server that thinks for longer than that before its first
token must send something meanwhile: SSE comments (`: ping`) or empty chunks.

    heartbeat  the longest stretch with no byte, from the request to the first
               token, is shorter than the idle cut (`--idle-cut-s`)
    idle-cut   the same request through the check's own idle-cutting hop
               (hop.idle_cut_relay in front of the Toxiproxy hop) reaches
               `data: [DONE]`

Both need a silence longer than the idle cut (target.Needs.SILENCE): on a
streamlab gateway the request asks for one (`streamlab.prefill_ms`); elsewhere
a long prompt is the only lever, and a server that answers sooner than the idle
cut needs no heartbeat for it: n/a, not pass.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

from services.client.openai_stream import StreamResult, stream_chat
from streamlab.experiments.check.hop import idle_cut_relay
from streamlab.experiments.check.target import CheckTarget, Needs
from streamlab.experiments.check.verdict import judged, not_applicable
from streamlab.experiments.report import JSON, Check, Report

LONG_PROMPT_WORDS = 3000
FIX = ("send `: ping` comments (or empty chunks) every few seconds from the moment the "
       "headers go out, well inside every hop's idle timeout")


def silence_body(target: CheckTarget) -> dict[str, JSON]:
    prompt = ("Summarise the following notes in one sentence. "
              + " ".join(f"note{i % 97}" for i in range(LONG_PROMPT_WORDS)))
    return target.body(prompt, max_tokens=8, lab={
        "prefill_ms": int(target.silence_s * 1000), "token_gap_ms": 10, "answer_tokens": 5})


def _too_short(record: StreamResult, target: CheckTarget) -> str | None:
    """Why this record cannot judge a heartbeat, or None when it can."""
    if record.status != 200 or record.first_token_s is None:
        return (f"no token came back (status {record.status}"
                f"{', ' + record.error_text if record.error else ''})")
    if record.first_token_s < target.idle_cut_s:
        lever = "the lab's prefill_ms" if target.lab_knobs else "a long prompt"
        return (f"needs {Needs.SILENCE}: the first token came at {record.first_token_s:.3g} s, "
                f"sooner than the idle cut ({target.idle_cut_s:g} s), though {lever} asked "
                "for a longer wait: nothing to keep alive")
    return None


async def heartbeat(client: httpx.AsyncClient, target: CheckTarget
                    ) -> tuple[Report, StreamResult]:
    record = await stream_chat(client, target.chat_url, silence_body(target),
                               headers=target.headers())
    story = "bytes through a long silence before the first token"
    figures = {"ttft_s": record.first_token_s, "longest_silence_s": record.longest_silence_s,
               "comments": record.comments,
               "bytes_before_first_token": record.bytes_before_first_token,
               "idle_cut_s": target.idle_cut_s}
    why = _too_short(record, target)
    if why is not None:
        return not_applicable("heartbeat", story, why, figures), record
    return judged("heartbeat", story, figures, (
        Check("longest_silence_s", "<", target.idle_cut_s, FIX),
    )), record


async def idle_cut(client: httpx.AsyncClient, target: CheckTarget, direct: StreamResult
                   ) -> Report:
    """Through an idle-cutting relay in front of `target` (the Toxiproxy hop)."""
    story = f"a stream survives a hop that cuts {target.idle_cut_s:g} s of silence"
    why = _too_short(direct, target)
    if why is not None:
        return not_applicable("idle-cut", story, why)
    if not target.plain_http:
        return not_applicable("idle-cut", story, "the idle-cutting hop relays plain http only")
    parts = urlsplit(target.base_url)
    async with idle_cut_relay(parts.hostname or "", target.port, target.idle_cut_s) as port:
        cut_target = target.via("127.0.0.1", port)
        record = await stream_chat(client, cut_target.chat_url, silence_body(cut_target),
                                   headers=cut_target.headers())
    figures = {"reached_done": record.done, "tokens": record.token_chunks,
               "transport_error": record.error_text or None, "idle_cut_s": target.idle_cut_s}
    return judged("idle-cut", story, figures, (
        Check("reached_done", "==", True, "the hop cut the stream in its silence: " + FIX),
    ))
