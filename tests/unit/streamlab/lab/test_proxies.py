"""The edge proxies' pure parts: placeholders, idle-timeout reading, choice,
command lines and state (no proxy started; tests/integration/test_proxies.py
runs them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streamlab.lab.local import Lab, LabOptions
from streamlab.lab.proxies import PROXY_NAMES, ProxySetup, edge_proxy
from streamlab.lab.proxies.caddy import Caddy
from streamlab.lab.proxies.haproxy import HAProxy
from streamlab.lab.proxies.idle import cuts_streams, fill, idle_timeouts, parse_duration
from streamlab.lab.proxies.nginx import substitute
from streamlab.lab.proxies.traefik import Traefik
from streamlab.lab.topology import Ports

# Each proxy's placeholder style, as its own templating reads it.
STYLES = {"haproxy": r"\$\{(\w+)\}", "caddy": r"\{\$(\w+)\}",
          "traefik": r"\{\{\s*env\s+\"(\w+)\"\s*\}\}"}


def setup(tmp_path: Path, **kwargs: object) -> ProxySetup:
    return ProxySetup(Ports.load(), tmp_path, **kwargs)  # type: ignore[arg-type]


def test_the_placeholders_carry_the_lab_addresses_and_timeouts_in_ms(tmp_path: Path) -> None:
    ports = Ports.load()
    env = setup(tmp_path, read_timeout_s=60.0, short_read_timeout_s=1.5).environment()
    assert env["STREAMLAB_LISTEN"] == f"{ports.host}:{ports.nginx_port}"
    assert env["STREAMLAB_UPSTREAM"] == f"{ports.host}:{ports.upstream_port}"
    assert env["STREAMLAB_READ_TIMEOUT"] == "60000ms"
    assert env["STREAMLAB_SHORT_READ_TIMEOUT"] == "1500ms"


@pytest.mark.parametrize("name", sorted(STYLES))
def test_every_template_placeholder_is_one_the_lab_sets(name: str, tmp_path: Path) -> None:
    proxy = edge_proxy(name)
    text = proxy.template().read_text()
    used = set(re.findall(STYLES[name], text))
    # Traefik's listener is its command line (the static config), not the file.
    assert {"STREAMLAB_UPSTREAM"} <= used
    listens = bool(used & {"STREAMLAB_LISTEN", "STREAMLAB_LISTEN_PORT"})
    assert listens != (name == "traefik")
    assert used <= set(proxy.environment(setup(tmp_path))), used


def test_nginx_user_config_substitutes_only_the_lab_names() -> None:
    values = {"STREAMLAB_UPSTREAM": "127.0.0.1:1", "STREAMLAB_LISTEN": "127.0.0.1:2"}
    text = "listen ${STREAMLAB_LISTEN}; proxy_pass http://${STREAMLAB_UPSTREAM}; $host ${x}"
    assert substitute(text, values) == ("listen 127.0.0.1:2; proxy_pass http://127.0.0.1:1; "
                                        "$host ${x}")
    with pytest.raises(KeyError, match="STREAMLAB_UPSTRAEM"):
        substitute("proxy_pass http://${STREAMLAB_UPSTRAEM};", values)


@pytest.mark.parametrize(("text", "unit", "seconds"), [
    ("2s", "s", 2.0), ("90", "s", 90.0), ("1500", "ms", 1.5), ("1500ms", "s", 1.5),
    ("1m30s", "ns", 90.0), ("soon", "s", None), ("2x", "s", None)])
def test_durations_in_each_proxy_unit(text: str, unit: str, seconds: float | None) -> None:
    assert parse_duration(text, unit) == seconds


def test_fill_reads_each_placeholder_style() -> None:
    values = {"STREAMLAB_SHORT_READ_TIMEOUT": "1000ms"}
    assert fill('timeout server "${STREAMLAB_SHORT_READ_TIMEOUT}"', values) == \
        'timeout server "1000ms"'
    assert fill("read_timeout {$STREAMLAB_SHORT_READ_TIMEOUT}", values) == "read_timeout 1000ms"
    assert fill('t: {{ env "STREAMLAB_SHORT_READ_TIMEOUT" }}', values) == "t: 1000ms"


def test_idle_timeouts_name_the_directive_and_line() -> None:
    nginx = "http {\n  location / {\n    proxy_read_timeout 1s;\n    send_timeout 30s;\n  }\n}\n"
    found = idle_timeouts("nginx", nginx)
    assert [(t.directive, t.seconds, t.line) for t in found] == [
        ("proxy_read_timeout", 1.0, 3), ("send_timeout", 30.0, 4)]
    assert [t.directive for t in cuts_streams("nginx", nginx, 2.5)] == ["proxy_read_timeout"]
    assert "proxy_read_timeout" in found[0].describe()
    assert "line 3" in found[0].describe()

    haproxy = "defaults\n  timeout client 30s\n  timeout server 800\n  timeout connect 1s\n"
    assert [(t.directive, t.seconds) for t in cuts_streams("haproxy", haproxy, 2.5)] == [
        ("timeout server", 0.8)]
    caddy = "reverse_proxy x {\n\ttransport http {\n\t\tread_timeout 1m\n\t}\n}\n"
    assert cuts_streams("caddy", caddy, 2.5) == []
    assert idle_timeouts("caddy", caddy)[0].seconds == 60.0
    assert idle_timeouts("traefik", "forwardingTimeouts:\n  dialTimeout: 1s\n") == []


def test_the_lab_template_short_timeout_is_the_one_that_cuts(tmp_path: Path) -> None:
    """Read through the placeholders, each lab template's short location cuts
    a 2.5 s pause and its streaming one does not."""
    for name in ("haproxy", "caddy"):
        proxy = edge_proxy(name)
        env = proxy.environment(setup(tmp_path, short_read_timeout_s=1.0))
        cutting = cuts_streams(name, fill(proxy.template().read_text(), env), 2.5)
        assert [t.seconds for t in cutting] == [1.0], name


def test_choosing_a_proxy() -> None:
    assert isinstance(edge_proxy("haproxy"), HAProxy)
    assert isinstance(edge_proxy("caddy"), Caddy)
    assert isinstance(edge_proxy("traefik"), Traefik)
    assert edge_proxy("nginx", gateways=3).name == "nginx"
    with pytest.raises(ValueError, match="one of: nginx, haproxy, caddy, traefik"):
        edge_proxy("envoy")
    with pytest.raises(ValueError, match="--proxy nginx"):
        edge_proxy("caddy", gateways=2)
    assert PROXY_NAMES[0] == "nginx"


def test_command_lines_and_checks(tmp_path: Path) -> None:
    s = setup(tmp_path)
    config = tmp_path / "c"
    assert HAProxy().check_command("haproxy", config, s) == ["haproxy", "-c", "-f", str(config)]
    assert Caddy().check_command("caddy", config, s)[:2] == ["caddy", "validate"]
    assert Traefik().check_command("traefik", config, s) is None
    assert f"--entryPoints.web.address={s.listen}" in Traefik().command("traefik", config, s)
    assert HAProxy().reload_command("haproxy", config, s, 42) == ["kill", "-USR2", "42"]
    nginx = edge_proxy("nginx")
    assert nginx.check_command("nginx", config, s) is None  # the lab's own template
    assert nginx.check_command("nginx", config, setup(tmp_path, user_config=config)) == [
        "nginx", "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(config)]
    assert nginx.health_path(s) == "/nginx-health"
    assert nginx.health_path(setup(tmp_path, user_config=config)) == "/readyz"


def test_traefik_startup_errors_are_its_error_lines() -> None:
    log = ("2026-12-02T03:09:42Z INF Starting provider *file.Provider\n"
           "\x1b[90m2026-12-02T03:09:42Z\x1b[0m \x1b[31mERR\x1b[0m error=\"the service "
           "\\\"nowhere@file\\\" does not exist\" routerName=mine@file\n"
           '{"level":"error","msg":"bad"}\n')
    errors = Traefik().startup_errors(log)
    assert len(errors) == 2
    assert "nowhere@file" in errors[0]
    assert HAProxy().startup_errors(log) == []


def test_the_lab_keeps_its_proxy_in_state(tmp_path: Path) -> None:
    config = tmp_path / "mine.cfg"
    lab = Lab(Ports.load(), LabOptions(run_dir=tmp_path, proxy="haproxy", proxy_config=config))
    assert lab.edge_proxy == "haproxy"
    assert lab.proxy_config_path == tmp_path / "haproxy" / "haproxy.cfg"
    assert "nginx" not in (lab.logs or {})  # HAProxy logs to its stdout
    lab.save_state()
    state = json.loads((tmp_path / "state.json").read_text())
    assert (state["proxy"], state["proxy_config"]) == ("haproxy", str(config))
    attached = Lab.attach(tmp_path)
    assert attached.edge_proxy == "haproxy"
    assert attached.options.proxy_config == config
    # A lab saved before there was a choice of proxy is an nginx lab.
    del state["proxy"], state["proxy_config"]
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert Lab.attach(tmp_path).edge_proxy == "nginx"
