"""Timing: the time constants every measurement of the lab runs with.

The fake model's pace (prefill, gap between tokens, answer length) plus the
scenarios' clocks (idle timeouts, think pause, heartbeat, watchdog, slack),
scaled down so a run takes seconds (2 s stands in for a proxy's 60 s). The
scenarios take the defaults; a bench picks its own model pace with
`Timing(prefill_ms=1, gap_ms=50, tokens=50)`. `fake_model()` is the same pace
in the request's own names (the `streamlab` body field and the gRPC message).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict


class FakeModelPace(TypedDict):
    """The fake model's pace, in the request's names."""

    prefill_ms: int
    token_gap_ms: int
    answer_tokens: int


@dataclass(frozen=True)
class Timing:
    prefill_ms: int = 300
    gap_ms: int = 50
    tokens: int = 20
    idle_timeout_s: float = 2.0  # nginx /short-timeout/ proxy_read_timeout (the lab's own)
    think_s: float = 4.0  # a think pause longer than the idle timeout
    heartbeat_s: float = 0.5  # `: ping` interval when a scenario turns pings on
    watchdog_s: float = 1.0  # the client's read timeout when it has a watchdog
    tolerance_s: float = 0.4  # slack for a shared, busy machine
    # Live streams in the reconnect-storm scenario (500 at full size; the
    # suite runs fewer on a shared CI machine).
    storm_streams: int = 500
    # `scenario run --streams N`: the storm scenarios' stream count instead of
    # their own (owner-killed-storm runs 150 in the catalogue, 500 on request).
    streams: int | None = None
    # How long each end's gRPC keepalive takes to call a silent engine hop dead:
    # ping interval + ping timeout. The gateway finds a dead engine (defaults
    # 10 + 5 s); the engine finds a dead gateway and cancels its calls (20 + 5 s).
    engine_dead_after_s: float = 15.0
    gateway_dead_after_s: float = 25.0
    # The share of a load scenario's full size to run (its streams: 200 for
    # rolling-deploy); the test suite runs them scaled down.
    load_scale: float = 1.0

    @property
    def prefill_s(self) -> float:
        return self.prefill_ms / 1000

    @property
    def gap_s(self) -> float:
        return self.gap_ms / 1000

    @property
    def model_ttft_s(self) -> float:
        """When the fake model emits its first token: prefill, then one gap."""
        return self.prefill_s + self.gap_s

    @property
    def model_total_s(self) -> float:
        return self.prefill_s + self.tokens * self.gap_s

    def model_token_times_s(self) -> list[float]:
        """When the fake model makes each token (services/engine/backends/fake.py)."""
        return [self.prefill_s + (i + 1) * self.gap_s for i in range(self.tokens)]

    def fake_model(self) -> FakeModelPace:
        """The model's pace as a request asks for it (chat_body's and
        generate_request's keyword arguments, the `/ws` message's `streamlab`)."""
        return {"prefill_ms": self.prefill_ms, "token_gap_ms": self.gap_ms,
                "answer_tokens": self.tokens}
