"""The CLI as a new user meets it at 80 columns: the catalogue and the hops fit
the width without cutting an address, the top-level help is one line per
command and names the exit codes (`--json` everywhere and the option names:
test_cli_conventions.py). No lab: a FakeLab stands in where a command reads the
hops."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

import streamlab.commands.toxic as toxic_commands
from streamlab.cli import app
from streamlab.experiments.scenarios import MODES, get, names
from streamlab.lab.fake import FakeLab
from streamlab.lab.topology import Ports
from streamlab.lab.toxiproxy import Toxic

WIDTH = 80


# typer >= 0.20 carries its own click (typer._click): walk its types, not click's.
Command = Any


def leaf_commands(group: TyperGroup, prefix: str = "") -> Iterator[tuple[str, Command]]:
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(command, TyperGroup):
            yield from leaf_commands(command, f"{path} ")
        else:
            yield path, command


COMMANDS = dict(leaf_commands(typer.main.get_group(app)))


def invoke(*args: str, width: int = WIDTH) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(width), "NO_COLOR": "1"},
                              terminal_width=width)


def test_the_walk_finds_every_family() -> None:
    """A walk that missed the groups would pass the next test vacuously."""
    families = {path.split()[0] for path in COMMANDS if " " in path}
    assert {"toxic", "proxy", "scenario", "bench", "compose"} <= families
    assert {"up", "status", "chat", "soak"} <= set(COMMANDS)


GROUPS = sorted({path.split()[0] for path in COMMANDS if " " in path})


def commands_of(group: str) -> list[str]:
    """The names a group's help lists: its commands (the top level: its own and the groups)."""
    if not group:
        return [p for p in COMMANDS if " " not in p] + GROUPS
    return [p.split()[1] for p in COMMANDS if p.startswith(f"{group} ")]


@pytest.mark.parametrize("group", ["", *GROUPS])
def test_every_help_lists_each_command_on_one_line_within_80_columns(group: str) -> None:
    result = invoke(*group.split(), "--help")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, result.output
    for command in commands_of(group):
        rows = [i for i, line in enumerate(lines) if re.match(rf"^│ {re.escape(command)} ", line)]
        assert len(rows) == 1, f"{command}: {rows}\n{result.output}"
        # The next line is the next command or the panel's end, not this one's
        # help wrapped onto a second line (a docstring's whole first paragraph).
        following = lines[rows[0] + 1]
        assert re.match(r"^│ [a-z]", following) or following.startswith("╰"), (
            f"{command}'s help runs past one line:\n{result.output}")


def test_the_top_level_help_names_the_exit_codes() -> None:
    flat = " ".join(invoke("--help").output.split())
    for code in ("0 as expected", "1 not as expected", "2 usage", "3 the lab is unreachable"):
        assert code in flat


# ---- scenario list / show ----------------------------------------------------------
def test_scenario_list_is_one_line_per_scenario_within_80_columns(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """On a terminal (piped, every line is whole: test_cli_conventions.py)."""
    from rich.console import Console

    import streamlab.commands.scenario as scenario_commands

    monkeypatch.setattr(scenario_commands, "console",
                        Console(force_terminal=True, width=WIDTH, color_system=None))
    result = invoke("scenario", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == list(names())
    assert max(len(line) for line in lines) <= WIDTH
    # Cut, not dropped: a summary that fits is there whole.
    short = min(names(), key=lambda n: len(get(n).summary))
    assert get(short).summary in result.output


@pytest.mark.parametrize("name", ["engine-cut", "latency-edge"])
def test_scenario_show_prints_the_summary_each_mode_its_checks_and_needs(name: str) -> None:
    scenario = get(name)
    result = invoke("scenario", "show", name, width=200)
    assert result.exit_code == 0, result.output
    assert scenario.summary in result.output
    needs = ", ".join(str(c) for c in sorted(scenario.needs))
    assert f"needs: {needs or 'nothing beyond a lab that is up'}" in result.output
    for mode in MODES:
        variant = scenario.variant(mode)
        assert f"{mode}: {variant.story}" in result.output
        for check in variant.expect:
            assert check.figure in result.output
    toxics = (*scenario.broken.setup.toxics, *scenario.fixed.setup.toxics)
    assert toxics or name == "engine-cut"  # latency-edge's setup is a toxic: shown below
    for hop, toxic in toxics:
        assert f"toxic on {hop}: {toxic.type}" in result.output


def test_scenario_show_json_is_the_catalogue_entry() -> None:
    listed = json.loads(invoke("scenario", "list", "--json").output)
    shown = json.loads(invoke("scenario", "show", "resume", "--json").output)
    assert shown == next(entry for entry in listed if entry["name"] == "resume")


def test_scenario_show_of_an_unknown_name_is_a_usage_error() -> None:
    result = invoke("scenario", "show", "no-such-scenario")
    assert result.exit_code == 2
    assert "no scenario 'no-such-scenario'" in result.output


# ---- toxic list / types / where -----------------------------------------------------
@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch) -> FakeLab:
    # lab.env's real addresses (127.0.0.1 and its ports), never dialled: the
    # fake lab's Toxiproxy is in memory.
    fake = FakeLab(ports=Ports.load())
    monkeypatch.setattr(toxic_commands, "attached", lambda run_dir: fake)
    return fake


def test_toxic_list_shows_every_address_whole_within_80_columns(lab: FakeLab) -> None:
    with lab.toxiproxy() as client:
        client.add_toxic("upstream", Toxic("slicer", {"average_size": 8, "size_variation": 4,
                                                      "delay": 200}, name="slices"))
        proxies = client.proxies()
    result = invoke("toxic", "list")
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= WIDTH, result.output
    assert "…" not in result.output
    for proxy in proxies.values():
        assert proxy["listen"] in result.output
        assert proxy["upstream"] in result.output
    assert "slices" in result.output


def test_toxic_types_json_is_every_type_and_its_attributes() -> None:
    from streamlab.lab.toxiproxy import TOXIC_TYPES

    result = invoke("toxic", "types", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == TOXIC_TYPES


def test_toxic_where_names_the_process_and_api_of_every_hop(lab: FakeLab) -> None:
    ports = lab.ports
    result = invoke("toxic", "where", "--json")
    assert result.exit_code == 0, result.output
    where = json.loads(result.output)
    client_side = f"{ports.host}:{ports.toxiproxy_api_port}"
    backend = f"{ports.host}:{ports.toxiproxy_backend_api_port}"
    assert where["edge"] == {"process": "toxiproxy", "api": client_side}
    assert where["upstream"] == {"process": "toxiproxy-backend", "api": backend}
    assert where["engine"]["api"] == backend
    text = invoke("toxic", "where").output
    assert f"toxiproxy-cli -h {client_side}" in text
    assert f"toxiproxy-cli -h {backend}" in text


def test_toxic_where_of_a_hop_the_lab_lacks_is_a_usage_error(lab: FakeLab) -> None:
    result = invoke("toxic", "where", "upstream-9")
    assert result.exit_code == 2
    assert "no hop 'upstream-9'" in result.output


# ---- a lab venv without the plot extra -----------------------------------------------
@pytest.mark.parametrize("bench", ["transports", "slow-readers", "scale"])
def test_plot_without_matplotlib_is_a_usage_error_before_the_bench_runs(
        monkeypatch: pytest.MonkeyPatch, bench: str) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name == "matplotlib" else real(name))
    # No lab here: a bench that started would exit 3 (unreachable), not 2.
    result = invoke("bench", bench, "--plot", "out.png", "--run-dir", "/nonexistent/run")
    assert result.exit_code == 2, result.output
    assert "make up PLOT=1" in " ".join(result.output.split())
