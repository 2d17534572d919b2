"""The resume scenario as data: one stream cut mid-way, read two ways.

    broken  a client that does not resume (an OpenAI-style reader, or an
            EventSource against a server without ids): the cut loses every
            token from the cut on
    fixed   the resuming client (EventSource's rules: `retry:`, then
            Last-Event-ID): every token exactly once, the uncut run's text

The cut is Toxiproxy's `limit_data` on one hop (by default `edge`): the first
connection gets `cut_bytes` bytes and is closed; later ones run clean. Each
mode measures figures and checks them; `run()` says whether each mode came
out as it should (the broken one really broken, the fixed one really fixed).

Shaped like the scenario catalogue's entries (a measure, checks per mode), so
it can join `streamlab scenario run` as one entry.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from services.client.resume_stream import ResumeResult, create_stream, follow_stream
from streamlab.lab import Lab
from streamlab.toxiproxy import Toxic

Mode = Literal["broken", "fixed"]
Figure = int | float | bool | str | None


@dataclass(frozen=True)
class ResumeTiming:
    prefill_ms: int = 50
    gap_ms: int = 20
    tokens: int = 40
    retry_ms: int = 100
    hop: str = "edge"
    cut_bytes: int = 900  # a few tokens into the first response, mid-event


@dataclass(frozen=True)
class Check:
    figure: str
    op: str
    bound: Figure
    why: str

    def holds(self, figures: dict[str, Figure]) -> bool:
        ops: dict[str, Callable[[Any, Any], bool]] = {
            "==": operator.eq, ">=": operator.ge, ">": operator.gt, "<": operator.lt}
        try:
            return bool(ops[self.op](figures.get(self.figure), self.bound))
        except TypeError:
            return False

    def describe(self) -> str:
        return f"{self.figure} {self.op} {self.bound!r}"


EXPECT: dict[Mode, tuple[Check, ...]] = {
    "broken": (
        Check("cuts", ">=", 1, "the connection really was cut"),
        Check("missing", ">", 0, "without resume, everything after the cut is lost"),
        Check("text_equal", "==", False, "the text differs from the uncut run"),
    ),
    "fixed": (
        Check("cuts", ">=", 1, "the connection really was cut"),
        Check("connections", ">=", 2, "the client came back"),
        Check("missing", "==", 0, "no token lost"),
        Check("duplicates", "==", 0, "no token twice"),
        Check("text_equal", "==", True, "the same text as the uncut run"),
        Check("terminal", "==", "done", "the stream ended with its done event"),
    ),
}


def _body(timing: ResumeTiming) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "resume scenario"}],
            "streamlab": {"prefill_ms": timing.prefill_ms, "token_gap_ms": timing.gap_ms,
                          "answer_tokens": timing.tokens},
            "resume": {"retry_ms": timing.retry_ms}}


def figures_of(result: ResumeResult, reference: ResumeResult) -> dict[str, Figure]:
    counts = Counter(result.indexes)
    expected = set(reference.indexes)
    return {
        "tokens_expected": len(reference.tokens),
        "tokens_received": len(result.tokens),
        "missing": len(expected - set(counts)),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "in_order": result.indexes == sorted(result.indexes),
        "text_equal": result.text == reference.text,
        "connections": len(result.connections),
        "cuts": sum(1 for c in result.connections if c.ended in ("transport", "eof")),
        "resumed_from": next((c.sent_last_event_id for c in result.connections
                              if c.sent_last_event_id), None),
        "gap_events": len(result.gaps),
        "terminal": result.terminal,
    }


async def measure(lab: Lab, mode: Mode, timing: ResumeTiming) -> dict[str, Figure]:
    toxiproxy = lab.toxiproxy()
    # A new connection per request: the toxic's byte count starts at the response.
    limits = httpx.Limits(max_keepalive_connections=0)
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0),
                                     limits=limits) as client:
            toxiproxy.reset()
            reference = await follow_stream(client, lab.edge_url,
                                            await create_stream(client, lab.edge_url,
                                                                _body(timing)))

            async def cut_first(attempt: int) -> None:
                toxiproxy.reset()
                if attempt == 0:
                    toxiproxy.add_toxic(timing.hop,
                                        Toxic("limit_data", {"bytes": timing.cut_bytes}))

            created = await create_stream(client, lab.edge_url, _body(timing))
            result = await follow_stream(client, lab.edge_url, created,
                                         resume=mode == "fixed", before_connect=cut_first,
                                         default_retry_ms=timing.retry_ms)
    finally:
        toxiproxy.reset()
        toxiproxy.close()
    return figures_of(result, reference)


@dataclass(frozen=True)
class Outcome:
    mode: Mode
    figures: dict[str, Figure]
    checks: tuple[tuple[Check, bool], ...]

    @property
    def as_expected(self) -> bool:
        return all(ok for _, ok in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "as_expected": self.as_expected, "figures": self.figures,
                "checks": [{"check": c.describe(), "why": c.why, "holds": ok}
                           for c, ok in self.checks]}


async def run(lab: Lab, modes: tuple[Mode, ...], timing: ResumeTiming) -> list[Outcome]:
    outcomes = []
    for mode in modes:
        figures = await measure(lab, mode, timing)
        checks = tuple((check, check.holds(figures)) for check in EXPECT[mode])
        outcomes.append(Outcome(mode, figures, checks))
    return outcomes
