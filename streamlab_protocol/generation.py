"""How a generation stands, in words: the engine's records and the gateway's
resumable streams share these four states, and the wire carries the same four
as `engine.v1.GenerationState` (`to_wire` maps them)."""

from __future__ import annotations

from enum import StrEnum

from streamlab_protocol.engine.v1 import engine_pb2 as pb


class GenerationState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"

    def to_wire(self) -> pb.GenerationState:
        return _WIRE[self]


_WIRE = {
    GenerationState.RUNNING: pb.GENERATION_STATE_RUNNING,
    GenerationState.COMPLETED: pb.GENERATION_STATE_COMPLETED,
    GenerationState.CANCELLED: pb.GENERATION_STATE_CANCELLED,
    GenerationState.FAILED: pb.GENERATION_STATE_FAILED,
}
