"""What the scenarios and the soak share to load a lab and watch it: one
module below both, so neither reaches into the other's internals.

    Flood      an answer long and slow enough that a reader who never reads is
               cut by nginx's send timeout well before the end (slow-reader-edge,
               the soak's stalled streams)
    LogTail    what a service's log file gains from now on (the `logs` capability)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from streamlab.errors import StreamlabError
from streamlab.lab.target import LabTarget

# What the hops in front of nginx (the client's 4 KB, the edge Toxiproxy's
# socket buffers and chunks, nginx's 32 KB send buffer) take of a stalled
# stream before nginx waits on a write: measured ~2,800 tokens (~700 KB) at a
# 1 ms pace, ~4,500 (966 KB) at 5 ms on a default lab (30 s send timeout),
# where the fixed mode missed a 3,000-token bound by 7.8 s: the edge's
# buffers are autotuned (Toxiproxy sets none) and grow the longer it runs.
EDGE_HOLDS_TOKENS = 5000
# nginx's timer, and the close crossing the upstream hop to the gateway and the
# cancel reaching the engine (measured 0.3-0.4 s past the fill + the timeout).
CUT_SLACK_S = 1.0
MAX_FLOOD_TOKENS = 16384


class FloodTooLong(StreamlabError, RuntimeError):
    """The lab's engine caps answers below a Flood's length: a stalled reader
    could not be told apart from one the hops in front of nginx absorbed."""


@dataclass(frozen=True)
class Flood:
    """An answer long and slow enough that a cut after the edge fills plus
    nginx's send timeout lands well before its end: it lasts twice the send
    timeout beyond what the hops in front of nginx soak up."""

    tokens: int
    gap_ms: int
    send_timeout_s: float

    @classmethod
    def for_lab(cls, lab: LabTarget) -> Flood:
        engine = lab.options.engine_settings()
        if engine.max_tokens_limit < MAX_FLOOD_TOKENS:
            # At 4,096 (the default once) the edge alone can hold the whole answer
            # (measured 837 KiB of 870): both modes would "complete" and the
            # fixed one fail for the lab's size, not nginx's settings.
            raise FloodTooLong(
                f"needs {MAX_FLOOD_TOKENS}-token answers to outlast what the hops in front "
                f"of nginx hold (~1 MB); this engine's max_tokens_limit is "
                f"{engine.max_tokens_limit}: start the lab with "
                f"STREAMLAB_ENGINE_MAX_TOKENS_LIMIT={MAX_FLOOD_TOKENS}")
        tokens = MAX_FLOOD_TOKENS
        timeout = lab.options.nginx.send_timeout_s
        gap_ms = max(1, math.ceil(2000 * timeout / max(1, tokens - EDGE_HOLDS_TOKENS)))
        return cls(tokens, gap_ms, timeout)

    @property
    def answer_s(self) -> float:
        return self.tokens * self.gap_ms / 1000

    @property
    def cut_bound_s(self) -> float:
        """When a reader that never read is cancelled at the latest: the hops in front
        of nginx fill, nginx waits its send timeout, and the close reaches the engine."""
        return EDGE_HOLDS_TOKENS * self.gap_ms / 1000 + self.send_timeout_s + CUT_SLACK_S


class LogTail:
    """What a log file gains from now on: only the new bytes are read (the lab's
    logs only grow, access lines included)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._start = path.stat().st_size if path.exists() else 0

    @classmethod
    def of(cls, lab: LabTarget, service: str) -> LogTail | None:
        """The service's log from now on; None when the lab has no `logs` capability."""
        logs = lab.logs
        return cls(logs[service]) if logs is not None and service in logs else None

    def count(self, *needles: str) -> int:
        try:
            with self._path.open("rb") as log:
                log.seek(self._start)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return 0
        return sum(text.count(needle) for needle in needles)
