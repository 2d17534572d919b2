"""Reading the engine's counters from tests, with deadlines instead of sleeps."""

from __future__ import annotations

import time

from streamlab.api.engine.v1 import engine_pb2 as pb
from streamlab.lab import Lab


def wait_for_generation_end(lab: Lab, request_id: str, timeout_s: float = 5.0
                            ) -> pb.GenerationRecord:
    """Poll GetStats until the generation is no longer running; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    last: pb.GenerationRecord | None = None
    while time.monotonic() < deadline:
        records = lab.engine_stats(request_id).generations
        if records:
            last = records[0]
            if last.state != pb.GENERATION_STATE_RUNNING:
                return last
        time.sleep(0.02)
    raise AssertionError(f"generation {request_id} still running after {timeout_s} s: {last}")


def wait_for_generation_start(lab: Lab, request_id: str, timeout_s: float = 5.0
                              ) -> pb.GenerationRecord:
    """Poll GetStats until the engine has the request; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = lab.engine_stats(request_id).generations
        if records:
            return records[0]
        time.sleep(0.02)
    raise AssertionError(f"the engine never saw {request_id} within {timeout_s} s")
