"""Renders proxies/nginx/nginx.conf.template for one lab run."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from streamlab.topology import REPO_ROOT, Ports

TEMPLATE = REPO_ROOT / "proxies" / "nginx" / "nginx.conf.template"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


@dataclass(frozen=True)
class NginxOptions:
    read_timeout_s: float = 60.0  # nginx's own default
    short_read_timeout_s: float = 2.0  # a short stand-in for a load balancer's 60 s
    # How long `/` waits for a client that accepts no bytes before closing it (and
    # so the upstream: the gateway cancels the generation). The gateway's own send
    # timeout, applied where it can work: the buffers behind nginx hold megabytes.
    send_timeout_s: float = 30.0


def render(template: str, values: dict[str, str]) -> str:
    def substitute(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"nginx template needs a value for {{{{{key}}}}}")
        return values[key]

    return _PLACEHOLDER.sub(substitute, template)


def write_config(ports: Ports, run_dir: Path, options: NginxOptions,
                 tls_dir: Path | None = None) -> Path:
    """Write nginx.conf (and its temp dirs) under run_dir; return the config path.
    `tls_dir` holds streamlab/tls.py's `nginx-h2.conf` (the TLS + HTTP/2 listener),
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
        "upstream_host": ports.host,
        "upstream_port": str(ports.upstream_port),
        "read_timeout_s": f"{options.read_timeout_s:g}",
        "short_read_timeout_s": f"{options.short_read_timeout_s:g}",
        "send_timeout_s": f"{options.send_timeout_s:g}",
    })
    path = run_dir / "nginx.conf"
    path.write_text(text)
    return path


def find_nginx() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                      else None)
    if found is None:
        raise FileNotFoundError(
            "nginx is not installed. Run `make up` (installs it), or: "
            "sudo apt-get install -y nginx-light"
        )
    return found
