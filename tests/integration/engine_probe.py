"""Reading the engine's counters from tests, with deadlines instead of sleeps."""

from __future__ import annotations

from streamlab.experiments.generation_end import Stats, wait_for_end
from streamlab.lab.local import Lab
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from tests.wait import wait_until


def wait_for_generation_end(lab: Lab, request_id: str, timeout_s: float = 5.0
                            ) -> pb.GenerationRecord:
    """The generation's record once it has ended; fail at the deadline."""
    return ended(lab.engine_stats, request_id, timeout_s)


def ended(stats: Stats, request_id: str, timeout_s: float = 5.0) -> pb.GenerationRecord:
    """As wait_for_generation_end, for any engine's stats (an upstream's too)."""
    record = wait_for_end(stats, request_id, timeout_s)
    if record is None or record.state == pb.GENERATION_STATE_RUNNING:
        raise AssertionError(f"generation {request_id} still running after {timeout_s} s: "
                             f"{record}")
    return record


def wait_for_generation_start(lab: Lab, request_id: str, timeout_s: float = 5.0
                              ) -> pb.GenerationRecord:
    """Poll GetStats until the engine has the request; fail at the deadline."""
    records = wait_until(lambda: lab.engine_stats(request_id).generations, timeout_s=timeout_s,
                         what=f"the engine to see {request_id}", interval_s=0.02)
    return records[0]
