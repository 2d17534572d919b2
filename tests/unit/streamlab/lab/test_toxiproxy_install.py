"""`streamlab install toxiproxy` (streamlab/lab/toxiproxy_install.py) without
building anything: which Go it accepts and what it says of one it cannot use
(a fake `go` on PATH), the build's key as scripts/build_toxiproxy.sh names it,
and a second install that finds the build there. scripts/check_wheel.sh runs
the real build (CI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamlab import paths
from streamlab.cli import app
from streamlab.lab.toxiproxy_install import (
    TOXIPROXY_VERSION,
    ToolMissing,
    build_key,
    install_toxiproxy,
    parse_go_version,
    suitable_go,
)

ROOT = Path(__file__).resolve().parents[4]


def fake_go(directory: Path, version: str, toolchain: str = "local") -> dict[str, str]:
    """A PATH whose only `go` answers `go env GOVERSION GOTOOLCHAIN` so."""
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(f'#!/bin/sh\n[ "$1" = env ] && printf "%s\\n%s\\n" "{version}" '
                  f'"{toolchain}" && exit 0\nexit 1\n')
    go.chmod(0o755)
    return {"PATH": str(directory)}


@pytest.mark.parametrize(("text", "version"), [
    ("go1.23.4", (1, 23)), ("go version go1.19.8 linux/amd64", (1, 19)),
    ("go1.26.0-X:nocoverageredesign", (1, 26)), ("devel", None)])
def test_go_versions_are_read(text: str, version: tuple[int, int] | None) -> None:
    assert parse_go_version(text) == version


def test_no_go_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing) as missing:
        suitable_go({"PATH": str(tmp_path)}, tmp_path)
    said = str(missing.value)
    assert "no `go` on PATH" in said
    assert "Go >= 1.23" in said
    assert "GOTOOLCHAIN=go1.23.0 streamlab install toxiproxy" in said


def test_debians_go_is_too_old_and_cannot_fetch_one(tmp_path: Path) -> None:
    with pytest.raises(ToolMissing) as missing:
        suitable_go(fake_go(tmp_path, "go1.19.8", ""), tmp_path)
    said = str(missing.value)
    assert "is go1.19.8" in said
    assert "needs Go >= 1.23" in said
    assert "with Go 1.21 or later, let Go fetch the toolchain itself" in said


def test_a_go_that_may_fetch_the_toolchain_is_enough(tmp_path: Path) -> None:
    said: list[str] = []
    go, version = suitable_go(fake_go(tmp_path, "go1.22.5", "auto"), tmp_path, said.append)
    assert go == str(tmp_path / "go")
    assert "GOTOOLCHAIN=auto" in version
    assert "go1.23.0" in said[0]
    # The same Go told not to fetch one (GOTOOLCHAIN=local, as Debian's packages set).
    with pytest.raises(ToolMissing, match="GOTOOLCHAIN=local, which lets it fetch none"):
        suitable_go(fake_go(tmp_path, "go1.22.5", "local"), tmp_path)


def test_a_new_enough_go_is_taken(tmp_path: Path) -> None:
    assert suitable_go(fake_go(tmp_path, "go1.23.0"), tmp_path)[1] == "go1.23.0"


def test_the_build_is_named_as_the_script_names_it() -> None:
    script = (ROOT / "scripts" / "build_toxiproxy.sh").read_text()
    assert f'VERSION="${{TOXIPROXY_VERSION:-{TOXIPROXY_VERSION}}}"' in script
    assert f'TOXIPROXY_VERSION="${{TOXIPROXY_VERSION:-{TOXIPROXY_VERSION}}}"' in \
        (ROOT / "scripts" / "install.sh").read_text()
    patches = ROOT / "proxies" / "toxiproxy" / "patches"
    digest = subprocess.run(
        f'cat "{patches}/interruptible-sends.patch" "{patches}/blocked_writer_test.go" '
        "| sha256sum | cut -c1-12", shell=True, capture_output=True, text=True,
        check=True).stdout.strip()
    assert build_key() == f"{TOXIPROXY_VERSION}-{digest}"
    # The compose image's patched stage builds the same version (proxies/toxiproxy/Dockerfile).
    assert f"ARG TOXIPROXY_VERSION={TOXIPROXY_VERSION}" in \
        (ROOT / "proxies" / "toxiproxy" / "Dockerfile").read_text()


def test_a_build_already_there_is_not_built_again(tmp_path: Path) -> None:
    for name in paths.TOXIPROXY_BINARIES:
        (tmp_path / name).write_text("")
    (tmp_path / f".toxiproxy-{build_key()}").touch()
    # No Go at all: nothing is built, so none is asked for.
    done = install_toxiproxy(tmp_path, env={"PATH": str(tmp_path / "no-go")})
    assert not done.built
    assert done.server == tmp_path / "toxiproxy-server"
    # Another patch's stamp: built again, which needs Go.
    (tmp_path / f".toxiproxy-{build_key()}").rename(tmp_path / ".toxiproxy-v2.12.0-older")
    with pytest.raises(ToolMissing):
        install_toxiproxy(tmp_path, env={"PATH": str(tmp_path / "no-go")})


def test_the_command_exits_2_with_the_message_when_no_go_will_do(tmp_path: Path) -> None:
    fake_go(tmp_path / "bin", "go1.19.8", "")
    result = CliRunner().invoke(app, ["install", "toxiproxy", "--dir", str(tmp_path / "out")],
                                env={"PATH": str(tmp_path / "bin"), "COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert "needs Go >= 1.23" in result.output
    assert not (tmp_path / "out").exists()  # nothing made before the answer
