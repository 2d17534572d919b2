"""Silent readers side by side: what N clients that never read cost the gateway,
with the direct relay (bounded) and the detached one (the classic anti-pattern).

Each client sends a streaming request straight to the gateway and never reads
(services/client/silent.py); the engine floods (no gap between tokens). While
they sit there, the gateway's RSS and the engine's per-request counters are
sampled until every generation has ended: paused by flow control and then
cut by the send timeout (direct), or run to the end into an unbounded queue
(detached). Both relays run in one process, one after the other, so their
ratio is measured on the same machine at the same time of day.

Needs a lab with the `pids` capability (streamlab/lab/target.py): the gateway's
RSS is read by pid, so a local-process lab (a compose lab's gateway is in a
container).
"""

from __future__ import annotations

import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from services.client.openai_stream import chat_body
from services.client.silent import open_silent_reader
from streamlab.errors import StreamlabError
from streamlab.experiments.generation_end import state_name
from streamlab.experiments.report import Figures, Report, Table
from streamlab.lab.target import Capability, LabTarget, pids_of, require
from streamlab_protocol.engine.v1 import engine_pb2 as pb

RELAYS = ("direct", "detached_unbounded")
SAMPLE_EVERY_S = 0.2
# Every request reaches the engine within this long, or the run stops and says
# why (a refused request answers at once; waiting the whole timeout would hide it).
START_WITHIN_S = 10.0


class ReadersRefused(StreamlabError, RuntimeError):
    """Some requests never reached the engine; the message quotes an answer."""


@dataclass
class ReadersRun:
    relay: str
    clients: int
    answer_tokens: int
    base_rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    end_rss_mb: float = 0.0
    tokens_generated: int = 0
    states: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    timed_out: bool = False
    # (seconds since the first request, gateway RSS MiB, tokens generated so far)
    samples: list[tuple[float, float, int]] = field(default_factory=list)

    @property
    def growth_mb(self) -> float:
        return self.peak_rss_mb - self.base_rss_mb

    @property
    def share_generated(self) -> float:
        return self.tokens_generated / (self.clients * self.answer_tokens)

    def report(self) -> Report:
        figures: Figures = {
            "relay": self.relay, "clients": self.clients, "answer_tokens": self.answer_tokens,
            "base_rss_mb": round(self.base_rss_mb, 1), "peak_rss_mb": round(self.peak_rss_mb, 1),
            "end_rss_mb": round(self.end_rss_mb, 1), "growth_mb": round(self.growth_mb, 1),
            "tokens_generated": self.tokens_generated,
            "share_generated": round(self.share_generated, 3),
            **{f"engine_{state}": n for state, n in sorted(self.states.items())},
            "seconds": round(self.seconds, 1), "timed_out": self.timed_out}
        return Report("bench slow-readers", self.relay, figures=figures)


def _mb(process: psutil.Process) -> float:
    return float(process.memory_info().rss) / 2**20


def _peek(sock: socket.socket) -> str:
    """The start of what the gateway answered, without reading it (MSG_PEEK
    leaves it in the buffer, so the reader stays silent)."""
    try:
        sock.settimeout(0.5)
        return sock.recv(400, socket.MSG_PEEK).decode(errors="replace")
    except OSError as exc:
        return f"(nothing: {exc})"


def measure(lab: LabTarget, relay: str, clients: int, answer_tokens: int, timeout_s: float = 240.0,
            on_sample: Callable[[ReadersRun], None] = lambda run: None) -> ReadersRun:
    """Open `clients` silent readers, sample until every generation has ended
    (or `timeout_s`), close them, and say what it cost."""
    gateway = psutil.Process(pids_of(lab, "slow readers weigh the gateway's RSS")["gateway"])
    run = ReadersRun(relay, clients, answer_tokens)
    run.base_rss_mb = run.peak_rss_mb = _mb(gateway)
    body = chat_body("flood", prefill_ms=0, token_gap_ms=0, answer_tokens=answer_tokens,
                     max_tokens=answer_tokens, relay=relay)
    tag = uuid.uuid4().hex[:6]
    ids = [f"readers-{relay}-{tag}-{i}" for i in range(clients)]
    wanted = set(ids)
    started = time.monotonic()
    socks = []
    try:
        for rid in ids:
            socks.append(open_silent_reader(lab.ports.host, lab.ports.gateway_port,
                                            "/v1/chat/completions", body,
                                            headers={"X-Request-Id": rid}))
        deadline = started + timeout_s
        while True:
            # One GetStats for all of them (the engine keeps the recent records).
            records = [r for r in lab.engine_stats().generations if r.request_id in wanted]
            rss = _mb(gateway)
            run.peak_rss_mb = max(run.peak_rss_mb, rss)
            run.tokens_generated = sum(r.tokens_generated for r in records)
            run.samples.append((time.monotonic() - started, rss, run.tokens_generated))
            on_sample(run)
            if len(records) == clients and all(
                    r.state != pb.GENERATION_STATE_RUNNING for r in records):
                break
            if len(records) < clients and time.monotonic() > started + START_WITHIN_S:
                seen = {r.request_id for r in records}
                missing = [sock for rid, sock in zip(ids, socks, strict=True) if rid not in seen]
                raise ReadersRefused(f"{len(missing)} of {clients} requests never reached the "
                                     f"engine; one was answered: {_peek(missing[0])!r}")
            if time.monotonic() > deadline:
                run.timed_out = True
                break
            time.sleep(SAMPLE_EVERY_S)
        run.states = Counter(state_name(r) for r in records)
    finally:
        for sock in socks:
            sock.close()
    run.seconds = time.monotonic() - started
    run.end_rss_mb = _mb(gateway)
    return run


RUN_COLUMNS = ("relay", "gateway RSS before MiB", "peak MiB", "peak growth MiB",
               "tokens generated", "of all asked", "engine states", "took s", "timed out")
SAMPLE_COLUMNS = ("relay", "s", "gateway RSS MiB", "tokens generated")


# The gateway's RSS by pid, and the engine's records of the readers' generations.
NEEDS = frozenset({Capability.PIDS, Capability.ENGINE_RECORD})


def compare(lab: LabTarget, clients: int, answer_tokens: int, timeout_s: float = 240.0,
            on_sample: Callable[[ReadersRun], None] = lambda run: None) -> Report:
    """Both relays, one after the other: a part and a row each, their samples (a
    table, for the plot) and how much more the detached one cost (readers_report).
    MissingCapability before any reader starts on a target without NEEDS."""
    require(lab, NEEDS, "bench slow-readers")
    return readers_report([measure(lab, relay, clients, answer_tokens, timeout_s, on_sample)
                           for relay in RELAYS], clients, answer_tokens)


def readers_report(runs: list[ReadersRun], clients: int, answer_tokens: int) -> Report:
    direct, detached = runs
    figures: Figures = {
        "clients": clients, "answer_tokens": answer_tokens,
        # Side by side, same run: how much more the anti-pattern costs.
        "growth_ratio": round(detached.growth_mb / max(direct.growth_mb, 0.1), 1),
        "tokens_ratio": round(detached.tokens_generated / max(direct.tokens_generated, 1), 1)}
    rows = tuple((r.relay, round(r.base_rss_mb), round(r.peak_rss_mb), round(r.growth_mb, 1),
                  r.tokens_generated, round(r.share_generated, 3),
                  ", ".join(f"{k} {v}" for k, v in sorted(r.states.items())),
                  round(r.seconds), r.timed_out) for r in runs)
    samples = tuple((r.relay, round(t, 2), round(mb, 1), n) for r in runs
                    for t, mb, n in r.samples)
    return Report(
        "bench slow-readers", story=f"{clients} silent readers, {answer_tokens} tokens asked "
        "each: the detached relay generates for nobody and holds it in memory",
        figures=figures,
        tables=(Table("runs", RUN_COLUMNS, rows,
                      caption=f"detached / direct: {figures['growth_ratio']}x the memory, "
                              f"{figures['tokens_ratio']}x the tokens"),
                Table("samples", SAMPLE_COLUMNS, samples,
                      caption="the gateway's RSS and the tokens generated over time")),
        parts=tuple(r.report() for r in runs))
