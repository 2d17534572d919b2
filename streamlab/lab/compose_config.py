"""The compose lab's proxy configs, generated from the same hops as the local lab.

Inside the compose network every service listens on the port lab.env gives it
(the container side of each published port) and finds the next hop by its
compose service name instead of 127.0.0.1. The files written here are
committed, because image builds COPY them and a user with only Docker must
not need Python to build; `streamlab compose config --check` (and a unit
test) fail when they drift from this generator.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import yaml
from dotenv import dotenv_values

from streamlab.errors import StreamlabError
from streamlab.lab import jaeger, nginx, tls
from streamlab.lab.endpoints import REDIS_PERSISTENCE
from streamlab.lab.proxies import PROXIES, PROXY_NAMES, ProxySetup, edge_proxy, proxy_class
from streamlab.lab.proxies.idle import fill
from streamlab.lab.topology import (
    LAB_ENV,
    REPO_ROOT,
    Ports,
    Replicas,
    hops,
    replica_name,
    replica_port,
    split_replica,
    toxiproxy_api_port,
    toxiproxy_process,
)
from streamlab.lab.toxiproxy import ProxySpec

TOXIPROXY_CONFIG = REPO_ROOT / "proxies" / "toxiproxy" / "compose.json"
# The second Toxiproxy process's proxies (the hops behind nginx; topology.py).
TOXIPROXY_BACKEND_CONFIG = REPO_ROOT / "proxies" / "toxiproxy" / "compose-backend.json"
TOXIPROXY_CONFIGS = {"toxiproxy": TOXIPROXY_CONFIG, "toxiproxy-backend": TOXIPROXY_BACKEND_CONFIG}
NGINX_CONFIG = REPO_ROOT / "proxies" / "nginx" / proxy_class("nginx").compose_config_name
# The replicas' compose lab (2 gateways, 2 engines, Redis): an override file for
# `-f compose.yaml -f compose.replicas.yaml`, and the proxy configs it mounts
# over the images' own. CI's compose lab runs it (scripts/compose_test.sh).
COMPOSE_FILE = REPO_ROOT / "compose.yaml"
REPLICAS_COMPOSE = REPO_ROOT / "compose.replicas.yaml"
TOXIPROXY_REPLICAS_CONFIG = REPO_ROOT / "proxies" / "toxiproxy" / "compose-replicas.json"
NGINX_REPLICAS_CONFIG = REPO_ROOT / "proxies" / "nginx" / "compose-replicas.conf"
COMPOSE_REPLICAS = Replicas(gateways=2, engines=2, redis=True)
# The Redis service's name in compose (the `store` hop leads to it).
STORE_HOP_SERVICE = "redis"
# compose.yaml's service names that are not the upstream of a hop.
TOXIPROXY_SERVICE = "toxiproxy"
# Where the nginx image keeps its pid file and temp dirs (made by its Dockerfile).
NGINX_RUN_DIR = "/var/lib/streamlab-nginx"
# The lab CA and nginx's certificate for the compose lab's TLS + HTTP/2 listener:
# written by `streamlab compose tls` (scripts/compose_test.sh runs it) into a
# git-ignored folder, mounted read-only into the nginx container. Without them
# nginx's include matches nothing and the compose lab serves plain HTTP only.
TLS_DIR = REPO_ROOT / "proxies" / "nginx" / "tls"
CONTAINER_TLS_DIR = "/etc/streamlab/tls"
# Who reaches the compose nginx by name: the host (published ports) and the
# client container (through toxiproxy).
TLS_NAMES = (*tls.LOCAL_NAMES, TOXIPROXY_SERVICE, "nginx")
# Containers listen on every interface of their own network namespace; only
# the published ports (127.0.0.1 on the host) are reachable from outside.
LISTEN_HOST = "0.0.0.0"


class ConfigDrift(StreamlabError):
    def __init__(self, path: Path) -> None:
        super().__init__(f"{path.relative_to(REPO_ROOT)} differs from what "
                         "`streamlab compose config` generates; run it and commit the result")
        self.path = path


def container_ports() -> Ports:
    """lab.env's own values, ignoring STREAMLAB_* in the environment: the container
    side of the compose lab never moves, only the published host ports do."""
    values = {key.removeprefix("STREAMLAB_").lower(): value
              for key, value in dotenv_values(LAB_ENV).items()
              if key.startswith("STREAMLAB_") and value is not None}
    return Ports.model_validate(values)


def toxiproxy_specs(ports: Ports, replicas: Replicas | None = None,
                    process: str | None = None) -> list[ProxySpec]:
    """Each hop to its service by name: all, or those of one Toxiproxy service (a
    process each). Replicas are containers of their own, each listening on its
    service's base port (the replica port rule is for one host's processes), so
    `upstream-2` leads to gateway-2 on the gateway's port."""
    specs = []
    for hop in hops(ports, replicas):
        if process is not None and toxiproxy_process(hop.name) != process:
            continue
        k = split_replica(hop.upstream_service)[1]
        base_port = hop.upstream_port - (k - 1) * ports.replica_port_step
        specs.append(ProxySpec(hop.name, f"{LISTEN_HOST}:{hop.listen_port}",
                               f"{hop.upstream_service}:{base_port}"))
    return specs


def toxiproxy_config(ports: Ports, replicas: Replicas | None = None,
                     process: str = "toxiproxy") -> str:
    return json.dumps([spec.as_json() for spec in toxiproxy_specs(ports, replicas, process)],
                      indent=2) + "\n"


# A published port's host side in compose.yaml: `${STREAMLAB_X_PORT:?set in lab.env}`.
_PUBLISHED = re.compile(r"\$\{STREAMLAB_(?P<name>[A-Z0-9_]+)_PORT:\?set in lab\.env\}")


def replica_published(entries: list[str], ports: Ports, k: int) -> list[str]:
    """A replica's published ports: the base service's, each host side moved to a
    variable of the replica's own (`STREAMLAB_ENGINE_2_PORT`) whose default is
    the replica port rule (topology.py) applied to lab.env. The tools find a
    replica by that rule, so an override moves the replica's variable with its
    base (scripts/compose_test.sh exports both)."""
    def host_side(match: re.Match[str]) -> str:
        name = match["name"]
        default = replica_port(ports, getattr(ports, f"{name.lower()}_port"), k)
        return f"${{STREAMLAB_{name}_{k}_PORT:-{default}}}"
    return [_PUBLISHED.sub(host_side, entry) for entry in entries]


def replicas_compose(ports: Ports, replicas: Replicas = COMPOSE_REPLICAS) -> str:
    """compose.replicas.yaml: gateway-2…, engine-2… as copies of compose.yaml's
    gateway and engine, each published on the host at its replica port (the
    tests read every engine's GetStats and `streamlab status` lists them),
    Redis behind the `store` hop (published too), and the gateways' engine
    target listing every engine hop (the gateway resolves the names and
    balances them)."""
    base: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    engine_hops = ",".join(
        f"{toxiproxy_process('engine')}:{replica_port(ports, ports.engine_proxy_port, k)}"
        for k in range(1, replicas.engines + 1))
    gateway_env = {
        "STREAMLAB_GATEWAY_ENGINE_TARGET": engine_hops,
        "STREAMLAB_GATEWAY_RESUME_STORE": "redis",
    }

    def store_env(k: int) -> dict[str, str]:
        """Each gateway reaches Redis through its own store hop (store, store-2, …)."""
        hop = replica_name("store", k)
        port = replica_port(ports, ports.store_proxy_port, k)
        return {"STREAMLAB_GATEWAY_REDIS_URL": f"redis://{toxiproxy_process(hop)}:{port}/0"}

    healthy = {"condition": "service_healthy"}
    services: dict[str, Any] = {
        "toxiproxy-backend": {"volumes": [
            f"./{TOXIPROXY_REPLICAS_CONFIG.relative_to(REPO_ROOT)}"
            ":/config/toxiproxy-backend.json:ro"]},
        "nginx": {
            "volumes": [f"./{NGINX_REPLICAS_CONFIG.relative_to(REPO_ROOT)}"
                        ":/etc/streamlab/nginx.conf:ro"],
            "depends_on": {f"gateway-{k}": healthy for k in range(2, replicas.gateways + 1)},
        },
    }
    for k in range(2, replicas.engines + 1):
        engine = copy.deepcopy(base["engine"])
        engine["ports"] = replica_published(engine["ports"], ports, k)
        services[f"engine-{k}"] = engine
    engines = {f"engine-{k}": healthy for k in range(2, replicas.engines + 1)}
    store = {STORE_HOP_SERVICE: healthy}
    services["gateway"] = {"environment": {**gateway_env, **store_env(1),
                                           "STREAMLAB_GATEWAY_JOB_ROUTE": "g1"},
                           "depends_on": {**engines, **store}}
    for k in range(2, replicas.gateways + 1):
        gateway = copy.deepcopy(base["gateway"])
        gateway["ports"] = replica_published(gateway["ports"], ports, k)
        gateway["environment"] = {**gateway.get("environment", {}), **gateway_env,
                                  **store_env(k), "STREAMLAB_GATEWAY_JOB_ROUTE": f"g{k}"}
        gateway["depends_on"] = {**gateway.get("depends_on", {}), **engines, **store}
        services[f"gateway-{k}"] = gateway
    # The console sends a hop's calls to the Toxiproxy service that has it: the
    # replicas' hops (upstream-2, engine-2, store) are the backend's too.
    services["console"] = {"environment": {"STREAMLAB_CONSOLE_TOXIPROXY_ROUTES": json.dumps(
        {hop.name: f"http://{toxiproxy_process(hop.name)}:"
                   f"{toxiproxy_api_port(ports, toxiproxy_process(hop.name))}"
         for hop in hops(ports, replicas)})}}
    services[STORE_HOP_SERVICE] = {
        "build": {"context": ".", "dockerfile": "proxies/redis/Dockerfile",
                  "args": {"REDIS_BASE_IMAGE": "${REDIS_BASE_IMAGE:-debian:12.12-slim}"}},
        "image": "streamlab-redis:${STREAMLAB_IMAGE_TAG:-latest}",
        "init": True,
        # Straight to Redis (not through the `store` hop), for `streamlab status`.
        "ports": [f"${{STREAMLAB_HOST:-127.0.0.1}}:${{STREAMLAB_REDIS_PORT:?set in lab.env}}:"
                  f"{ports.redis_port}"],
        # The append-only file in the Debian package's data dir: it survives a
        # restart of the container (docs/resume.md, "Redis restarts").
        "command": ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no",
                    "--port", str(ports.redis_port), *REDIS_PERSISTENCE,
                    "--dir", "/var/lib/redis"],
        "healthcheck": {"test": ["CMD", "redis-cli", "-p", str(ports.redis_port), "ping"],
                        "interval": "2s", "timeout": "3s", "retries": 10,
                        "start_period": "10s"},
    }
    header = ("# Generated by `streamlab compose config` from compose.yaml and lab.env; do not\n"
              "# edit. The replicas' compose lab (docs/topology.md): 2 gateways behind nginx\n"
              "# (least_conn), 2 engines balanced by the gateways, Redis behind the `store` hop.\n"
              "#   docker compose -f compose.yaml -f compose.replicas.yaml up --build -d\n")
    return header + yaml.dump({"services": services}, Dumper=_NoAliases, sort_keys=False,
                              width=100)


# The `tracing` profile's override (docs/tracing.md): compose.yaml's `jaeger`
# service is in the profile, and the services' OTEL_* environment comes with
# this file, since compose cannot make an environment depend on a profile.
TRACING_COMPOSE = REPO_ROOT / "compose.tracing.yaml"
JAEGER_SERVICE = "jaeger"
TRACED_SERVICES = ("engine", "gateway")


def tracing_compose(ports: Ports) -> str:
    """compose.tracing.yaml: the engine and the gateway with the OTEL_* variables
    a local lab up with --tracing gives them (jaeger.service_env), pointed at
    the `jaeger` service, and started after it."""
    in_network = ports.model_copy(update={"host": JAEGER_SERVICE})
    services: dict[str, Any] = {
        name: {"environment": jaeger.service_env(in_network, name),
               "depends_on": {JAEGER_SERVICE: {"condition": "service_healthy"}}}
        for name in TRACED_SERVICES}
    header = ("# Generated by `streamlab compose config` from lab.env; do not edit. The\n"
              "# `tracing` profile's services (docs/tracing.md): Jaeger (compose.yaml's `jaeger`,\n"
              "# in the profile) and the gateway's and engine's spans exported to it:\n"
              "#   docker compose --profile tracing -f compose.yaml -f compose.tracing.yaml up "
              "--build -d\n")
    return header + yaml.dump({"services": services}, Dumper=_NoAliases, sort_keys=False,
                              width=100)


class _NoAliases(yaml.SafeDumper):
    """Every mapping written out in full (no `&id001` anchors for repeats)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True




def nginx_config(ports: Ports, options: nginx.NginxOptions | None = None,
                 gateways: int = 1) -> str:
    options = options or nginx.NginxOptions()
    header = ("# Generated by `streamlab compose config` from nginx.conf.template and lab.env;"
              " do not edit.\n")
    return header + nginx.render(nginx.TEMPLATE.read_text(), {
        "run_dir": NGINX_RUN_DIR,
        # The image's build-time default worker user; nginx creates the temp
        # paths for it (proxies/nginx/Dockerfile).
        "user_directive": "",
        "listen_host": LISTEN_HOST,
        "listen_port": str(ports.nginx_port),
        # The console's origin as the browser sees it: the published console port
        # (the same number as the container side unless overridden).
        "console_port": str(ports.console_port),
        "tls_dir": CONTAINER_TLS_DIR,
        # nginx reaches the gateway through Toxiproxy's "upstream" listener.
        "upstream_servers": nginx.upstream_servers(ports, gateways, options.gateway_balance,
                                                   host=toxiproxy_process("upstream")),
        "upstream_retry": nginx.upstream_retry(gateways, options.gateway_retry),
        "job_routes": nginx.job_routes(ports, gateways, host=toxiproxy_process("upstream")),
        "read_timeout_s": f"{options.read_timeout_s:g}",
        "short_read_timeout_s": f"{options.short_read_timeout_s:g}",
        "send_timeout_s": f"{options.send_timeout_s:g}",
        # compose.yaml gives the container this many open files (`ulimits`).
        "worker_rlimit_nofile": str(options.worker_rlimit_nofile),
        "worker_connections": str(options.worker_connections),
    })


def write_tls(tls_dir: Path = TLS_DIR) -> tls.LabTls:
    """The compose lab's CA and server certificate (kept if present), and the
    nginx lines that turn its TLS + HTTP/2 listener on, with container paths."""
    made = tls.ensure(tls_dir, TLS_NAMES)
    tls.write_nginx_snippet(made, f"{LISTEN_HOST}:{container_ports().nginx_h2_port}",
                            cert_dir=CONTAINER_TLS_DIR)
    return made


# ---- the other edge proxies: compose.<proxy>.yaml --------------------------
# HAProxy, Caddy or Traefik where nginx stands (docs/proxies.md), an override
# file each: `docker compose -f compose.yaml -f compose.haproxy.yaml up`. The
# service keeps the name `nginx`, as the local lab's slot does: Toxiproxy's
# edge hop (compose.json), the console's and client's depends_on, and the lab
# tool's probes all name it, and none of them changes with the proxy.
EDGE_SERVICE = "nginx"
# Every proxy but nginx, the default, whose service is compose.yaml's own.
OTHER_PROXIES = PROXY_NAMES[1:]
# Each proxy's config rendered for the containers, beside its template.
PROXY_CONFIGS = {name: REPO_ROOT / "proxies" / name / proxy_class(name).compose_config_name
                 for name in OTHER_PROXIES}
# Where each image keeps its config, and its run dir (pid file, Caddy's admin
# socket and data), made by its Dockerfile for the user it runs as.
CONTAINER_CONFIG_DIR = "/etc/streamlab"
# What each proxy answers itself on the edge listener, for the compose health
# check and ComposeLab's probe: the proxy, not the gateway behind it, so a
# toxic on the upstream hop does not make the edge look down
# (EdgeProxy.compose_health_path).
HEALTH_PATHS = {name: proxy.compose_health_path for name, proxy in PROXIES.items()}
# The images' health check script: GET a path on a port, 200 or fail (bash's
# /dev/tcp: the images need no curl).
HEALTH_SCRIPT = "/usr/local/bin/streamlab-proxy-health"
# Base images (EdgeProxy.compose_build_args), as plain dicts for yaml.dump.
PROXY_BUILD_ARGS = {name: dict(proxy_class(name).compose_build_args) for name in OTHER_PROXIES}


def proxy_compose_file(name: str) -> Path:
    return REPO_ROOT / f"compose.{name}.yaml"


# The proxies' listen address has no host (`:8471`): every interface of the
# container, in each proxy's syntax. Not 0.0.0.0: Caddy reads a site address's
# host as a Host matcher, and answered every request (Host: 127.0.0.1:<port>,
# the published port) with its empty 200 for an unmatched host.
PROXY_LISTEN_HOST = ""


def proxy_setup(name: str, ports: Ports) -> ProxySetup:
    """The proxy's place in the compose network: listening on every interface
    of its container at nginx's port, its timeouts the lab's (NginxOptions)."""
    options = nginx.NginxOptions()
    return ProxySetup(ports.model_copy(update={"host": PROXY_LISTEN_HOST}),
                      Path(f"/var/lib/streamlab-{name}"),
                      read_timeout_s=options.read_timeout_s,
                      short_read_timeout_s=options.short_read_timeout_s)


def proxy_environment(name: str, ports: Ports) -> dict[str, str]:
    """The placeholders' values in the container (streamlab/lab/proxies/base.py):
    the upstream hop is Toxiproxy's backend service by name. Also the service's
    environment, so a user's own config mounted over the lab's fills in the
    same names (docs/proxies.md)."""
    setup = proxy_setup(name, ports)
    upstream = f"{toxiproxy_process('upstream')}:{ports.upstream_port}"
    return {**edge_proxy(name).environment(setup), "STREAMLAB_UPSTREAM": upstream}


def _with_health(name: str, text: str) -> str:
    """The template with the proxy's own health answer (EdgeProxy.with_compose_health)."""
    return edge_proxy(name).with_compose_health(text)


def proxy_config(name: str, ports: Ports) -> str:
    """The proxy's template with the compose network's values filled in (so the
    committed file is what runs), plus its health answer."""
    proxy = edge_proxy(name)
    header = (f"# Generated by `streamlab compose config` from {proxy.config_name}.template and "
              "lab.env; do not edit.\n")
    return header + fill(_with_health(name, proxy.template().read_text()),
                         proxy_environment(name, ports))


def container_config(name: str) -> str:
    return f"{CONTAINER_CONFIG_DIR}/{edge_proxy(name).config_name}"


def proxy_command(name: str, ports: Ports) -> list[str]:
    """The local lab's command line for the proxy, with the image's paths, and
    whatever its compose service adds (EdgeProxy.compose_command)."""
    return edge_proxy(name).compose_command(name, Path(container_config(name)),
                                            proxy_setup(name, ports))


def proxy_compose(name: str, ports: Ports) -> str:
    """compose.<name>.yaml: compose.yaml's `nginx` service made into that proxy
    (build, image, command, environment, health check); its ports, ulimits,
    depends_on and init stay compose.yaml's. Each key set here replaces the
    base's (compose merges `build.args` and `environment`, which nginx's
    service does not use)."""
    service = {
        "build": {"context": ".", "dockerfile": f"proxies/{name}/Dockerfile",
                  "args": PROXY_BUILD_ARGS[name]},
        "image": f"streamlab-{name}:${{STREAMLAB_IMAGE_TAG:-latest}}",
        "command": proxy_command(name, ports),
        "environment": proxy_environment(name, ports),
        "healthcheck": {"test": ["CMD", HEALTH_SCRIPT, str(ports.nginx_port),
                                 HEALTH_PATHS[name]],
                        "interval": "2s", "timeout": "3s", "retries": 10,
                        "start_period": "10s"},
    }
    header = (f"# Generated by `streamlab compose config` from compose.yaml and lab.env; do not\n"
              f"# edit. {name} at the edge where nginx stands (docs/proxies.md), one gateway:\n"
              f"#   docker compose -f compose.yaml -f compose.{name}.yaml up --build -d\n")
    return header + yaml.dump({"services": {EDGE_SERVICE: service}}, Dumper=_NoAliases,
                              sort_keys=False, width=100)


def generated() -> dict[Path, str]:
    ports = container_ports()
    return {**{path: toxiproxy_config(ports, process=process)
               for process, path in TOXIPROXY_CONFIGS.items()},
            **{PROXY_CONFIGS[name]: proxy_config(name, ports) for name in OTHER_PROXIES},
            **{proxy_compose_file(name): proxy_compose(name, ports) for name in OTHER_PROXIES},
            NGINX_CONFIG: nginx_config(ports),
            # The replicas add hops to the backend process only (topology.py).
            TOXIPROXY_REPLICAS_CONFIG: toxiproxy_config(ports, COMPOSE_REPLICAS,
                                                        process="toxiproxy-backend"),
            NGINX_REPLICAS_CONFIG: nginx_config(ports, gateways=COMPOSE_REPLICAS.gateways),
            REPLICAS_COMPOSE: replicas_compose(ports),
            TRACING_COMPOSE: tracing_compose(ports)}


def write() -> list[Path]:
    written = []
    for path, text in generated().items():
        path.write_text(text)
        written.append(path)
    return written


def check() -> None:
    """Raise ConfigDrift for the first committed file that differs from the generator."""
    for path, text in generated().items():
        if not path.exists() or path.read_text() != text:
            raise ConfigDrift(path)
