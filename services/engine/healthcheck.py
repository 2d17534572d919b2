"""The engine's container health check: `python -m services.engine.healthcheck [HOST:PORT]`.

Exit 0 when the engine's gRPC health service answers SERVING for the whole
server (it turns NOT_SERVING when the engine drains), 1 otherwise: the
contract of a compose `healthcheck` test. The image has no grpc_health_probe;
grpcio-health-checking is already one of the engine's dependencies. Without an
address it asks 127.0.0.1 at the engine's own port setting
(STREAMLAB_ENGINE_PORT), so compose.yaml names no port twice.
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.engine.settings import EngineSettings

TIMEOUT_S = 2.0


def main(argv: list[str]) -> int:
    target = argv[0] if argv else f"127.0.0.1:{EngineSettings().port}"
    try:
        with grpc.insecure_channel(target) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        print(f"engine {target}: {exc.code().name} {exc.details()}", file=sys.stderr)
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    print(f"engine {target}: {status}")
    return 0 if response.status == health_pb2.HealthCheckResponse.SERVING else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
