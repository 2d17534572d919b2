"""`streamlab`: bring the lab up, break it on purpose, measure it, take it down."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from streamlab.commands import (
    bench,
    check,
    compose,
    console,
    conventions,
    install,
    lab,
    logs,
    scenario,
    soak,
    toxic,
    trace,
)
from streamlab.commands.exits import EXIT_STATUS_HELP

# Shell completion: `streamlab --install-completion` (bash, zsh, fish, PowerShell).
app = typer.Typer(help=__doc__, epilog=EXIT_STATUS_HELP, no_args_is_help=True,
                  add_completion=True)
# Lab lifecycle: up, down, status, chat (top-level commands).
app.registered_commands.extend(lab.app.registered_commands)
app.registered_commands.extend(logs.app.registered_commands)
# Families of commands register here, one line each:
app.registered_commands.extend(soak.app.registered_commands)
app.registered_commands.extend(console.app.registered_commands)
app.registered_commands.extend(check.app.registered_commands)
app.registered_commands.extend(trace.app.registered_commands)
toxic.register(app)  # `toxic ...` and `proxy ...`
app.add_typer(scenario.app, name="scenario")
app.add_typer(bench.app, name="bench")
app.add_typer(compose.app, name="compose")
app.add_typer(install.app, name="install")  # `install toxiproxy`: what the wheel cannot carry


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's), the one a bug
    report needs; a source tree run without installing has none to read."""
    try:
        return version("streamlab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"streamlab {package_version()}")
        raise typer.Exit


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", is_eager=True,
        callback=_print_version)] = False,
) -> None:
    """`streamlab`: bring the lab up, break it on purpose, measure it, take it down."""


# Last, after every command registered above: --json on every path, one exit
# status per outcome, help within 80 columns (commands/conventions.py).
conventions.apply(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
