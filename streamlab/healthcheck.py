"""Container health checks: `python -m streamlab.healthcheck http URL | grpc HOST:PORT`.

Exit 0 when the service answers healthy, 1 otherwise (the contract of a compose
`healthcheck` test). The images have no curl or grpc_health_probe; Python and
the project's own dependencies are already there. One argument per word, no
spaces inside any: podman's Docker-compatible API splits `CMD` arguments on
spaces.
"""

from __future__ import annotations

import sys

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 2.0


def http_ok(url: str) -> bool:
    return httpx.get(url, timeout=TIMEOUT_S).status_code == 200


def grpc_serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def main(argv: list[str]) -> int:
    checks = {"http": http_ok, "grpc": grpc_serving}
    if len(argv) != 2 or argv[0] not in checks:
        print("usage: python -m streamlab.healthcheck http URL | grpc HOST:PORT",
              file=sys.stderr)
        return 2
    kind, address = argv
    try:
        healthy = checks[kind](address)
    except (httpx.HTTPError, grpc.RpcError) as exc:
        print(f"{kind} {address}: {exc!r}", file=sys.stderr)
        return 1
    print(f"{kind} {address}: {'healthy' if healthy else 'not healthy'}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
