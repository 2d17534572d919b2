"""Model backends behind the engine's gRPC stream. `base` defines the interface."""
