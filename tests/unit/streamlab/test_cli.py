"""The `streamlab` entry point's own options: the version, and shell completion."""

from __future__ import annotations

import tomllib
from pathlib import Path

from typer.testing import CliRunner

from streamlab.cli import app, package_version

runner = CliRunner()
PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def test_version_prints_the_package_version_and_exits() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert package_version() == declared  # the editable install reads pyproject's
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"streamlab {declared}"


def test_version_wins_over_a_command() -> None:
    """Eager: `--version` answers before any command would run (no lab is started)."""
    result = runner.invoke(app, ["--version", "status"])
    assert result.exit_code == 0
    assert result.output.startswith("streamlab ")


def test_shell_completion_is_offered() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "--install-completion" in result.output
    assert "--show-completion" in result.output


def test_no_arguments_still_shows_the_help() -> None:
    result = runner.invoke(app, [])
    assert "Usage" in result.output
    assert "up" in result.output
