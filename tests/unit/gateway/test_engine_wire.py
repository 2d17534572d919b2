"""The engine wires (services/gateway/engine_client.py): one registry of the
names settings.py spells, and where each wire starts a call and carries its
trace context (both shown end to end in tests/integration/test_engine_wire.py)."""

from __future__ import annotations

from typing import Any, cast

from services.gateway.engine_client import WIRES, MultiplexedWire, PerRequestWire, Stub
from services.gateway.settings import ENGINE_WIRES, GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb

Started = tuple[str, str, object, dict[str, Any]]  # stub, method, request, keywords


class RecordingStub:
    """Records the calls a wire starts on it (what it returns: the arguments)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def Generate(self, request: object, **kwargs: Any) -> Started:
        return (self.name, "Generate", request, kwargs)

    def Attach(self, request: object, **kwargs: Any) -> Started:
        return (self.name, "Attach", request, kwargs)


def stub(name: str) -> Stub:
    return cast(Stub, RecordingStub(name))


def test_every_wire_the_settings_name_has_one_implementation() -> None:
    assert tuple(WIRES) == ENGINE_WIRES
    assert GatewaySettings().engine_wire in WIRES
    assert GatewaySettings(engine_wire="per_request").engine_wire in WIRES


def test_the_per_request_wire_starts_one_call_its_trace_as_metadata() -> None:
    wire = PerRequestWire(stub("balanced"), [], GatewaySettings())
    request = pb.GenerateRequest(request_id="r1", traceparent="00-t-s-01")
    attempts = wire.open(request)
    assert attempts.retry_on == ()
    [start] = attempts.starts
    assert start() == ("balanced", "Generate", request,
                       {"wait_for_ready": False, "metadata": (("traceparent", "00-t-s-01"),)})
    untraced = wire.open(pb.GenerateRequest(request_id="r2")).starts[0]()
    assert cast(Any, untraced)[3]["metadata"] is None


def test_the_per_request_wire_attaches_on_each_engine_in_turn() -> None:
    wire = PerRequestWire(stub("balanced"), [stub("a"), stub("b")], GatewaySettings())
    request = pb.AttachRequest(request_id="r1")
    attempts = wire.attach(request, "00-t-s-01")
    assert attempts.retry_on == (404, 503, 504)
    assert [cast(Any, start())[:2] for start in attempts.starts] == [("a", "Attach"),
                                                                     ("b", "Attach")]
    assert not request.traceparent  # metadata on this wire, not the request
    one = PerRequestWire(stub("balanced"), [], GatewaySettings()).attach(request, "")
    assert [cast(Any, start())[:2] for start in one.starts] == [("balanced", "Attach")]
    assert cast(Any, one.starts[0]())[3]["metadata"] is None


def test_the_multiplexed_wire_tries_each_session_its_trace_in_the_request() -> None:
    wire = MultiplexedWire(stub("balanced"), [stub("a"), stub("b")], GatewaySettings())
    opened = wire.open(pb.GenerateRequest(request_id="r1"))
    assert (len(opened.starts), opened.retry_on) == (2, (503,))
    request = pb.AttachRequest(request_id="r1")
    attached = wire.attach(request, "00-t-s-01")
    assert (len(attached.starts), attached.retry_on) == (2, (404, 503))
    assert request.traceparent == "00-t-s-01"
    single = MultiplexedWire(stub("balanced"), [], GatewaySettings())
    assert len(single.open(pb.GenerateRequest(request_id="r2")).starts) == 1
