"""`streamlab up` as the README's first command runs it (`make up` calls it):
the CLI in its own process, nothing chosen, on ports and a run dir of its own.
The rest of the suite starts its labs with the wire set (STREAMLAB_GATEWAY_
ENGINE_WIRE, so a run can pick one), so this is the test that would notice if
a lab brought up plainly stopped speaking the gateway's default wire: a chat
streams through the edge, the engine holds the gateway's Session call, and
`streamlab down` stops every process it started. And each edge proxy given a
config it refuses, through `up` and `scenario matrix`: the proxy's own words,
printed as they are, and no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.gateway.settings import GatewaySettings
from streamlab.lab.processes import pid_alive
from streamlab.lab.proxies import PROXY_NAMES, ProxyNotInstalled, edge_proxy
from tests.integration.conftest import free_lab_ports
from tests.integration.test_proxies import BAD_CONFIGS
from tests.wait import wait_until

pytestmark = pytest.mark.integration

DEFAULT_WIRE = GatewaySettings.model_fields["engine_wire"].default


def engine_sessions(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5.0).text
    for line in text.splitlines():
        if line.startswith("streamlab_engine_sessions "):
            return float(line.split()[1])
    raise AssertionError("the engine exports no streamlab_engine_sessions")


def test_a_plain_streamlab_up_speaks_the_default_wire_and_down_stops_it(
        tmp_path: Path) -> None:
    if os.environ.get("STREAMLAB_TARGET") == "compose":
        pytest.skip("the local lab's CLI; the compose target is brought up by its script")
    assert DEFAULT_WIRE == "multiplexed"  # what the docs and CI's split say it is
    ports = free_lab_ports()
    # Nothing chosen: no service setting from this shell (a run of the suite
    # on the other wire sets one), only the ports, so it runs beside the
    # suite's own lab.
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("STREAMLAB_GATEWAY_", "STREAMLAB_ENGINE_"))}
    env.update({f"STREAMLAB_{name.upper()}": str(value)
                for name, value in ports.model_dump().items() if name.endswith("_port")})
    run_dir = tmp_path / "run"
    cli = [sys.executable, "-m", "streamlab.cli"]
    up = subprocess.run([*cli, "up", "--run-dir", str(run_dir)], env=env, capture_output=True,
                        text=True, timeout=180, check=False)
    try:
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        state = json.loads((run_dir / "state.json").read_text())
        pids = [service["pid"] for service in state["services"].values()]
        with httpx.stream("POST", f"http://127.0.0.1:{ports.edge_port}/v1/chat/completions",
                          json={"stream": True, "max_tokens": 3,
                                "messages": [{"role": "user", "content": "hi"}]},
                          timeout=30.0) as response:
            assert response.status_code == 200
            data = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "data: [DONE]"
        # A gateway on the multiplexed wire holds one Session call per engine
        # while it runs; on per_request the engine would count none.
        assert engine_sessions(ports.engine_metrics_port) >= 1, \
            "no Session open: a plain `streamlab up` speaks per_request"
    finally:
        down = subprocess.run([*cli, "down", "--run-dir", str(run_dir)], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
    assert down.returncode == 0, down.stderr[-2000:]
    wait_until(lambda: not any(pid_alive(pid) for pid in pids), timeout_s=15.0,
               what="every process of the lab gone after `streamlab down`")


# What each proxy itself says of tests/integration/test_proxies.py's BAD_CONFIGS:
# nginx's `[emerg]` vanished when read as rich markup, HAProxy's
# `[/path/haproxy.cfg:3]` crashed the CLI with a MarkupError.
OWN_WORDS = {
    "nginx": ['[emerg] invalid value "maybe" in "proxy_buffering" directive'],
    "haproxy": ["[ALERT]", "haproxy.cfg:3]", "(got 'sever')"],
    "caddy": ["Error: adapting config using caddyfile", "bad duration value 'soon'"],
    "traefik": ["nowhere@file", "does not exist"],
}
REFUSING_COMMANDS = {
    # `up` checks the config before it starts the proxy (Traefik, which has no
    # check, says so in its log while it starts: its errors end the wait).
    "up": lambda run_dir: ["up", "--run-dir", str(run_dir), "--no-console"],
    # The matrix starts a lab of its own with the user's config: the cell says why not.
    "scenario matrix": lambda run_dir: ["scenario", "matrix", "--probe", "reload"],
}


@pytest.mark.parametrize("command", list(REFUSING_COMMANDS))
@pytest.mark.parametrize("proxy", PROXY_NAMES)
def test_a_config_the_proxy_refuses_is_printed_as_the_proxy_wrote_it(
        proxy: str, command: str, tmp_path: Path) -> None:
    """Text from outside (a proxy's refusal) is printed literally, whole, by
    each command that starts a proxy on a user's config: exit 1, the proxy's
    own words, no traceback."""
    if os.environ.get("STREAMLAB_TARGET") == "compose":
        pytest.skip("the local lab's CLI; the compose target is brought up by its script")
    try:
        edge_proxy(proxy).find()
    except ProxyNotInstalled as exc:
        pytest.skip(str(exc))
    ports = free_lab_ports()
    env = {**os.environ, "COLUMNS": "1000",
           **{f"STREAMLAB_{name.upper()}": str(value)
              for name, value in ports.model_dump().items() if name.endswith("_port")}}
    config = tmp_path / f"bad-{proxy}.conf"
    config.write_text(BAD_CONFIGS[proxy][0])
    args = REFUSING_COMMANDS[command](tmp_path / "run")
    done = subprocess.run([sys.executable, "-m", "streamlab.cli", *args, "--proxy", proxy,
                           "--proxy-config", str(config)],
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert "Traceback" not in said, said[-3000:]
    for words in OWN_WORDS[proxy]:
        assert words in said, f"{words!r} not shown:\n{said[-3000:]}"
    if command == "up":
        assert "streamlab up failed:" in done.stderr
