"""`streamlab compose`: the compose lab's generated proxy configs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from streamlab.commands.conventions import AsJson, OutputConsole, fail, print_json
from streamlab.exit_codes import EXIT_USAGE
from streamlab.lab import compose_config
from streamlab.lab.topology import REPO_ROOT
from streamlab.paths import COMPOSE_NEEDS_A_CLONE, clone

app = typer.Typer(help="The compose lab (compose.yaml): its generated proxy configs and "
                  "certificates.",
                  short_help="The compose lab's generated proxy configs and certificates.",
                  no_args_is_help=True)
console = OutputConsole()
err = OutputConsole(stderr=True)

def needs_a_clone() -> None:
    """Installed from a wheel there is no compose.yaml to write beside, nor a
    proxies/ folder: say so (exit 2) instead of writing into site-packages."""
    if clone() is None:
        fail(COMPOSE_NEEDS_A_CLONE, EXIT_USAGE)


@app.command(short_help="Write Toxiproxy's and nginx's compose configs from lab.env.")
def config(
    check: Annotated[bool, typer.Option(
        "--check", help="Fail if the committed files differ; write nothing.")] = False,
    as_json: AsJson = False,
) -> None:
    """Write Toxiproxy's and nginx's compose configs from lab.env and the hop definition."""
    needs_a_clone()
    if check:
        try:
            compose_config.check()
        except compose_config.ConfigDrift as exc:
            fail(str(exc))
        if as_json:
            print_json({"up_to_date": True})
        else:
            console.print("compose configs are up to date")
        return
    written = [str(path.relative_to(REPO_ROOT)) for path in compose_config.write()]
    if as_json:
        print_json({"wrote": written})
        return
    for path in written:
        console.print(f"wrote {path}", markup=False)


@app.command(short_help="Make the compose lab's CA and nginx TLS certificate.")
def tls(
    directory: Annotated[str, typer.Option(
        "--dir", help="Where to write them (compose.yaml mounts STREAMLAB_TLS_DIR, "
                      "default proxies/nginx/tls).")] = str(compose_config.TLS_DIR),
    as_json: AsJson = False,
) -> None:
    """Make the compose lab's CA and nginx certificate (kept if present): with them
    nginx's TLS + HTTP/2 listener comes up (docs/http2.md). Keys stay in DIR,
    which git ignores."""
    needs_a_clone()
    made = compose_config.write_tls(Path(directory))
    if as_json:
        print_json({"ca_cert": str(made.ca_cert), "dir": directory})
        return
    console.print(f"CA: {made.ca_cert} (trust it: curl --cacert {made.ca_cert})", markup=False)
