"""compose.yaml and its generated proxy configs agree with lab.env's one definition."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from streamlab.lab import compose_config
from streamlab.lab.compose import ComposeSettings
from streamlab.lab.topology import HOP_NAMES, REPO_ROOT, Ports, ToxiproxyRuntime, hops
from tests.unit.streamlab.lab.test_compose_profiles import interpolate, lab_env

COMPOSE = REPO_ROOT / "compose.yaml"
PUBLISHED = re.compile(r"^\$\{STREAMLAB_HOST:-127\.0\.0\.1\}:\$\{(STREAMLAB_\w+):\?[^}]*\}:(\d+)$")
# Which lab.env port each published container port stands for.
PORT_KEYS = {
    "STREAMLAB_EDGE_PORT": "edge_port",
    "STREAMLAB_EDGE_H2_PORT": "edge_h2_port",
    "STREAMLAB_NGINX_PORT": "nginx_port",
    "STREAMLAB_NGINX_H2_PORT": "nginx_h2_port",
    "STREAMLAB_UPSTREAM_PORT": "upstream_port",
    "STREAMLAB_ENGINE_PROXY_PORT": "engine_proxy_port",
    "STREAMLAB_TOXIPROXY_API_PORT": "toxiproxy_api_port",
    "STREAMLAB_TOXIPROXY_BACKEND_API_PORT": "toxiproxy_backend_api_port",
    "STREAMLAB_GATEWAY_PORT": "gateway_port",
    "STREAMLAB_ENGINE_PORT": "engine_port",
    "STREAMLAB_ENGINE_METRICS_PORT": "engine_metrics_port",
    "STREAMLAB_CONSOLE_PORT": "console_port",
    "STREAMLAB_JAEGER_OTLP_PORT": "jaeger_otlp_port",
    "STREAMLAB_JAEGER_QUERY_PORT": "jaeger_query_port",
}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return loaded


def test_committed_configs_match_the_generator() -> None:
    compose_config.check()  # raises ConfigDrift naming the stale file


def test_drift_is_reported_with_the_file_and_the_fix() -> None:
    stale = REPO_ROOT / "proxies" / "toxiproxy" / "compose.json"
    error = compose_config.ConfigDrift(stale)
    assert "proxies/toxiproxy/compose.json" in str(error)
    assert "streamlab compose config" in str(error)


def test_each_hop_points_at_the_service_behind_it() -> None:
    ports = compose_config.container_ports()
    specs = {s.name: s for s in compose_config.toxiproxy_specs(ports)}
    served = {process: {s.name for s in compose_config.toxiproxy_specs(ports, process=process)}
              for process in compose_config.TOXIPROXY_CONFIGS}
    assert served == {"toxiproxy": {"edge", "edge-h2"},
                      "toxiproxy-backend": {"upstream", "engine"}}
    assert specs["edge"].upstream == f"nginx:{ports.nginx_port}"
    assert specs["edge-h2"].upstream == f"nginx:{ports.nginx_h2_port}"
    assert specs["upstream"].upstream == f"gateway:{ports.gateway_port}"
    assert specs["engine"].upstream == f"engine:{ports.engine_port}"
    assert {s.listen for s in specs.values()} == {
        f"0.0.0.0:{h.listen_port}" for h in hops(ports)}


def test_nginx_reaches_the_gateway_through_toxiproxy() -> None:
    ports = compose_config.container_ports()
    text = compose_config.nginx_config(ports)
    assert f"server toxiproxy-backend:{ports.upstream_port};" in text
    assert f"listen 0.0.0.0:{ports.nginx_port} sndbuf=32k;" in text
    assert "{{" not in text


def test_container_ports_ignore_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMLAB_EDGE_PORT", "9999")
    assert compose_config.container_ports().edge_port != 9999


def test_published_ports_are_lab_env_ports_on_both_sides(services: dict[str, Any]) -> None:
    ports = compose_config.container_ports().model_dump()
    published: dict[str, int] = {}
    for service in services.values():
        for entry in service.get("ports", []):
            match = PUBLISHED.match(entry)
            assert match, f"not published on 127.0.0.1 from a lab.env port: {entry}"
            published[match.group(1)] = int(match.group(2))
    assert published.keys() == PORT_KEYS.keys()
    for variable, container_port in published.items():
        assert ports[PORT_KEYS[variable]] == container_port, variable


def test_every_service_is_checked_ordered_and_has_an_init(services: dict[str, Any]) -> None:
    for name, service in services.items():
        assert service.get("init") is True, name
        check = service["healthcheck"]
        assert check.get("test") or check.get("disable"), name
        # podman's compat API splits CMD arguments on spaces: one word each.
        assert not any(" " in word for word in check.get("test", [])[1:]), name
        for dependency in service.get("depends_on", {}).values():
            assert dependency == {"condition": "service_healthy"}, name


def test_gateway_calls_the_engine_through_the_engine_hop(services: dict[str, Any]) -> None:
    ports = compose_config.container_ports()
    target = services["gateway"]["environment"]["STREAMLAB_GATEWAY_ENGINE_TARGET"]
    assert target == f"toxiproxy-backend:{ports.engine_proxy_port}"


def test_compose_argv_names_file_and_project() -> None:
    settings = ComposeSettings(command="docker-compose", project="lab-1",
                               file=Path("/repo/compose.yaml"))
    assert settings.argv("stop", "engine") == [
        "docker-compose", "-f", "/repo/compose.yaml", "-p", "lab-1", "stop", "engine"]
    assert ComposeSettings(command="docker compose", project="").argv("ps")[:3] == [
        "docker", "compose", "-f"]


def test_hop_names_are_the_hops_in_order() -> None:
    assert tuple(h.name for h in hops(Ports.load())) == HOP_NAMES


def test_compose_tls_names_the_services_and_points_nginx_at_the_mount(tmp_path: Path) -> None:
    made = compose_config.write_tls(tmp_path)
    snippet = made.nginx_snippet.read_text()
    port = compose_config.container_ports().nginx_h2_port
    assert f"listen 0.0.0.0:{port} ssl http2;" in snippet
    assert f"ssl_certificate {compose_config.CONTAINER_TLS_DIR}/server.pem;" in snippet
    assert f"include {compose_config.CONTAINER_TLS_DIR}/nginx-h2*.conf;" in (
        compose_config.nginx_config(compose_config.container_ports()))
    names = x509.load_pem_x509_certificate(made.server_cert.read_bytes()).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"toxiproxy", "nginx", "localhost"} <= set(names.get_values_for_type(x509.DNSName))


def test_nginx_mounts_the_tls_dir_and_both_edges_are_published(services: dict[str, Any]) -> None:
    assert any(v.endswith(":/etc/streamlab/tls:ro") for v in services["nginx"]["volumes"])
    published = " ".join(services["toxiproxy"]["ports"])
    assert "STREAMLAB_EDGE_H2_PORT" in published


# ---- the replicas' compose lab (compose.replicas.yaml) ---------------------------------
def test_replicas_override_adds_second_replicas_and_redis_checked_with_an_init() -> None:
    override = yaml.safe_load(compose_config.REPLICAS_COMPOSE.read_text())["services"]
    for name in ("gateway-2", "engine-2", "redis"):
        service = override[name]
        assert service["init"] is True, name
        assert service["healthcheck"]["test"], name
    ports = compose_config.container_ports()
    # Each replica published at its replica port (topology.py's rule), a variable of its own.
    step = ports.replica_port_step
    assert override["engine-2"]["ports"] == [
        f"${{STREAMLAB_HOST:-127.0.0.1}}:${{STREAMLAB_ENGINE_2_PORT:-{ports.engine_port + step}}}"
        f":{ports.engine_port}",
        f"${{STREAMLAB_HOST:-127.0.0.1}}:${{STREAMLAB_ENGINE_METRICS_2_PORT:-"
        f"{ports.engine_metrics_port + step}}}:{ports.engine_metrics_port}"]
    assert override["gateway-2"]["ports"] == [
        f"${{STREAMLAB_HOST:-127.0.0.1}}:${{STREAMLAB_GATEWAY_2_PORT:-{ports.gateway_port + step}}}"
        f":{ports.gateway_port}"]
    gateway_env = override["gateway-2"]["environment"]
    # The same wiring, each with its own job tag (nginx routes a job's polls by it).
    assert override["gateway"]["environment"].pop("STREAMLAB_GATEWAY_JOB_ROUTE") == "g1"
    assert gateway_env["STREAMLAB_GATEWAY_JOB_ROUTE"] == "g2"
    # ... but Redis through a store hop of its own (one replica cut alone).
    first_env = override["gateway"]["environment"]
    assert first_env.pop("STREAMLAB_GATEWAY_REDIS_URL") == (
        f"redis://toxiproxy-backend:{ports.store_proxy_port}/0")
    assert gateway_env["STREAMLAB_GATEWAY_REDIS_URL"] == (
        f"redis://toxiproxy-backend:{ports.store_proxy_port + step}/0")
    assert gateway_env == {**gateway_env, **first_env}
    assert gateway_env["STREAMLAB_GATEWAY_ENGINE_TARGET"] == (
        f"toxiproxy-backend:{ports.engine_proxy_port},"
        f"toxiproxy-backend:{ports.engine_proxy_port + ports.replica_port_step}")


def test_each_replica_hop_leads_to_its_own_container_on_the_base_port() -> None:
    ports = compose_config.container_ports()
    specs = {s.name: s.upstream for s in
             compose_config.toxiproxy_specs(ports, compose_config.COMPOSE_REPLICAS)}
    assert specs["upstream-2"] == f"gateway-2:{ports.gateway_port}"
    assert specs["engine-2"] == f"engine-2:{ports.engine_port}"
    assert specs["store"] == specs["store-2"] == f"redis:{ports.redis_port}"
    nginx_conf = compose_config.NGINX_REPLICAS_CONFIG.read_text()
    step = ports.replica_port_step
    assert (f"least_conn;\n    server toxiproxy-backend:{ports.upstream_port} max_fails=0;\n"
            f"    server toxiproxy-backend:{ports.upstream_port + step} max_fails=0;") in nginx_conf


def test_both_toxiproxy_containers_run_as_the_local_lab_does(
        services: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """GOMAXPROCS and LOG_LEVEL from lab.env, as local.py passes them."""
    for key in ("STREAMLAB_TOXIPROXY_GOMAXPROCS", "STREAMLAB_TOXIPROXY_LOG_LEVEL"):
        monkeypatch.delenv(key, raising=False)
    want = ToxiproxyRuntime().environment()
    for name in compose_config.TOXIPROXY_CONFIGS:
        assert interpolate(services[name]["environment"], lab_env()) == want, name
