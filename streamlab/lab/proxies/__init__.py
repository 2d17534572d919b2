"""The edge proxies the lab can run where nginx stands (docs/proxies.md).

    EdgeProxy (base.py): render config, command line, config check, readiness,
    reload command
      ├── Nginx    (nginx.py: streamlab/lab/nginx.py's template)
      ├── HAProxy  (haproxy.py)
      ├── Caddy    (caddy.py)
      └── Traefik  (traefik.py)

`streamlab up --proxy NAME [--proxy-config FILE]` picks one; the local lab
(local.py) starts it in nginx's slot: same port, same hops, same paths.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from streamlab.lab.nginx import NginxOptions
from streamlab.lab.proxies.base import (
    PROXY_NAMES,
    EdgeProxy,
    ProxyConfigError,
    ProxyNotInstalled,
    ProxySetup,
    not_installed,
)
from streamlab.lab.proxies.caddy import Caddy
from streamlab.lab.proxies.haproxy import HAProxy
from streamlab.lab.proxies.nginx import Nginx
from streamlab.lab.proxies.traefik import Traefik
from streamlab.lab.topology import REPO_ROOT
from streamlab.paths import clone

__all__ = ["PROXY_NAMES", "EdgeProxy", "ProxyConfigError", "ProxyNotInstalled", "ProxySetup",
           "edge_proxy", "install"]


def edge_proxy(name: str, nginx_options: NginxOptions | None = None,
               tls_dir: Path | None = None, gateways: int = 1) -> EdgeProxy:
    """The proxy called `name`. Only nginx balances several gateways (its
    least_conn pool and job routes); the others stand in front of one."""
    if name not in PROXY_NAMES:
        raise ValueError(f"unknown proxy {name!r}; one of: {', '.join(PROXY_NAMES)}")
    if name == "nginx":
        return Nginx(nginx_options, tls_dir, gateways)
    if gateways > 1:
        raise ValueError(f"{name} stands in front of one gateway in this lab; "
                         "several gateways need --proxy nginx")
    others: dict[str, type[HAProxy | Caddy | Traefik]] = {
        "haproxy": HAProxy, "caddy": Caddy, "traefik": Traefik}
    return others[name]()


def install(name: str) -> None:
    """Install the proxy with the project's script (its first `--proxy NAME`);
    ProxyNotInstalled, saying how, where there is no script (an installed
    wheel) or it failed."""
    script = REPO_ROOT / "scripts" / "install_proxies.sh"
    if clone() is None or not script.is_file():
        raise not_installed(name)
    # Its output to stderr: stdout may be a command's JSON document (`up --json`).
    done = subprocess.run(["bash", str(script), name], check=False, cwd=REPO_ROOT,
                          stdout=sys.stderr)
    if done.returncode != 0:
        raise ProxyNotInstalled(f"{name} is not installed, and scripts/install_proxies.sh "
                                f"{name} failed (exit {done.returncode}; its message above)")
