"""`python -m streamlab.console.healthcheck`: exit 0 when the console answers
/healthz (compose's probe; the image has no curl)."""

from __future__ import annotations

import sys

import httpx

from streamlab.lab.console_settings import ConsoleSettings
from streamlab.lab.topology import Ports


def main() -> int:
    settings = ConsoleSettings.for_ports(Ports.load())
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "") else settings.host
    try:
        response = httpx.get(f"http://{host}:{settings.port}/healthz", timeout=2.0)
    except httpx.HTTPError as exc:
        print(f"console: {exc!r}", file=sys.stderr)
        return 1
    return 0 if response.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
