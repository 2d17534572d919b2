"""Waiting for a generation to end, read from the engine's own counters
(GetStats by request id): how every measurement here learns what the engine
did for a client, and when.

`stats` is any `request_id -> GetStatsResponse` (a lab's `engine_stats`, an
upstream engine's): the waiting is the same whoever asks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from streamlab_protocol.engine.v1 import engine_pb2 as pb

Stats = Callable[[str], pb.GetStatsResponse]
POLL_S = 0.02


def state_name(record: pb.GenerationRecord) -> str:
    """"cancelled", "completed", ... (the enum's name without its prefix)."""
    return pb.GenerationState.Name(record.state).removeprefix("GENERATION_STATE_").lower()


def wait_for_end(stats: Stats, request_id: str, timeout_s: float) -> pb.GenerationRecord | None:
    """Poll until the generation is no longer running, up to `timeout_s`. Returns
    its record then; at the deadline, the last record seen (still running), or
    None if the engine never saw the request."""
    deadline = time.monotonic() + timeout_s
    record = None
    while True:
        found = stats(request_id).generations
        record = found[0] if found else None
        if record is not None and record.state != pb.GENERATION_STATE_RUNNING:
            return record
        if time.monotonic() >= deadline:
            return record
        time.sleep(POLL_S)
