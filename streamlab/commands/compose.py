"""`streamlab compose`: the compose lab's generated proxy configs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from streamlab.lab import compose_config
from streamlab.lab.topology import REPO_ROOT

app = typer.Typer(help="The compose lab (compose.yaml): its generated proxy configs and "
                  "certificates.",
                  short_help="The compose lab's generated proxy configs and certificates.",
                  no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@app.command(short_help="Write Toxiproxy's and nginx's compose configs from lab.env.")
def config(
    check: Annotated[bool, typer.Option(
        "--check", help="Fail if the committed files differ; write nothing.")] = False,
) -> None:
    """Write Toxiproxy's and nginx's compose configs from lab.env and the hop definition."""
    if check:
        try:
            compose_config.check()
        except compose_config.ConfigDrift as exc:
            err.print(f"[red]{escape(str(exc))}[/]")
            raise typer.Exit(1) from exc
        console.print("compose configs are up to date")
        return
    for path in compose_config.write():
        console.print(f"wrote {path.relative_to(REPO_ROOT)}")


@app.command(short_help="Make the compose lab's CA and nginx TLS certificate.")
def tls(
    directory: Annotated[str, typer.Option(
        "--dir", help="Where to write them (compose.yaml mounts STREAMLAB_TLS_DIR, "
                      "default proxies/nginx/tls).")] = str(compose_config.TLS_DIR),
) -> None:
    """Make the compose lab's CA and nginx certificate (kept if present): with them
    nginx's TLS + HTTP/2 listener comes up (docs/http2.md). Keys stay in DIR,
    which git ignores."""
    made = compose_config.write_tls(Path(directory))
    console.print(f"CA: {made.ca_cert} (trust it: curl --cacert {made.ca_cert})")
