"""Renders proxies/nginx/nginx.conf.template for one lab run."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from streamlab.lab import processes
from streamlab.lab.topology import Ports, replica_port, split_replica
from streamlab.paths import proxy_template

TEMPLATE = proxy_template("nginx", "nginx.conf")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class NginxOptions:
    read_timeout_s: float = 60.0  # nginx's own default
    short_read_timeout_s: float = 2.0  # a short stand-in for a load balancer's 60 s
    # How long `/` waits for a client that accepts no bytes before closing it (and
    # so the upstream: the gateway cancels the generation). The gateway's own send
    # timeout, applied where it can work: the buffers behind nginx hold megabytes.
    send_timeout_s: float = 30.0
    # Capacity: a proxied stream holds two connections (client and upstream), so
    # 5,000+ streams need 10,000+; nginx's 1024 cut a 2,000-stream run at 511.
    # The file limit is capped at the hard RLIMIT_NOFILE nginx starts under (it
    # cannot go past it without CAP_SYS_RESOURCE), and connections at the files.
    worker_connections: int = 16_384
    worker_rlimit_nofile: int = 20_000
    # How nginx spreads requests over several gateways: least_conn sends each new
    # stream to the gateway with the fewest open ones (SSE streams live for
    # minutes, so round-robin piles them up wherever short requests went
    # elsewhere). "round_robin" is there to show that (tests/integration/test_replicas.py).
    gateway_balance: str = "least_conn"
    # Retry a request no gateway answered on the next one (upstream_retry below).
    gateway_retry: bool = True


def upstream_servers(ports: Ports, gateways: int, balance: str = "least_conn",
                     host: str | None = None) -> str:
    """The `upstream gateway` block's server lines: each gateway's own hop
    (`upstream`, `upstream-2`, …) on `host` (the lab's by default). One gateway:
    the single line it always had."""
    host = host or ports.host
    # max_fails=0: no passive "unavailable" marks. nginx marks a gateway down for
    # fail_timeout (10 s by default) after one failed try, and a draining gateway's
    # 503 is one: in a rolling restart (a gateway every ~2 s) the marks outlived
    # each step, all three gateways were marked at once while two were serving,
    # and nginx answered "no live upstreams" 502s for seconds (rolling-deploy lost
    # 160 of 969 streams to them). Unmarked, a request tries a stopped gateway
    # (its hop refuses at once) and moves on to the next (upstream_retry).
    fails = " max_fails=0" if gateways > 1 else ""
    lines = [f"server {host}:{replica_port(ports, ports.upstream_port, k)}{fails};"
             for k in range(1, gateways + 1)]
    if gateways > 1 and balance == "least_conn":
        lines.insert(0, "least_conn;")
    elif balance not in ("least_conn", "round_robin"):
        raise ValueError(f"unknown gateway balance {balance!r}; one of: least_conn, round_robin")
    return "\n    ".join(lines)


def upstream_retry(gateways: int, retry: bool = True) -> str:
    """With several gateways, a request that no gateway answered goes to the next
    one. A stopped gateway still has its Toxiproxy hop listening, which accepts
    the connection and closes it: to nginx the POST was sent, and nginx retries
    no POST (`non_idempotent`) by default, so the client got a 502. A draining
    gateway answers new streams 503. Both happen before any byte reaches the
    client, so the retry can never duplicate what a client sees."""
    if gateways > 1 and retry:
        return "proxy_next_upstream error timeout http_503 non_idempotent;"
    return "# One gateway: no other to retry a request on (docs/topology.md)."


def job_routes(ports: Ports, gateways: int, host: str | None = None) -> str:
    """`$gateway_pool` for the streaming location: the balanced `gateway`
    upstream, except a polling job's GET and DELETE, which go to the one
    gateway holding the job. Jobs are not in the shared resume log; a job id
    starts with its gateway's tag (`g2.`, the gateway's JOB_ROUTE setting), and
    through least_conn a poll landed on the other gateway: 404 job_not_found."""
    if gateways < 2:
        return "map $uri $gateway_pool { default gateway; }"
    host = host or ports.host
    blocks = [f"upstream gateway_{k} {{ server {host}:"
              f"{replica_port(ports, ports.upstream_port, k)} max_fails=0; "
              "keepalive 8; keepalive_timeout 4s; }" for k in range(1, gateways + 1)]
    entries = [f'"~^/v1/jobs/g{k}\\." gateway_{k};' for k in range(1, gateways + 1)]
    return "\n  ".join([*blocks, "map $uri $gateway_pool {", "  default gateway;",
                        *(f"  {entry}" for entry in entries), "}"])


def job_route(name: str, gateways: int) -> str:
    """The JOB_ROUTE setting of gateway `name` (`gateway`, `gateway-2`, …) in a
    lab of `gateways`: the tag job_routes maps to it, empty with one gateway."""
    return f"g{split_replica(name)[1]}" if gateways > 1 else ""


def render(template: str, values: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"nginx template needs a value for {{{{{key}}}}}")
        return values[key]

    return _PLACEHOLDER.sub(substitute, template)


def write_config(ports: Ports, run_dir: Path, options: NginxOptions,
                 tls_dir: Path | None = None, gateways: int = 1) -> Path:
    """Write nginx.conf (and its temp dirs) under run_dir; return the config path.
    `tls_dir` holds streamlab/lab/tls.py's `nginx-h2.conf` (the TLS + HTTP/2 listener),
    which the config includes; without one nginx listens on the plain port only."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "tmp").mkdir(exist_ok=True)
    text = render(TEMPLATE.read_text(), {
        "run_dir": str(run_dir),
        # As root, nginx's workers drop to `nobody`, who cannot enter a private
        # run dir to write request bodies and buffered responses to its temp
        # paths (a 500 on any body over 16 KB). The lab's nginx runs as its owner.
        "user_directive": "user root;" if os.geteuid() == 0 else "",
        "listen_host": ports.host,
        "listen_port": str(ports.nginx_port),
        # The console's origin may read answers cross-origin (CORS).
        "console_port": str(ports.console_port),
        "tls_dir": str(tls_dir or run_dir / "no-tls"),
        "upstream_servers": upstream_servers(ports, gateways, options.gateway_balance),
        "upstream_retry": upstream_retry(gateways, options.gateway_retry),
        "job_routes": job_routes(ports, gateways),
        "read_timeout_s": f"{options.read_timeout_s:g}",
        "short_read_timeout_s": f"{options.short_read_timeout_s:g}",
        "send_timeout_s": f"{options.send_timeout_s:g}",
        **capacity(options),
    })
    path = run_dir / "nginx.conf"
    path.write_text(text)
    return path


def capacity(options: NginxOptions) -> dict[str, str]:
    """worker_rlimit_nofile no higher than the hard file limit nginx inherits from
    this process (past it setrlimit fails and the worker keeps the soft one), and
    worker_connections within it."""
    files = min(options.worker_rlimit_nofile, processes.open_files_hard_limit())
    return {"worker_rlimit_nofile": str(files),
            "worker_connections": str(min(options.worker_connections, files))}


def find_nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if found is None:
        raise FileNotFoundError(
            "nginx is not installed. Run `make up` (installs it), or: "
            "sudo apt-get install -y nginx-light"
        )
    return found
