"""compose.yaml's "gpu" and "vllm" profiles, rendered as compose would (variables
interpolated, profiles selected) without a container engine: they leave the
default `up` alone, every name they use resolves, and the engines' settings parse."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from services.engine.settings import EngineSettings
from streamlab.lab.topology import REPO_ROOT

COMPOSE = REPO_ROOT / "compose.yaml"
DOCKERFILE = REPO_ROOT / "services" / "Dockerfile"
VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")
PROFILES = ("gpu", "vllm", "tracing")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}`, recursively."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise LookupError(f"${{{name}}} is required: {rest}")
        return rest if kind == "-" else ""

    return VARIABLE.sub(one, value)


def lab_env() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (REPO_ROOT / "lab.env").read_text().splitlines()
             if "=" in line and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def render(profiles: tuple[str, ...], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The services `docker compose --profile ... up` would start, interpolated."""
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    active = {name: s for name, s in services.items()
              if not s.get("profiles") or set(s["profiles"]) & set(profiles)}
    rendered: dict[str, Any] = interpolate(active, {**lab_env(), **(env or {})})
    return rendered


def stage(name: str) -> str:
    """The text of one stage of services/Dockerfile."""
    text = DOCKERFILE.read_text()
    match = re.search(rf"^FROM \S+ AS {re.escape(name)}\n(.*?)(?=^FROM |\Z)", text, re.M | re.S)
    assert match, f"services/Dockerfile has no stage {name}"
    return match.group(1)


def stage_env(name: str) -> dict[str, str]:
    body = stage(name).replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in body.splitlines():
        if line.startswith("ENV "):
            for pair in line[4:].split():
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def test_the_default_up_starts_no_profile_service_and_needs_none() -> None:
    default = render(())
    assert not any(s.get("profiles") for s in default.values())
    assert {"engine", "toxiproxy", "gateway", "nginx"} <= default.keys()
    for name, service in default.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in default, f"{name} needs {dependency}, which is in a profile"


@pytest.mark.parametrize("profile", PROFILES)
def test_each_profile_renders_and_every_name_it_uses_resolves(profile: str) -> None:
    services = render((profile,), {"STREAMLAB_MODEL_DIR": "/srv/models",
                                   "STREAMLAB_GPU_MODEL": "Qwen2.5-0.5B-Instruct"})
    added = {n for n, s in services.items() if s.get("profiles")}
    assert added, profile
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on {dependency}"
        target = service.get("build", {}).get("target")
        if target:
            stage(target)
    for name in added:
        for volume in services[name].get("volumes", []):
            assert volume == "/srv/models:/models:ro", name
        for key, value in services[name].get("environment", {}).items():
            assert "${" not in str(value), (name, key)


def test_gpu_engine_runs_the_hf_backend_on_a_reserved_gpu_with_the_mounted_model(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    services = render(("gpu",), {"STREAMLAB_MODEL_DIR": "/srv/models",
                                 "STREAMLAB_GPU_MODEL": "Llama-3.2-1B-Instruct"})
    engine = services["engine-gpu"]
    devices = engine["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    # The image's settings and the service's, as the engine would read them.
    env = {**stage_env("engine-gpu"), **engine["environment"]}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    settings = EngineSettings()
    assert settings.backend == "hf"
    assert settings.hf.model == "/models/Llama-3.2-1B-Instruct"
    assert settings.hf.device == "cuda"
    assert settings.hf.max_batch == 32
    assert settings.port == 50051
    assert env["HF_HUB_OFFLINE"] == "1"  # the mounted model, never the hub
    assert "pip install -r /tmp/hf.lock" in stage("engine-gpu")  # torch pinned, hashed
    assert _hop_target(services["gpu-hop"]) == f"engine-gpu:{settings.port}"


def test_vllm_engine_is_an_openai_client_of_the_vllm_server(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    services = render(("vllm",), {"STREAMLAB_GPU_MODEL": "Qwen2.5-7B-Instruct"})
    server = services["vllm"]
    command = server["command"]
    port = command[command.index("--port") + 1]
    served = command[command.index("--served-model-name") + 1]
    assert command[command.index("--model") + 1] == f"/models/{served}"
    assert server["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    engine = services["engine-vllm"]
    assert engine["depends_on"] == {"vllm": {"condition": "service_healthy"}}
    env = {**stage_env(engine["build"]["target"]), **engine["environment"]}
    for key, value in env.items():
        monkeypatch.setenv(key, str(value))
    settings = EngineSettings()
    assert settings.backend == "openai"
    assert settings.openai.base_url == f"http://vllm:{port}/v1"
    assert settings.openai.model == served == "Qwen2.5-7B-Instruct"
    assert _hop_target(services["vllm-hop"]) == f"engine-vllm:{settings.port}"


def test_the_hops_repoint_the_toxiproxy_engine_proxy_through_its_api() -> None:
    services = render(PROFILES)
    proxies = {p["name"] for p in json.loads(
        (REPO_ROOT / "proxies" / "toxiproxy" / "compose-backend.json").read_text())}
    api_port = re.search(r"-port=(\d+)", " ".join(render(PROFILES)["toxiproxy-backend"]
                                                   ["command"]))
    assert api_port
    for hop in ("gpu-hop", "vllm-hop"):
        script = services[hop]["entrypoint"][2]
        url = re.search(r'"http://toxiproxy-backend:(\d+)/proxies/([\w-]+)"', script)
        assert url, script
        assert url.group(1) == api_port.group(1)
        assert url.group(2) == "engine"
        assert url.group(2) in proxies
        assert services[hop]["depends_on"]["toxiproxy-backend"] == {
            "condition": "service_healthy"}
        compile(script, hop, "exec")  # the one-liner is Python


def test_a_required_variable_in_a_profile_would_break_the_default_up() -> None:
    """compose interpolates every service, even one whose profile is off, so a
    profile may only use variables with defaults (lab.env's keys aside)."""
    services: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    text = json.dumps({n: s for n, s in services.items() if s.get("profiles")})
    required = {m.group(1) for m in VARIABLE.finditer(text) if m.group(2) == "?"}
    assert required <= lab_env().keys()
    render(PROFILES, {})  # nothing required is missing


def _hop_target(service: dict[str, Any]) -> str:
    target: str = service["command"][0]
    return target


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("${SET:-d} ${EMPTY:-d} ${UNSET:-d} ${UNSET}", env) == "x d d "
    with pytest.raises(LookupError, match="UNSET"):
        interpolate("${UNSET:?needed}", env)
    assert interpolate({"a": ["${SET}"]}, env) == {"a": ["x"]}


def compose_cli() -> list[str] | None:
    """`docker compose` (v2) or `docker-compose` (v1.28+, which knows profiles)."""
    if shutil.which("docker") and subprocess.run(
            ["docker", "compose", "version"], capture_output=True, check=False).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.parametrize("profile", ["", *PROFILES])
def test_the_compose_cli_accepts_the_file_with_each_profile(profile: str) -> None:
    """compose's own schema and interpolation (needs no container engine). v1's
    `config` does not filter by profile, v2's does; both reject a bad key."""
    cli = compose_cli()
    if cli is None:
        pytest.skip("no `docker compose` or `docker-compose` here: the renders above still ran")
    args = [*cli, "--env-file", "lab.env", "-f", "compose.yaml",
            *(["--profile", profile] if profile else []), "config", "--quiet"]
    run = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "STREAMLAB_MODEL_DIR": "/srv/models",
                                           "STREAMLAB_GPU_MODEL": "Qwen2.5-0.5B-Instruct"})
    assert run.returncode == 0, run.stdout + run.stderr
