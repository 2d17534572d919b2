"""`streamlab`: bring the lab up, break it on purpose, measure it, take it down."""

from __future__ import annotations

import typer

from streamlab.commands import bench, compose, console, lab, scenario, soak, toxic

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
# Lab lifecycle: up, down, status, chat (top-level commands).
app.registered_commands.extend(lab.app.registered_commands)
# Families of commands register here, one line each:
app.registered_commands.extend(soak.app.registered_commands)
app.registered_commands.extend(console.app.registered_commands)
toxic.register(app)  # `toxic ...` and `proxy ...`
app.add_typer(scenario.app, name="scenario")
app.add_typer(bench.app, name="bench")
app.add_typer(compose.app, name="compose")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
