"""Reference relays the relay benchmark compares the gateway with.

Both read the same engine stream over gRPC (through the same engine hop as
the gateway), so the comparison isolates what the HTTP/SSE layer costs:

- `floor`: a bare asyncio socket server that writes pre-formatted SSE chunks
  (no framework, no per-token JSON encoding of the envelope): the floor.
- `naive`: the seed's relay, FastAPI `StreamingResponse` with
  `request.is_disconnected()` before every token.
"""
