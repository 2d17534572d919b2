"""The gateway's container health check: `python -m services.gateway.healthcheck [URL]`.

Exit 0 when GET /healthz answers 200, 1 otherwise (a refused connection, a
timeout, a 503 while the gateway drains): the contract of a compose
`healthcheck` test. Liveness, not /readyz: a fault on the engine hop must not
mark the gateway itself unhealthy. The image has no curl; httpx is already one
of the gateway's dependencies. Without a URL it asks 127.0.0.1 at the
gateway's own port setting (STREAMLAB_GATEWAY_PORT).
"""

from __future__ import annotations

import sys

import httpx

from services.gateway.settings import GatewaySettings

TIMEOUT_S = 2.0


def main(argv: list[str], transport: httpx.BaseTransport | None = None) -> int:
    url = argv[0] if argv else f"http://127.0.0.1:{GatewaySettings().port}/healthz"
    try:
        with httpx.Client(transport=transport, timeout=TIMEOUT_S) as client:
            status = client.get(url).status_code
    except httpx.HTTPError as exc:
        print(f"gateway {url}: {exc!r}", file=sys.stderr)
        return 1
    print(f"gateway {url}: HTTP {status}")
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
