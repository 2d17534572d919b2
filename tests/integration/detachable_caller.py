"""A gateway stand-in that a test can SIGKILL mid-stream: it opens one generation
through the gateway's own EngineClient and prints each token it receives as a
JSON line (`{"index": i, "text": t}`), flushed, then waits to be killed.

    python -m tests.integration.detachable_caller ENGINE_TARGET REQUEST_ID TOKENS GAP_MS DETACHABLE
"""

from __future__ import annotations

import asyncio
import json
import sys

from services.gateway.engine_client import EngineClient
from services.gateway.settings import GatewaySettings
from streamlab_protocol.engine.v1 import engine_pb2 as pb


async def main(target: str, request_id: str, tokens: int, gap_ms: int, detachable: bool) -> None:
    client = EngineClient(GatewaySettings(engine_target=target))
    stream = await client.open(pb.GenerateRequest(
        request_id=request_id, prompt="survive me", max_tokens=tokens, detachable=detachable,
        timing=pb.FakeModelTiming(prefill_ms=0, token_gap_ms=gap_ms, answer_tokens=tokens)))
    async for event in stream:
        if isinstance(event, pb.TokenChunk):
            print(json.dumps({"index": event.index, "text": event.text}), flush=True)
    print(json.dumps({"finish": True}), flush=True)
    await asyncio.Event().wait()  # hold the connection until the test kills us


if __name__ == "__main__":
    target, request_id, tokens, gap_ms, detachable = sys.argv[1:6]
    asyncio.run(main(target, request_id, int(tokens), int(gap_ms), detachable == "1"))
