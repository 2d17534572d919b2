"""The gRPC floor under a stream's set-up: what grpc.aio itself spends.

Two bare processes speaking the engine's own Session protocol, on uvloop and
with the options the engine and the gateway use:

    serve   a Session servicer that does no work: each `open` is answered as
            the engine answers a two-token set-up stream without prefill,
            `accepted`, both tokens and the finish in one SessionEvent: one
            read and one write per stream, the fewest any stream can take on
            this wire
    drive   one Session call that opens N such calls at R a second, evenly
            spaced, reads every answer, and prints its own CPU (every thread:
            grpc's poller too), an idle spell's rate taken off, as JSON: the
            gRPC client's share of the gateway's set-up

No validation, admission, records, HTTP or SSE: what is left when the engine's
and the gateway's own work is taken away. `bench setup` runs both beside the
lab, on the same machine in the same run, and prints them next to the lab's
figures: a set-up target below the floor cannot be met on this transport.

    python -m streamlab.experiments.bench.servers.grpc_floor serve --port 9100
    python -m streamlab.experiments.bench.servers.grpc_floor drive \\
        --target 127.0.0.1:9100 --streams 1000 --rate 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator

import grpc

from services.engine.server import event_loop_factory, server_options
from services.engine.settings import EngineSettings
from services.gateway.engine_client import channel_options
from services.gateway.engine_mux import window_tokens
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb
from streamlab_protocol.engine.v1 import engine_pb2_grpc as pb_grpc

TOKENS = ("Hello", " world")
IDLE_S = 0.5


SERVICE = pb.DESCRIPTOR.services_by_name["EngineService"].full_name


async def bare_session(requests: AsyncIterator[pb.SessionRequest],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.SessionEvent]:
    """The engine's Session method, doing nothing but answering."""
    async for request in requests:
        if request.WhichOneof("kind") != "open":
            continue
        answer = pb.SessionEvent()
        answer.items.add(call=request.call, accepted=pb.SessionAccepted(
            request_id=request.open.request_id))
        tokens = answer.items.add(call=request.call).event.tokens
        for index, text in enumerate(TOKENS):
            tokens.chunks.add(index=index, text=text)
        answer.items.add(call=request.call).event.finish.CopyFrom(pb.Finish(
            reason=pb.FINISH_REASON_LENGTH,
            usage=pb.Usage(prompt_tokens=1, completion_tokens=len(TOKENS))))
        yield answer


async def serve(host: str, port: int) -> None:
    server = grpc.aio.server(options=server_options(EngineSettings()))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {
        "Session": grpc.stream_stream_rpc_method_handler(
            bare_session, request_deserializer=pb.SessionRequest.FromString,
            response_serializer=pb.SessionEvent.SerializeToString)}),))
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    await server.wait_for_termination()


def open_request(call: int, window: int) -> pb.SessionRequest:
    """What the gateway sends to open a two-token set-up stream."""
    return pb.SessionRequest(call=call, window_tokens=window, open=pb.GenerateRequest(
        request_id=f"floor-{call}", messages=[pb.ChatMessage(role="user", content="setup")],
        max_tokens=len(TOKENS), accept_token_batches=True,
        timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=0, answer_tokens=len(TOKENS))))


async def drive(target: str, streams: int, rate: float) -> dict[str, float]:
    settings = GatewaySettings()
    window = window_tokens(settings.engine_read_ahead_bytes)
    channel = grpc.aio.insecure_channel(target, options=channel_options(settings))
    outbox: asyncio.Queue[pb.SessionRequest | None] = asyncio.Queue()

    async def requests() -> AsyncIterator[pb.SessionRequest]:
        while (request := await outbox.get()) is not None:
            yield request

    call = pb_grpc.EngineServiceStub(channel).Session(requests(), wait_for_ready=True)
    finished, messages = 0, 0
    first, all_done = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        nonlocal finished, messages
        async for event in call:
            messages += 1
            for item in event.items:
                if item.WhichOneof("kind") == "event" and item.event.HasField("finish"):
                    finished += 1
                    first.set()
            if finished >= streams:
                all_done.set()

    reader = asyncio.get_running_loop().create_task(read())
    # One stream first: the channel connects and the session opens outside the figure.
    outbox.put_nowait(open_request(0, window))
    await first.wait()
    finished, messages = 0, 0
    # The quiet spell is the measurement (the idle rate), not a wait for something.
    before, started = time.process_time(), time.monotonic()
    await asyncio.sleep(IDLE_S)
    idle_per_s = (time.process_time() - before) / (time.monotonic() - started)
    before, started = time.process_time(), time.monotonic()
    for number in range(1, streams + 1):
        outbox.put_nowait(open_request(number, window))
        delay = started + number / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    await all_done.wait()
    wall_s = time.monotonic() - started
    cpu_s = time.process_time() - before - idle_per_s * wall_s
    outbox.put_nowait(None)
    reader.cancel()
    await channel.close()
    return {"streams": streams, "completed": finished, "messages": messages,
            "cpu_ms": cpu_s * 1000, "wall_s": wall_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    serving = sub.add_parser("serve")
    serving.add_argument("--host", default="127.0.0.1")
    serving.add_argument("--port", type=int, required=True)
    driving = sub.add_parser("drive")
    driving.add_argument("--target", required=True)
    driving.add_argument("--streams", type=int, default=1000)
    driving.add_argument("--rate", type=float, default=100.0)
    driving.add_argument("--timeout-s", type=float, default=120.0)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        if args.mode == "serve":
            runner.run(serve(args.host, args.port))
        else:
            result = runner.run(asyncio.wait_for(
                drive(args.target, args.streams, args.rate), args.timeout_s))
            print(json.dumps(result))


if __name__ == "__main__":
    main()
