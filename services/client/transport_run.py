"""One measured run of one transport, in the same terms for all of them.

Definitions follow LLM benchmarking practice (AIPerf/GenAI-Perf): TTFT is from
the start of the first request to the first non-empty token; inter-chunk
latency is the gap between consecutive token arrivals as the client sees them
(tokens that arrive in one response share a time); total is from the start to
the moment the client knows the answer is complete. Bytes here are what the
client's library handed over (bodies, frames); the wire's count, headers and
all, comes from Toxiproxy (streamlab/experiments/bench/probes.py).

Each measuring client records its own stream in a TransportRun: grpc_stream,
ws_stream, polling, and openai_stream's `sse_chat`. What a *scenario*
measures through the whole lab is the lab tool's (streamlab/experiments/scenarios/measures.py).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field


@dataclass
class TransportRun:
    transport: str
    started: float = field(default_factory=time.perf_counter, repr=False)
    ttft_s: float | None = None
    total_s: float = 0.0
    token_times: list[float] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    requests: int = 0
    done: bool = False
    error: str | None = None
    payload_bytes_down: int = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def tokens(self, texts: list[str], at: float | None = None) -> None:
        """Record tokens that arrived together (one event, frame or poll answer)."""
        now = self.elapsed() if at is None else at
        for text in texts:
            if not text:
                continue
            if self.ttft_s is None:
                self.ttft_s = now
            self.token_times.append(now)
            self.texts.append(text)

    def finish(self) -> TransportRun:
        self.total_s = self.elapsed()
        if not self.done and self.error is None:
            self.error = "stream ended without its end marker"
        return self

    @property
    def text(self) -> str:
        return "".join(self.texts)

    @property
    def inter_chunk_s(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]

