"""Fault toggles: `streamlab toxic ...` and `streamlab proxy ...`, thin over Toxiproxy's API.

Names and attributes are Toxiproxy's own, so `toxiproxy-cli` and its docs map
one to one:

    streamlab toxic add edge latency -a latency=500 -a jitter=50   # or -a latency=500,jitter=50
    streamlab toxic add upstream slicer -a average_size=8 -a delay=200 --name slices
    streamlab toxic update edge latency_downstream -a latency=100
    streamlab toxic remove edge latency_downstream
    streamlab toxic list [HOP] [--json]
    streamlab toxic reset            # every proxy enabled, every toxic gone
    streamlab proxy disable edge     # cuts every open connection, refuses new ones

The hops live in two Toxiproxy processes (the client-side ones, edge and
edge-h2, in one; upstream, engine and the rest in the backend one), so
`toxiproxy-cli` needs the right `-h` for each: `streamlab toxic where [HOP]`
prints it, `streamlab toxic cli HOP -- ARGS...` runs toxiproxy-cli with it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from streamlab.commands.completion import complete_hops, complete_toxic_names, complete_toxic_types
from streamlab.commands.conventions import AsJson, OutputConsole, fail, print_json, split_list
from streamlab.commands.lab import DEFAULT_RUN_DIR, RunDir, attached
from streamlab.exit_codes import EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.lab.local import find_toxiproxy
from streamlab.lab.target import LabTarget
from streamlab.lab.topology import (
    HOP_NAMES,
    TOXIPROXY_PROCESSES,
    is_hop_name,
    toxiproxy_api_port,
    toxiproxy_process,
)
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
                        short_help="Enable or disable a whole hop.",
                        no_args_is_help=True)
console = OutputConsole()
err = OutputConsole(stderr=True)

HOPS = HOP_NAMES
Hop = Annotated[str, typer.Argument(
    help=f"One of: {', '.join(HOPS)}; with replicas also upstream-2, engine-2, …; store.",
    autocompletion=complete_hops)]
OnlyHop = Annotated[str | None, typer.Argument(help="Only this hop.",
                                               autocompletion=complete_hops)]
Attr = Annotated[list[str] | None, typer.Option(
    "--attribute", "-a", help="key=value: repeat it, or separate with commas (see "
                              "`streamlab toxic types`).")]
ToxicName = Annotated[str, typer.Argument(help="The toxic's name (see `streamlab toxic list`).",
                                          autocompletion=complete_toxic_names)]
Toxicity = Annotated[float | None, typer.Option(
    min=0.0, max=1.0, help="Share of connections the toxic applies to (0-1).")]


def register(root: typer.Typer) -> None:
    """Both families of this module, for the one line in streamlab/cli.py."""
    root.add_typer(app, name="toxic")
    root.add_typer(proxy_app, name="proxy")


@contextmanager
def _client(run_dir: Path) -> Iterator[ToxiproxyClient]:
    """The lab's Toxiproxy; its refusals become one red line and exit 1."""
    with _toxiproxy(attached(run_dir)) as client:
        yield client


@contextmanager
def _toxiproxy(lab: LabTarget) -> Iterator[ToxiproxyClient]:
    """Toxiproxy's refusal exits 1 with its words; no Toxiproxy answering, 3."""
    try:
        with lab.toxiproxy() as client:
            yield client
    except ToxiproxyError as exc:
        if exc.status_code:
            fail(str(exc))
        fail(f"{exc} (is the lab up? `streamlab status`)", EXIT_UNREACHABLE)
    except ToxicSpecError as exc:
        fail(str(exc), EXIT_USAGE)


def _check_hop(hop: str) -> None:
    if not is_hop_name(hop):
        fail(f"unknown hop {hop!r}; one of: {', '.join(HOPS)} (and upstream-N, engine-N, "
             "store, store-N in a lab with replicas)", EXIT_USAGE)


@app.command("types")
def types(as_json: AsJson = False) -> None:
    """Every toxic type and its attributes."""
    if as_json:
        print_json(TOXIC_TYPES)
        return
    table = Table("type", "attribute", "meaning")
    for name, attributes in TOXIC_TYPES.items():
        for i, (attribute, meaning) in enumerate(attributes.items()):
            table.add_row(name if i == 0 else "", attribute, meaning)
    console.print(table)


@app.command("list")
def list_toxics(
    hop: OnlyHop = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: AsJson = False,
) -> None:
    """Each hop, whether it is enabled, and its toxics."""
    if hop is not None:
        _check_hop(hop)
    with _client(run_dir) as client:
        proxies = client.proxies()
    shown = {name: proxies[name] for name in _hops_in_order(proxies) if hop in (None, name)}
    if as_json:
        print_json(shown)
        return
    console.print(hops_table(shown))


def hops_table(proxies: dict[str, dict[str, Any]]) -> Table:
    """One row per toxic (or per hop without any). The addresses never wrap: a
    cut `127.0.0…` is no address at all; the toxic column folds instead, so the
    table fits 80 columns."""
    table = Table("hop", "on", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("listen", no_wrap=True)
    table.add_column("upstream", no_wrap=True)
    table.add_column("toxic (type stream toxicity attributes)", overflow="fold", ratio=1)
    for name, proxy in proxies.items():
        enabled = "[green]yes[/]" if proxy["enabled"] else "[red]no[/]"
        toxics = proxy.get("toxics") or []
        if not toxics:
            table.add_row(name, enabled, proxy["listen"], proxy["upstream"], "-")
        for i, toxic in enumerate(toxics):
            attributes = " ".join(f"{k}={v}" for k, v in toxic["attributes"].items())
            described = (f"{toxic['name']}: {toxic['type']} {toxic['stream']} "
                         f"{toxic['toxicity']:g} {attributes}")
            first = i == 0
            table.add_row(name if first else "", enabled if first else "",
                          proxy["listen"] if first else "", proxy["upstream"] if first else "",
                          described)
    return table


def api_addresses(lab: LabTarget, hops: list[str]) -> dict[str, str]:
    """Each hop → `host:port` of the Toxiproxy API that serves it (what
    `toxiproxy-cli -h` takes): the hops live in two processes."""
    ports = lab.ports
    return {hop: f"{ports.host}:{toxiproxy_api_port(ports, toxiproxy_process(hop))}"
            for hop in hops}


def _lab_hops(run_dir: Path) -> tuple[LabTarget, list[str]]:
    """The lab and the hops its Toxiproxy processes serve."""
    lab = attached(run_dir)
    with _toxiproxy(lab) as client:
        return lab, _hops_in_order(client.proxies())


def _hops_in_order(proxies: dict[str, dict[str, Any]]) -> list[str]:
    """The one-replica hops in their usual order, then replicas' and `store`."""
    names = [*(n for n in HOPS if n in proxies), *sorted(n for n in proxies if n not in HOPS)]
    return [n for n in names if is_hop_name(n)]


@app.command()
def where(
    hop: OnlyHop = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: AsJson = False,
) -> None:
    """Which Toxiproxy serves each hop, and toxiproxy-cli's -h for it.

    The hops live in two Toxiproxy processes (edge and edge-h2 in one, the rest
    in the backend one); toxiproxy-cli sees only the hops of the API it is
    pointed at."""
    if hop is not None:
        _check_hop(hop)
    lab, hops = _lab_hops(run_dir)
    if hop is not None:
        _in_lab(hop, hops)
        hops = [hop]
    addresses = api_addresses(lab, hops)
    if as_json:
        print_json({h: {"process": toxiproxy_process(h), "api": a} for h, a in addresses.items()})
        return
    for process in TOXIPROXY_PROCESSES:
        served = [h for h in hops if toxiproxy_process(h) == process]
        if served:
            console.print(f"toxiproxy-cli -h {addresses[served[0]]}   "
                          f"# {process}: {', '.join(served)}", highlight=False, soft_wrap=True)


@app.command(context_settings={"ignore_unknown_options": True})
def cli(
    hop: Hop,
    args: Annotated[list[str] | None, typer.Argument(
        help="toxiproxy-cli's own command and options, after `--` (default: inspect HOP).")
    ] = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON document: the command, its exit status, its "
                       "stdout and stderr.")] = False,
) -> None:
    """Run toxiproxy-cli against the Toxiproxy that serves HOP.

    streamlab toxic cli upstream -- toxic add -t latency -a latency=500 upstream

    Its output and exit status are the command's own (--json: in one document)."""
    _check_hop(hop)
    lab, hops = _lab_hops(run_dir)
    _in_lab(hop, hops)
    try:
        binary = find_toxiproxy("toxiproxy-cli")
    except FileNotFoundError as exc:
        fail(str(exc))
    command = [binary, "-h", api_addresses(lab, [hop])[hop], *(args or ["inspect", hop])]
    if not as_json:
        raise typer.Exit(subprocess.run(command, check=False).returncode)
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    print_json({"command": command, "exit_status": done.returncode, "stdout": done.stdout,
                "stderr": done.stderr})
    raise typer.Exit(done.returncode)


def _in_lab(hop: str, hops: list[str]) -> None:
    if hop not in hops:
        fail(f"no hop {hop!r} in this lab; it has: {', '.join(hops)}", EXIT_USAGE)


@app.command()
def add(
    hop: Hop,
    toxic_type: Annotated[str, typer.Argument(
        metavar="TYPE", help=f"One of: {', '.join(TOXIC_TYPES)}.",
        autocompletion=complete_toxic_types)],
    attribute: Attr = None,
    stream: Annotated[str, typer.Option(
        help="downstream (toward the client) or upstream (toward the engine).")] = "downstream",
    toxicity: Toxicity = None,
    name: Annotated[str, typer.Option(help="Default: TYPE_STREAM.")] = "",
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: AsJson = False,
) -> None:
    """Add a toxic to a hop."""
    _check_hop(hop)
    if stream not in DIRECTIONS:
        fail(f"--stream must be one of {', '.join(DIRECTIONS)}", EXIT_USAGE)
    direction: Direction = "upstream" if stream == "upstream" else "downstream"
    with _client(run_dir) as client:
        toxic = Toxic(toxic_type, dict(parse_attributes(toxic_type, split_list(attribute))),
                      direction, 1.0 if toxicity is None else toxicity, name)
        added = client.add_toxic(hop, toxic)
    if as_json:
        print_json(added)
        return
    # Toxiproxy's own answer, printed as it is (a name or attribute may hold "[").
    console.print(f"added [bold]{escape(str(added['name']))}[/] to {hop}: "
                  f"{escape(str(added['type']))} "
                  f"{added['stream']} {added['attributes']} toxicity={added['toxicity']:g}")


@app.command()
def update(
    hop: Hop,
    name: ToxicName,
    attribute: Attr = None,
    toxicity: Toxicity = None,
    run_dir: RunDir = DEFAULT_RUN_DIR,
    as_json: AsJson = False,
) -> None:
    """Change a toxic's attributes or toxicity in place.

    Open connections feel it too."""
    _check_hop(hop)
    with _client(run_dir) as client:
        current = next((t for t in client.toxics(hop) if t["name"] == name), None)
        if current is None:
            raise ToxiproxyError(404, f"no toxic {name!r} on {hop}")
        attributes = parse_attributes(current["type"], split_list(attribute))
        updated = client.update_toxic(hop, name, dict(attributes), toxicity)
    if as_json:
        print_json(updated)
        return
    console.print(f"updated [bold]{escape(name)}[/] on {hop}: {updated['attributes']} "
                  f"toxicity={updated['toxicity']:g}")


@app.command()
def remove(hop: Hop, name: ToxicName, run_dir: RunDir = DEFAULT_RUN_DIR,
           as_json: AsJson = False) -> None:
    """Remove one toxic.

    Removing a `timeout` toxic closes the connections it held. --json prints the
    hop as it is now (as `toxic list HOP --json`)."""
    _check_hop(hop)
    with _client(run_dir) as client:
        client.remove_toxic(hop, name)
        after = client.proxies() if as_json else {}
    if as_json:
        print_json({"removed": name, "hop": hop, "proxies": {hop: after.get(hop)}})
        return
    console.print(f"removed {name} from {hop}", markup=False)


@app.command()
def reset(run_dir: RunDir = DEFAULT_RUN_DIR, as_json: AsJson = False) -> None:
    """Enable every hop and remove every toxic.

    --json prints every hop as it is now (as `toxic list --json`)."""
    with _client(run_dir) as client:
        client.reset()
        after = client.proxies() if as_json else {}
    if as_json:
        print_json({"reset": True, "proxies": {n: after[n] for n in _hops_in_order(after)}})
        return
    console.print("every hop enabled, no toxics")


def _set_enabled(hop: str, enabled: bool, run_dir: Path, said: str, as_json: bool) -> None:
    _check_hop(hop)
    with _client(run_dir) as client:
        client.set_enabled(hop, enabled)
        after = client.proxies() if as_json else {}
    if as_json:
        print_json({"hop": hop, "enabled": enabled, "proxies": {hop: after.get(hop)}})
        return
    console.print(f"{hop} {said}")


@proxy_app.command()
def enable(hop: Hop, run_dir: RunDir = DEFAULT_RUN_DIR, as_json: AsJson = False) -> None:
    """Let the hop accept connections again."""
    _set_enabled(hop, True, run_dir, "enabled", as_json)


@proxy_app.command()
def disable(hop: Hop, run_dir: RunDir = DEFAULT_RUN_DIR, as_json: AsJson = False) -> None:
    """Close every open connection through the hop and refuse new ones."""
    _set_enabled(hop, False, run_dir, "disabled: open connections cut, new ones refused",
                 as_json)
