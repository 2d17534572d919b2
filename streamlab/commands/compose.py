"""`streamlab compose`: the compose lab's generated proxy configs."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from streamlab import compose_config
from streamlab.topology import REPO_ROOT

app = typer.Typer(help="The compose lab (compose.yaml): its generated proxy configs.",
                  no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@app.command()
def config(
    check: Annotated[bool, typer.Option(
        "--check", help="Fail if the committed files differ; write nothing.")] = False,
) -> None:
    """Write Toxiproxy's and nginx's compose configs from lab.env and the hop definition."""
    if check:
        try:
            compose_config.check()
        except compose_config.ConfigDrift as exc:
            err.print(f"[red]{exc}[/]")
            raise typer.Exit(1) from exc
        console.print("compose configs are up to date")
        return
    for path in compose_config.write():
        console.print(f"wrote {path.relative_to(REPO_ROOT)}")
