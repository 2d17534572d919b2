"""Fault toggles: `streamlab toxic ...` and `streamlab proxy ...`, thin over Toxiproxy's API.

Names and attributes are Toxiproxy's own, so `toxiproxy-cli` and its docs map
one to one:

    streamlab toxic add edge latency -a latency=500 -a jitter=50
    streamlab toxic add upstream slicer -a average_size=8 -a delay=200 --name slices
    streamlab toxic update edge latency_downstream -a latency=100
    streamlab toxic remove edge latency_downstream
    streamlab toxic list [HOP] [--json]
    streamlab toxic reset            # every proxy enabled, every toxic gone
    streamlab proxy disable edge     # cuts every open connection, refuses new ones
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.lab.topology import HOP_NAMES, is_hop_name
from streamlab.lab.toxiproxy import (
    DIRECTIONS,
    TOXIC_TYPES,
    Direction,
    Toxic,
    ToxicSpecError,
    ToxiproxyClient,
    ToxiproxyError,
    parse_attributes,
)

app = typer.Typer(help="Add, change and remove Toxiproxy toxics on the lab's hops.",
                  no_args_is_help=True)
proxy_app = typer.Typer(help="Enable or disable a whole hop (edge, upstream, engine, "
                             "upstream-2, …, store).",
                        no_args_is_help=True)
console = Console()
err = Console(stderr=True)

HOPS = HOP_NAMES
Hop = Annotated[str, typer.Argument(
    help=f"One of: {', '.join(HOPS)}; with replicas also upstream-2, engine-2, …; store.")]
Attr = Annotated[list[str] | None, typer.Option(
    "--attribute", "-a", help="key=value, repeatable (see `streamlab toxic types`).")]
Toxicity = Annotated[float | None, typer.Option(
    min=0.0, max=1.0, help="Share of connections the toxic applies to (0-1).")]


def register(root: typer.Typer) -> None:
    """Both families of this module, for the one line in streamlab/cli.py."""
    root.add_typer(app, name="toxic")
    root.add_typer(proxy_app, name="proxy")


@contextmanager
def _client(run_dir: Path) -> Iterator[ToxiproxyClient]:
    """The lab's Toxiproxy; its refusals become one red line and exit 1."""
    lab = attached(run_dir)
    try:
        with lab.toxiproxy() as client:
            yield client
    except (ToxiproxyError, ToxicSpecError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc


def _check_hop(hop: str) -> None:
    if not is_hop_name(hop):
        err.print(f"[red]unknown hop {hop!r}[/]; one of: {', '.join(HOPS)} "
                  "(and upstream-N, engine-N, store in a lab with replicas)")
        raise typer.Exit(2)


@app.command("types")
def types() -> None:
    """Every toxic type and its attributes."""
    table = Table("type", "attribute", "meaning")
    for name, attributes in TOXIC_TYPES.items():
        for i, (attribute, meaning) in enumerate(attributes.items()):
            table.add_row(name if i == 0 else "", attribute, meaning)
    console.print(table)


@app.command("list")
def list_toxics(
    hop: Annotated[str | None, typer.Argument(help="Only this hop.")] = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Each hop, whether it is enabled, and its toxics."""
    if hop is not None:
        _check_hop(hop)
    with _client(run_dir) as client:
        proxies = client.proxies()
    # The one-replica hops in their usual order, then replicas' and `store`.
    names = [*(n for n in HOPS if n in proxies), *sorted(n for n in proxies if n not in HOPS)]
    shown = {name: proxies[name] for name in names if is_hop_name(name) and hop in (None, name)}
    if as_json:
        print(json.dumps(shown, indent=2))
        return
    table = Table("hop", "enabled", "listen → upstream", "toxic", "type", "stream",
                  "toxicity", "attributes")
    for name, proxy in shown.items():
        enabled = "[green]yes[/]" if proxy["enabled"] else "[red]no[/]"
        route = f"{proxy['listen']} → {proxy['upstream']}"
        toxics = proxy.get("toxics") or []
        if not toxics:
            table.add_row(name, enabled, route, "-", "", "", "", "")
        for i, toxic in enumerate(toxics):
            attributes = " ".join(f"{k}={v}" for k, v in toxic["attributes"].items())
            table.add_row(name if i == 0 else "", enabled if i == 0 else "",
                          route if i == 0 else "", toxic["name"], toxic["type"],
                          toxic["stream"], f"{toxic['toxicity']:g}", attributes)
    console.print(table)


@app.command()
def add(
    hop: Hop,
    toxic_type: Annotated[str, typer.Argument(
        metavar="TYPE", help=f"One of: {', '.join(TOXIC_TYPES)}.")],
    attribute: Attr = None,
    stream: Annotated[str, typer.Option(
        help="downstream (toward the client) or upstream (toward the engine).")] = "downstream",
    toxicity: Toxicity = None,
    name: Annotated[str, typer.Option(help="Default: TYPE_STREAM.")] = "",
    run_dir: RunDir = DEFAULT_RUN_DIR,
) -> None:
    """Add a toxic to a hop."""
    _check_hop(hop)
    if stream not in DIRECTIONS:
        err.print(f"[red]--stream must be one of {', '.join(DIRECTIONS)}[/]")
        raise typer.Exit(2)
    direction: Direction = "upstream" if stream == "upstream" else "downstream"
    with _client(run_dir) as client:
        toxic = Toxic(toxic_type, dict(parse_attributes(toxic_type, attribute or [])),
                      direction, 1.0 if toxicity is None else toxicity, name)
        added = client.add_toxic(hop, toxic)
    console.print(f"added [bold]{added['name']}[/] to {hop}: {added['type']} "
                  f"{added['stream']} {added['attributes']} toxicity={added['toxicity']:g}")


@app.command()
def update(
    hop: Hop,
    name: Annotated[str, typer.Argument(help="The toxic's name (see `streamlab toxic list`).")],
    attribute: Attr = None,
    toxicity: Toxicity = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
) -> None:
    """Change a toxic's attributes or toxicity in place (open connections feel it too)."""
    _check_hop(hop)
    with _client(run_dir) as client:
        current = next((t for t in client.toxics(hop) if t["name"] == name), None)
        if current is None:
            raise ToxiproxyError(404, f"no toxic {name!r} on {hop}")
        attributes = parse_attributes(current["type"], attribute or [])
        updated = client.update_toxic(hop, name, dict(attributes), toxicity)
    console.print(f"updated [bold]{name}[/] on {hop}: {updated['attributes']} "
                  f"toxicity={updated['toxicity']:g}")


@app.command()
def remove(hop: Hop, name: str, run_dir: RunDir = DEFAULT_RUN_DIR) -> None:
    """Remove one toxic (removing a `timeout` toxic closes the connections it held)."""
    _check_hop(hop)
    with _client(run_dir) as client:
        client.remove_toxic(hop, name)
    console.print(f"removed {name} from {hop}")


@app.command()
def reset(run_dir: RunDir = DEFAULT_RUN_DIR) -> None:
    """Enable every hop and remove every toxic."""
    with _client(run_dir) as client:
        client.reset()
    console.print("every hop enabled, no toxics")


def _set_enabled(hop: str, enabled: bool, run_dir: Path, said: str) -> None:
    _check_hop(hop)
    with _client(run_dir) as client:
        client.set_enabled(hop, enabled)
    console.print(f"{hop} {said}")


@proxy_app.command()
def enable(hop: Hop, run_dir: RunDir = DEFAULT_RUN_DIR) -> None:
    """Let the hop accept connections again."""
    _set_enabled(hop, True, run_dir, "enabled")


@proxy_app.command()
def disable(hop: Hop, run_dir: RunDir = DEFAULT_RUN_DIR) -> None:
    """Close every open connection through the hop and refuse new ones."""
    _set_enabled(hop, False, run_dir, "disabled: open connections cut, new ones refused")
