"""One shape per kind (issue 41): an edge proxy is one module behind
EdgeProxy, listed once in the registry (streamlab/lab/proxies/__init__.py),
and whatever lists proxies reads the registry. These tests hold every
registered proxy to the whole interface, and keep the rest of the package
from naming a proxy of its own accord."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from streamlab.lab import compose_config
from streamlab.lab.compose import ComposeSettings
from streamlab.lab.proxies import PROXIES, PROXY_NAMES, EdgeProxy, ProxySetup, base, proxy_class
from streamlab.lab.proxies.idle import parse_duration
from streamlab.lab.topology import REPO_ROOT, Ports

DEFAULT = "nginx"
PACKAGE = REPO_ROOT / "streamlab"
REGISTRY = PACKAGE / "lab" / "proxies" / "__init__.py"


def lab_config(proxy: EdgeProxy, tmp_path: Path) -> str:
    """The lab's own config of the proxy, as a local lab writes it."""
    return proxy.write_config(ProxySetup(Ports.load(), tmp_path)).read_text()


def test_the_registry_lists_each_proxy_once_nginx_first() -> None:
    assert tuple(PROXIES) == PROXY_NAMES
    assert PROXY_NAMES[0] == DEFAULT
    assert all(proxy.name == name for name, proxy in PROXIES.items())
    assert PROXY_NAMES[1:] == compose_config.OTHER_PROXIES
    assert set(compose_config.HEALTH_PATHS) == set(PROXY_NAMES)
    with pytest.raises(ValueError, match=f"one of: {', '.join(PROXY_NAMES)}"):
        proxy_class("envoy")
    # The compose lab takes any registered proxy, and only those.
    for name in PROXY_NAMES:
        assert ComposeSettings(proxy=name).proxy == name
    with pytest.raises(ValidationError, match="envoy"):
        ComposeSettings(proxy="envoy")


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_every_proxy_carries_its_facts(name: str, tmp_path: Path) -> None:
    proxy_type = proxy_class(name)
    proxy = proxy_type()
    assert proxy.template().is_file()
    assert proxy.install_hint.strip()
    # The edge matrix: a fix (or why none is needed) for every probe nginx has.
    assert set(proxy_type.probe_fixes) == set(PROXIES[DEFAULT].probe_fixes)
    assert all(fix.text.strip() and isinstance(fix.is_directive, bool)
               for fix in proxy_type.probe_fixes.values())
    command = proxy_type.version_command("/usr/bin/x")
    assert command[0] == "/usr/bin/x"
    assert len(command) > 1
    assert proxy_type.version_line(f"{name} version 1.2.3\nmore\n") == f"{name} version 1.2.3"
    # Each directive's unit is one idle.py reads.
    for directive in proxy_type.idle_directives:
        assert parse_duration("1", directive.bare_unit) is not None, directive
    # The compose lab.
    assert proxy_type.compose_health_path.startswith("/")
    assert proxy_type.compose_build_args
    assert all(value.startswith(f"${{{key}:-") for key, value in
               proxy_type.compose_build_args.items())
    assert (REPO_ROOT / "proxies" / name / proxy_type.compose_config_name).is_file()


def test_nginx_compose_facts_are_compose_yamls() -> None:
    """nginx's service is compose.yaml's own, written by hand: its facts on
    the class must say what that file says."""
    service = yaml.safe_load(compose_config.COMPOSE_FILE.read_text())["services"]["nginx"]
    assert service["build"]["args"] == dict(PROXIES[DEFAULT].compose_build_args)
    assert compose_config.NGINX_CONFIG.is_file()


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_the_reload_bound_and_ceiling_are_in_the_lab_config_once(
    name: str, tmp_path: Path,
) -> None:
    """The edge matrix removes or changes these lines of the lab's config: a
    pattern that missed would measure the same config twice."""
    proxy_type = proxy_class(name)
    text = lab_config(proxy_type(), tmp_path)
    if proxy_type.reload_bound is not None:
        pattern, line = proxy_type.reload_bound
        assert len(pattern.findall(text)) == 1
        assert pattern.findall(pattern.sub(line(1), text)) == [line(1)]
    if proxy_type.ceiling_pattern is not None:
        assert len(proxy_type.ceiling_pattern.findall(text)) == 1


def test_traefik_version_is_its_version_line() -> None:
    output = "Version:      3.7.15\nCodename:     x\nGo version:   go1.24\n"
    assert proxy_class("traefik").version_line(output) == "Version: 3.7.15"


# ---- nothing else names a proxy ------------------------------------------------------

def named_proxies(path: Path) -> set[str]:
    """The proxies other than nginx a module names in code: a string constant
    that is the proxy's name ("haproxy", "HAProxy"), its class (HAProxy), or
    an import of its module. Comments and prose are not code, and a longer
    string ("proxies/haproxy/...") is not a choice of proxy."""
    others = {name: proxy_class(name) for name in PROXY_NAMES if name != DEFAULT}
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        for name, proxy in others.items():
            module = f"streamlab.lab.proxies.{name}"
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.lower() == name) \
                    or (isinstance(node, ast.Name) and node.id == proxy.__name__) \
                    or (isinstance(node, ast.Attribute) and node.attr == proxy.__name__) \
                    or (isinstance(node, ast.alias) and node.name in (proxy.__name__, module)) \
                    or (isinstance(node, ast.ImportFrom) and node.module == module):
                found.add(name)
    return found


def test_only_a_proxys_module_and_the_registry_name_it() -> None:
    """Adding a proxy touches its module, its template, its tests and one
    line of the registry: no other module of the package names one."""
    naming: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        names = named_proxies(path)
        if path == REGISTRY:
            continue
        names -= {path.stem} if path.parent == REGISTRY.parent else set()
        if names:
            naming[str(path.relative_to(REPO_ROOT))] = sorted(names)
    assert not naming, (
        f"these modules name a proxy other than {DEFAULT} outside its own module and the "
        f"registry ({REGISTRY.relative_to(REPO_ROOT)}); read it off the proxy's class "
        f"(EdgeProxy) or the registry (PROXIES) instead: {naming}")


def test_the_scan_sees_a_proxy_named_in_code(tmp_path: Path) -> None:
    """The scan above finds what it looks for, and not prose."""
    module = tmp_path / "m.py"
    module.write_text('"""Works with haproxy."""\n# caddy\nX = "proxies/haproxy/x"\n')
    assert named_proxies(module) == set()
    module.write_text('if proxy == "HAProxy":\n    pass\n')
    assert named_proxies(module) == {"haproxy"}
    module.write_text("from streamlab.lab.proxies.caddy import Caddy\n")
    assert named_proxies(module) == {"caddy"}
    module.write_text("from streamlab.lab import proxies\nproxies.traefik.Traefik()\n")
    assert named_proxies(module) == {"traefik"}


@pytest.mark.parametrize("name", PROXY_NAMES)
def test_an_installed_wheel_is_told_the_proxys_own_install_hint(
    name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a clone there is no scripts/install_proxies.sh: the message
    says the class's own command instead."""
    monkeypatch.setattr(base, "clone", lambda: None)
    proxy_type = proxy_class(name)
    message = str(base.not_installed(name, proxy_type.install_hint))
    assert message.endswith(f"Install it: {proxy_type.install_hint}")
