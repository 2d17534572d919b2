"""compose's `tracing` profile (docs/tracing.md): compose.yaml's `jaeger`
service in the profile, run as the local lab runs it (the same config, ports
from lab.env), and compose.tracing.yaml, generated, pointing the gateway and
the engine at it; without the override nothing traces."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest
import yaml

from services.common.tracing import tracing_configured
from streamlab.lab import compose_config, jaeger
from streamlab.lab.topology import REPO_ROOT
from tests.unit.streamlab.lab.test_compose_profiles import compose_cli, lab_env, render

DOCKERFILE = REPO_ROOT / "proxies" / "jaeger" / "Dockerfile"


def override() -> dict[str, Any]:
    services: dict[str, Any] = yaml.safe_load(
        compose_config.TRACING_COMPOSE.read_text())["services"]
    return services


def test_jaeger_is_in_the_profile_only_and_runs_the_local_labs_config() -> None:
    assert "jaeger" not in render(())
    service = render(("tracing",))["jaeger"]
    assert service["profiles"] == ["tracing"]
    ports = compose_config.container_ports()
    env = service["environment"]
    # The ${env:...} names jaeger.yaml reads, as the local lab sets them
    # (jaeger.environment), with every interface of the container.
    assert set(env) == set(jaeger.environment(ports))
    assert env["STREAMLAB_HOST"] == "0.0.0.0"
    assert int(env["STREAMLAB_JAEGER_OTLP_PORT"]) == ports.jaeger_otlp_port
    assert int(env["STREAMLAB_JAEGER_QUERY_PORT"]) == ports.jaeger_query_port
    published = {int(entry.rsplit(":", 1)[1]) for entry in service["ports"]}
    assert published == {ports.jaeger_otlp_port, ports.jaeger_query_port}
    assert service["healthcheck"]["test"][1:] == [
        "/usr/local/bin/streamlab-proxy-health", str(ports.jaeger_query_port), "/api/services"]


def test_the_image_builds_the_pinned_jaeger_with_the_labs_config() -> None:
    text = DOCKERFILE.read_text()
    assert f"ARG JAEGER_VERSION={jaeger.VERSION}" in text
    assert "go mod download -json \"$module@$JAEGER_VERSION\"" in text
    assert re.search(r"^COPY proxies/jaeger/jaeger\.yaml /etc/streamlab/jaeger\.yaml$", text,
                     re.M)
    assert 'CMD ["--config", "file:/etc/streamlab/jaeger.yaml"]' in text


def test_the_override_traces_the_gateway_and_engine_into_jaeger() -> None:
    ports = compose_config.container_ports()
    services = override()
    assert set(services) == {"engine", "gateway"}
    for name, service in services.items():
        env = service["environment"]
        assert tracing_configured(env), name
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://jaeger:{ports.jaeger_otlp_port}"
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == f"service.instance.id={name}"
        assert env["STREAMLAB_LOG_FORMAT"] == "json"
        assert service["depends_on"] == {"jaeger": {"condition": "service_healthy"}}


def test_without_the_override_nothing_traces() -> None:
    """The profile alone starts Jaeger; the services' own env files and
    compose.yaml's environment name no endpoint, so the SDK is never imported."""
    services = render(("tracing",))
    for name in ("engine", "gateway"):
        env = {k: str(v) for k, v in services[name].get("environment", {}).items()}
        for env_file in services[name].get("env_file", []):
            pairs = (line.split("=", 1) for line in (REPO_ROOT / env_file).read_text()
                     .splitlines() if "=" in line and not line.lstrip().startswith("#"))
            env.update({k.strip(): v.strip() for k, v in pairs})
        assert not tracing_configured(env), name


def test_the_compose_cli_accepts_the_profile_with_the_override() -> None:
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` or `docker-compose` here: the renders above still ran")
    run = subprocess.run(
        [*cli, "--env-file", "lab.env", "-f", "compose.yaml", "-f", "compose.tracing.yaml",
         "--profile", "tracing", "config"], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, **lab_env()})
    assert run.returncode == 0, run.stdout + run.stderr
    merged = yaml.safe_load(run.stdout)["services"]
    assert "jaeger" in merged
    assert merged["gateway"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith(
        "http://jaeger:")
    # The base's own environment is kept beside the override's.
    assert "STREAMLAB_GATEWAY_ENGINE_TARGET" in merged["gateway"]["environment"]
