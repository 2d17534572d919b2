"""The edge proxies the lab can run where nginx stands (docs/proxies.md).

    EdgeProxy (base.py): render config, command line, config check, readiness,
    reload command, and every other fact of one proxy (base.py's docstring)
      ├── Nginx    (nginx.py: streamlab/lab/nginx.py's template)
      ├── HAProxy  (haproxy.py)
      ├── Caddy    (caddy.py)
      └── Traefik  (traefik.py)

PROXIES, below, is the one list of them: whatever lists proxies (the CLI's
--proxy, the compose lab's override files, the edge matrix) reads it.

`streamlab up --proxy NAME [--proxy-config FILE]` picks one; the local lab
(local.py) starts it in nginx's slot: same port, same hops, same paths.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from streamlab.lab.nginx import NginxOptions
from streamlab.lab.proxies.base import (
    EdgeProxy,
    IdleDirective,
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

__all__ = ["PROXIES", "PROXY_NAMES", "EdgeProxy", "IdleDirective", "ProxyConfigError",
           "ProxyNotInstalled", "ProxySetup", "edge_proxy", "install", "proxy_class"]

# The proxies a lab can run at the edge, by name, nginx (the default) first.
PROXIES: Mapping[str, type[EdgeProxy]] = MappingProxyType(
    {proxy.name: proxy for proxy in (Nginx, HAProxy, Caddy, Traefik)})
PROXY_NAMES = tuple(PROXIES)


def proxy_class(name: str) -> type[EdgeProxy]:
    """The class of the proxy called `name`; ValueError naming the others."""
    try:
        return PROXIES[name]
    except KeyError:
        raise ValueError(f"unknown proxy {name!r}; one of: {', '.join(PROXY_NAMES)}") from None


def edge_proxy(name: str, nginx_options: NginxOptions | None = None,
               tls_dir: Path | None = None, gateways: int = 1) -> EdgeProxy:
    """The proxy called `name`. Only nginx balances several gateways (its
    least_conn pool and job routes); the others stand in front of one."""
    proxy = proxy_class(name)
    if proxy is Nginx:
        return Nginx(nginx_options, tls_dir, gateways)
    if gateways > 1:
        raise ValueError(f"{name} stands in front of one gateway in this lab; "
                         "several gateways need --proxy nginx")
    return proxy()


def install(name: str) -> None:
    """Install the proxy with the project's script (its first `--proxy NAME`);
    ProxyNotInstalled, saying how, where there is no script (an installed
    wheel) or it failed."""
    script = REPO_ROOT / "scripts" / "install_proxies.sh"
    if clone() is None or not script.is_file():
        raise not_installed(name, proxy_class(name).install_hint)
    # Its output to stderr: stdout may be a command's JSON document (`up --json`).
    done = subprocess.run(["bash", str(script), name], check=False, cwd=REPO_ROOT,
                          stdout=sys.stderr)
    if done.returncode != 0:
        raise ProxyNotInstalled(f"{name} is not installed, and scripts/install_proxies.sh "
                                f"{name} failed (exit {done.returncode}; its message above)")
