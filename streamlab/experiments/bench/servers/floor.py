"""The floor: the least a Python relay can do per token.

A bare asyncio server, HTTP/1.1 with keep-alive and chunked encoding, that
opens the engine call like the gateway does and writes each token as one
pre-formatted SSE chunk: a fixed prefix and suffix around the JSON-escaped
text. It does not watch for disconnects (a failed write ends the stream); it
exists to be measured, not to be run.

    python -m streamlab.experiments.bench.servers.floor --port 9000 --engine 127.0.0.1:8473
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

from services.gateway.engine_client import EngineClient
from services.gateway.errors import GatewayError
from services.gateway.openai_api import ChatCompletionRequest
from services.gateway.settings import GatewaySettings
from streamlab.experiments.bench.servers import arguments
from streamlab_protocol.engine.v1 import engine_pb2 as pb

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n")


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _plain(status: str, body: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class Floor:
    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                path = request_line.split(" ")[1]
                length = 0
                for line in lines:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                if path == "/healthz":
                    writer.write(_plain("200 OK", b'{"status":"ok"}'))
                elif path == "/v1/chat/completions":
                    await self._stream(body, writer)
                else:
                    writer.write(_plain("404 Not Found", b'{"error":"not found"}'))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _stream(self, body: bytes, writer: asyncio.StreamWriter) -> None:
        request = ChatCompletionRequest.model_validate_json(body)
        request_id = uuid.uuid4().hex
        try:
            stream = await self._engine.open(request.to_engine_request(request_id))
        except GatewayError as exc:
            writer.write(_plain(f"{exc.status_code} Error", json.dumps(exc.body()).encode()))
            return
        head = (f'data: {{"id":"chatcmpl-{request_id}","object":"chat.completion.chunk",'
                f'"created":{int(time.time())},"model":"{request.model}","choices":'
                '[{"index":0,"delta":').encode()
        writer.write(HEAD)
        try:
            async for event in stream:
                if isinstance(event, pb.Finish):  # EngineStream stops after it
                    writer.write(_chunk(head + b'{},"finish_reason":"stop"}]}\n\n'
                                        + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    return
                if not isinstance(event, pb.TokenChunk):  # tool calls: never asked for
                    continue
                text = json.dumps(event.text, ensure_ascii=False).encode()
                writer.write(_chunk(head + b'{"content":' + text
                                    + b'},"finish_reason":null}]}\n\n'))
                await writer.drain()
        except GatewayError:
            pass
        finally:
            stream.cancel()  # idempotent: a failed write leaves the call to be cancelled
        writer.write(_chunk(b'data: {"error":{"code":"engine_error"}}\n\n') + b"0\r\n\r\n")


async def serve(host: str, port: int, engine_target: str) -> None:
    engine = EngineClient(GatewaySettings(engine_target=engine_target))
    server = await asyncio.start_server(Floor(engine).handle, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    args = arguments(__doc__)
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port, args.engine))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
