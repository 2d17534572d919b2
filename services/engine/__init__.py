"""The engine: a gRPC server-streaming service that runs the model."""
