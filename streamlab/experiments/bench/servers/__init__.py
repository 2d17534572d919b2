"""Reference relays the relay benchmark compares the gateway with.

Both read the same engine stream over gRPC (through the same engine hop as
the gateway), so the comparison isolates what the HTTP/SSE layer costs:

- `floor`: a bare asyncio socket server that writes pre-formatted SSE chunks
  (no framework, no per-token JSON encoding of the envelope): the floor.
- `naive`: the textbook relay, FastAPI `StreamingResponse` with
  `request.is_disconnected()` before every token.
"""

from __future__ import annotations

import argparse


def arguments(description: str | None) -> argparse.Namespace:
    """Where a reference relay listens (--host, --port) and which engine it reads."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", required=True, help="host:port of the engine (or its hop)")
    return parser.parse_args()
