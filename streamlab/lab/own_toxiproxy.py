"""A Toxiproxy server of one's own: the lab's patched binary on free ports,
with the proxies the caller names, stopped on exit.

For a hop the lab's topology does not have: `streamlab check`'s hop in front of
someone else's server, a test's hop in front of its own Redis or a stalled
reader. The lab's own two Toxiproxy processes are started by local.py.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from streamlab.lab import processes
from streamlab.lab.local import find_toxiproxy
from streamlab.lab.processes import ServiceSpec, free_ports
from streamlab.lab.topology import ToxiproxyRuntime


@dataclass(frozen=True)
class OwnToxiproxy:
    api: str  # its API's base URL
    listen: dict[str, int]  # proxy name → the port it listens on, on 127.0.0.1


@contextlib.contextmanager
def own_toxiproxy(upstreams: Mapping[str, str], run_dir: Path) -> Iterator[OwnToxiproxy]:
    """One proxy per name, from a free port on 127.0.0.1 to its upstream
    ("host:port"); its config and log under `run_dir`."""
    api_port, *ports = free_ports(1 + len(upstreams))
    listen = dict(zip(upstreams, ports, strict=True))
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "toxiproxy.json"
    config.write_text(json.dumps([
        {"name": name, "listen": f"127.0.0.1:{listen[name]}", "upstream": upstream,
         "enabled": True}
        for name, upstream in upstreams.items()]))
    api = f"http://127.0.0.1:{api_port}"
    spec = ServiceSpec(f"toxiproxy-{api_port}",
                       [find_toxiproxy(), "-host", "127.0.0.1", "-port", str(api_port),
                        "-config", str(config)],
                       env=ToxiproxyRuntime().environment(),
                       ready=lambda: httpx.get(f"{api}/version", timeout=1.0).is_success)
    running = processes.start(spec, run_dir)
    try:
        processes.wait_ready(running)
        yield OwnToxiproxy(api, listen)
    finally:
        processes.stop(running, grace_s=5.0)
