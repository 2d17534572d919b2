"""Tab completion of the names the commands take (`streamlab --install-completion`):
scenarios, hops, toxic types and names, proxies, checks, probes, services.

Each callback reads the registry that the command checks its argument
against, imported when the shell asks (never at every `streamlab` start), and
offers what starts with the word typed so far; a toxic's name and a running
lab's hops and services come from the lab, when one is up (none: the
registry's names, or nothing). A callback never fails: completion that
raises would print a traceback into the user's prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import typer

Completions = list[tuple[str, str]]


def _matching(names: Iterable[str | tuple[str, str]], incomplete: str) -> Completions:
    items = [(n, "") if isinstance(n, str) else n for n in names]
    return [(name, help_) for name, help_ in items if name.startswith(incomplete)]


def _quiet(function: Callable[..., Iterable[str | tuple[str, str]]]
           ) -> Callable[..., Completions]:
    """Offer the names `function` finds that start with `incomplete`; nothing if
    it fails. (Not functools.wraps: typer reads the callback's own signature,
    `ctx` and `incomplete`, and wraps would show it `function`'s.)"""
    def complete(ctx: typer.Context, incomplete: str) -> Completions:
        try:
            return _matching(function(ctx), incomplete)
        except Exception:  # a completion that raises writes a traceback into the prompt
            return []
    complete.__name__ = complete.__qualname__ = function.__name__
    complete.__doc__ = function.__doc__
    return complete


def _run_dir(ctx: typer.Context) -> Path:
    # The commands' default (commands/lab.py: DEFAULT_RUN_DIR), from where it is
    # defined: commands/lab.py imports this module for its own completions.
    from streamlab.paths import run_dir

    value = ctx.params.get("run_dir")
    return Path(value) if value else run_dir()


def _local_lab(ctx: typer.Context) -> Any:
    """The local lab `streamlab up` left in the run dir, or None (no lab, or compose)."""
    from streamlab.lab.compose import selected_target
    from streamlab.lab.local import Lab

    run_dir = _run_dir(ctx)
    if selected_target() == "compose" or not (run_dir / "state.json").exists():
        return None
    return Lab.attach(run_dir)


@_quiet
def complete_scenarios(ctx: typer.Context) -> Iterable[tuple[str, str]]:
    from streamlab.experiments.scenarios import get, names

    return [(name, get(name).summary) for name in names()]


@_quiet
def complete_scenarios_or_all(ctx: typer.Context) -> Iterable[tuple[str, str]]:
    return [*complete_scenarios(ctx, ""), ("all", "every scenario")]


@_quiet
def complete_hops(ctx: typer.Context) -> Iterable[str]:
    """The running lab's hops (replicas and `store` included), else the usual four."""
    from streamlab.lab.topology import HOP_NAMES, hops

    lab = _local_lab(ctx)
    if lab is None:
        return HOP_NAMES
    return [hop.name for hop in hops(lab.ports, lab.options.replicas)]


@_quiet
def complete_toxic_types(ctx: typer.Context) -> Iterable[tuple[str, str]]:
    from streamlab.lab.toxiproxy import TOXIC_TYPES

    return [(name, ", ".join(attributes)) for name, attributes in TOXIC_TYPES.items()]


@_quiet
def complete_toxic_names(ctx: typer.Context) -> Iterable[tuple[str, str]]:
    """The toxics on the hop typed before (`toxic update HOP <tab>`), from the lab."""
    hop = ctx.params.get("hop")
    lab = _local_lab(ctx)
    if lab is None or not hop:
        return []
    with lab.toxiproxy() as client:
        return [(t["name"], f"{t['type']} {t['stream']}") for t in client.toxics(hop)]


@_quiet
def complete_proxies(ctx: typer.Context) -> Iterable[str]:
    from streamlab.lab.proxies import PROXY_NAMES

    return PROXY_NAMES


@_quiet
def complete_checks(ctx: typer.Context) -> Iterable[str]:
    from streamlab.experiments.check.runner import CHECKS

    return CHECKS


@_quiet
def complete_probes(ctx: typer.Context) -> Iterable[str]:
    from streamlab.experiments.scenarios.edge_probes import probe_names

    return probe_names()


@_quiet
def complete_broken(ctx: typer.Context) -> Iterable[str]:
    from streamlab.experiments.soak_verdict import BROKEN

    return BROKEN


# The local lab's services when none is up to ask (`streamlab logs <tab>`).
SERVICES = ("engine", "toxiproxy", "toxiproxy-backend", "gateway", "nginx", "console")


@_quiet
def complete_services(ctx: typer.Context) -> Iterable[str]:
    lab = _local_lab(ctx)
    return SERVICES if lab is None else list(lab.logs)
