"""The SSE gateway: re-emits the engine's gRPC stream as Server-Sent Events."""
