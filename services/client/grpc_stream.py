"""Direct gRPC to the engine: the floor every other transport is compared with."""

from __future__ import annotations

import grpc

from services.client.transport_run import TransportRun
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc


def generate_request(prompt: str, *, prefill_ms: int, token_gap_ms: int, answer_tokens: int,
                     request_id: str = "") -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        messages=[pb.ChatMessage(role="user", content=prompt)],
        timing=pb.FakeModelTiming(prefill_ms=prefill_ms, token_gap_ms=token_gap_ms,
                                  answer_tokens=answer_tokens))


async def grpc_generate(stub: pb_grpc.EngineServiceStub, request: pb.GenerateRequest,
                        timeout_s: float = 60.0) -> TransportRun:
    run = TransportRun("grpc")
    run.requests = 1
    try:
        call = stub.Generate(request, timeout=timeout_s)
        async for response in call:
            kind = response.WhichOneof("event")
            if kind == "token":
                run.payload_bytes_down += response.ByteSize()
                run.tokens([response.token.text])
            elif kind == "finish":
                run.done = True
            elif kind == "error":
                run.error = f"engine: {response.error.message}"
    except grpc.aio.AioRpcError as exc:
        run.error = f"gRPC {exc.code().name}: {exc.details()}"
    return run.finish()


async def grpc_once(target: str, request: pb.GenerateRequest,
                    timeout_s: float = 60.0) -> TransportRun:
    """One call on a fresh channel (its connection set-up counts, as for HTTP)."""
    async with grpc.aio.insecure_channel(target) as channel:
        return await grpc_generate(pb_grpc.EngineServiceStub(channel), request, timeout_s)
