from __future__ import annotations

from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.generation import GenerationState


def test_every_state_maps_onto_the_wire_state_of_the_same_name() -> None:
    for state in GenerationState:
        assert pb.GenerationState.Name(state.to_wire()) == f"GENERATION_STATE_{state.name}"
    wire = {v for v in pb.GenerationState.values() if v != pb.GENERATION_STATE_UNSPECIFIED}
    assert {state.to_wire() for state in GenerationState} == wire
