"""A Toxiproxy server of a test's own (the lab's binary, on free ports) with
the proxies the test names: for a hop the lab does not have (a Redis store, a
stalled reader's link), torn down when the test ends."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from streamlab.lab import processes
from streamlab.lab.local import find_toxiproxy
from streamlab.lab.processes import ServiceSpec
from tests.integration.conftest import free_ports


@dataclass(frozen=True)
class OwnToxiproxy:
    api: str  # its API's base URL
    listen: dict[str, int]  # proxy name → the port it listens on


@contextlib.contextmanager
def own_toxiproxy(upstreams: dict[str, int], run_dir: Path) -> Iterator[OwnToxiproxy]:
    """One proxy per name, from a free port on 127.0.0.1 to the upstream port."""
    api_port, *ports = free_ports(1 + len(upstreams))
    listen = dict(zip(upstreams, ports, strict=True))
    config = run_dir / "toxiproxy.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps([
        {"name": name, "listen": f"127.0.0.1:{listen[name]}",
         "upstream": f"127.0.0.1:{port}", "enabled": True}
        for name, port in upstreams.items()]))
    api = f"http://127.0.0.1:{api_port}"
    spec = ServiceSpec(f"toxiproxy-{'-'.join(upstreams)}",
                       [find_toxiproxy(), "-host", "127.0.0.1", "-port", str(api_port),
                        "-config", str(config)],
                       ready=lambda: httpx.get(f"{api}/version", timeout=1.0).status_code == 200)
    running = processes.start(spec, run_dir)
    try:
        processes.wait_ready(running)
        yield OwnToxiproxy(api, listen)
    finally:
        processes.stop(running, grace_s=5.0)
