"""One CLI convention (commands/conventions.py, docs/cli.md), walked over every
command, so a new one cannot drift from it:

- every `--help` fits 80 columns with every option name whole, no `<bool>`,
  and the old names (kept for a release) hidden but still accepted;
- every command takes `--json`, and every `--json` path prints one JSON
  object on stdout: the result, a usage error, no lab (exit 3 everywhere),
  with the error's message on stderr;
- `scenario list` is whole when piped; completion offers the registries' names;
- `streamlab logs`.

No lab: a FakeLab stands in where a command needs one."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup, TyperOption
from typer.testing import CliRunner

import streamlab.commands.conventions as conventions
import streamlab.commands.lab as lab_commands
import streamlab.commands.logs as logs_commands
import streamlab.commands.scenario as scenario_commands
import streamlab.commands.toxic as toxic_commands
from streamlab.cli import app
from streamlab.commands.conventions import OutputConsole, aliases, split_list, visible_opts
from streamlab.experiments.report import Report
from streamlab.experiments.scenarios import get, names
from streamlab.lab.fake import FakeLab
from streamlab.lab.processes import StartError
from streamlab.lab.target import Capability
from streamlab.lab.topology import Ports
from streamlab.lab.toxiproxy import Toxic

WIDTH = 80
Command = Any  # typer's own click: its Command types


def walk(group: TyperGroup, prefix: tuple[str, ...] = ()
         ) -> Iterator[tuple[tuple[str, ...], Command]]:
    """Every group and command, as its path of names."""
    yield prefix, group
    for name, command in sorted(group.commands.items()):
        if isinstance(command, TyperGroup):
            yield from walk(command, (*prefix, name))
        else:
            yield (*prefix, name), command


EVERYTHING = dict(walk(typer.main.get_group(app)))
COMMANDS = {" ".join(path): command for path, command in EVERYTHING.items()
            if not isinstance(command, TyperGroup)}
HELPS = sorted(" ".join(path) for path in EVERYTHING)


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": str(WIDTH), "NO_COLOR": "1",
                                                    **(env or {})},
                              terminal_width=WIDTH)


def options(command: Command) -> list[TyperOption]:
    return [p for p in command.params if isinstance(p, TyperOption)]


def token(name: str) -> str:
    """`name` as a whole word of the help, not a part of a longer name."""
    return rf"(?<![\w-]){re.escape(name)}(?![\w-])"


def one_document(result: Any) -> Any:
    """stdout is one JSON document, nothing before or after it: an object (a
    catalogue may be an array: `scenario list --json`)."""
    document = json.loads(result.stdout)
    assert isinstance(document, dict | list), result.stdout
    return document


# ---- help at 80 columns -------------------------------------------------------------
def test_the_walk_finds_every_family() -> None:
    families = {path.split()[0] for path in COMMANDS if " " in path}
    assert {"toxic", "proxy", "scenario", "bench", "compose"} <= families
    assert {"up", "down", "status", "chat", "logs", "soak", "console", "check"} <= set(COMMANDS)


@pytest.mark.parametrize("path", HELPS)
def test_every_help_fits_80_columns_with_every_option_name_whole(path: str) -> None:
    result = invoke(*path.split(), "--help")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert max(len(line) for line in text.splitlines()) <= WIDTH, text
    cut = re.findall(r"--?[\w-]*…", text)
    assert not cut, f"cut option names {cut}:\n{text}"
    assert "<bool>" not in text, text
    command = EVERYTHING[tuple(path.split())]
    for option in options(command):
        for name in visible_opts(option.opts) + option.secondary_opts:
            assert re.search(token(name), text), f"{name} is not whole in:\n{text}"
        for old in aliases(option):
            assert not re.search(token(old), text), f"old name {old} shown:\n{text}"


# ---- old names: accepted, not shown ----------------------------------------------------
# The names one name per concept replaced (docs/cli.md's table): kept for a release.
OLD_NAMES = {
    ("chat", "--path"): "--location",
    ("bench transports", "--reps"): "--repeat",
    ("soak", "--duration"): "--duration-s",
    ("bench load", "--streams"): "--concurrency",
    ("bench memory", "--streams"): "--concurrency",
    ("check", "--streams"): "--concurrency",
    ("up", "--nginx-send-timeout"): "--nginx-send-timeout-s",
}
ALIASES = {(path, old): option for path, command in COMMANDS.items()
           for option in options(command) for old in aliases(option)}


def test_every_old_name_is_still_declared_under_its_new_one() -> None:
    assert {key: option.opts[0] for key, option in ALIASES.items() if key in OLD_NAMES
            } == OLD_NAMES


def a_value(option: TyperOption) -> str:
    annotation = option.type_descriptor.annotation
    kinds = get_args(annotation) or (annotation,)
    return "12" if int in kinds else "2.5" if float in kinds else "/buffered/"


@pytest.mark.parametrize(("path", "old"), sorted(ALIASES))
def test_an_old_name_parses_as_the_new_one(path: str, old: str) -> None:
    option, command = ALIASES[(path, old)], COMMANDS[path]
    value, name = a_value(option), option.name or ""
    before = command.make_context(path, [old, value], resilient_parsing=True).params
    after = command.make_context(path, [option.opts[0], value], resilient_parsing=True).params
    default = command.make_context(path, [], resilient_parsing=True).params
    assert before == after
    assert after[name] != default[name]


def test_an_old_name_says_its_new_one_on_stderr() -> None:
    result = invoke("bench", "transports", "--reps", "2", "--run-dir", "/nonexistent/run")
    assert result.exit_code == 3, result.output
    assert "--reps is now --repeat" in result.stderr


def test_a_list_option_takes_its_items_repeated_or_comma_separated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlab.experiments.bench import memory

    asked: list[tuple[str, ...]] = []

    def bench_memory(streams: int, wires: tuple[str, ...], **kwargs: Any) -> Report:
        asked.append(wires)
        return Report("stand-in")

    monkeypatch.setattr(memory, "bench_memory", bench_memory)
    assert invoke("bench", "memory", "--wire", "per_request", "--wire", "multiplexed"
                  ).exit_code == 0
    assert invoke("bench", "memory", "--wire", "per_request,multiplexed").exit_code == 0
    assert invoke("bench", "memory").exit_code == 0
    assert asked == [("per_request", "multiplexed")] * 3
    assert split_list([" a, b", "c", ""], ["d"]) == ["a", "b", "c"]
    assert split_list(None, ["d"]) == ["d"]


# ---- --json on every path ---------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_command_takes_json(path: str) -> None:
    assert any("--json" in option.opts for option in options(COMMANDS[path])), (
        f"{path} has no --json")


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_a_usage_error_under_json_is_one_json_document(path: str) -> None:
    result = invoke(*path.split(), "--json", "--no-such-option")
    assert result.exit_code == 2, result.output
    document = one_document(result)
    assert document["error"]["kind"] == "usage"
    assert document["exit_status"] == 2
    assert document["error"]["message"] in result.stderr


# What a command needs before it looks for the lab (its arguments).
ARGUMENTS = {
    "chat": ["hello"],
    "toxic add": ["edge", "latency"],
    "toxic update": ["edge", "latency_downstream"],
    "toxic remove": ["edge", "latency_downstream"],
    "toxic cli": ["edge"],
    "proxy enable": ["edge"],
    "proxy disable": ["edge"],
    "scenario run": ["buffering"],
    "trace": ["some-request-id"],
}
# Commands with a run dir that need no lab there: `up` starts one, `down`
# with none up has nothing to do (exit 0: `make down` twice is no error);
# `scenario show --last` reads what a run left there, the lab up or not; the
# console serves whether or not a lab is up.
NO_LAB_NEEDED = {"up", "down", "scenario show", "console"}
NEED_A_LAB = sorted(path for path, command in COMMANDS.items()
                    if any(p.name == "run_dir" for p in command.params)
                    and path not in NO_LAB_NEEDED)


def test_the_commands_that_need_a_lab_are_found() -> None:
    assert {"status", "chat", "logs", "soak", "toxic list", "proxy enable", "scenario run",
            "bench cancel"} <= set(NEED_A_LAB)


@pytest.mark.parametrize("path", NEED_A_LAB)
@pytest.mark.parametrize("as_json", [True, False])
def test_no_lab_is_exit_3_from_every_command(path: str, as_json: bool,
                                             tmp_path: Path) -> None:
    run_dir = str(tmp_path / "no-lab")
    result = invoke(*path.split(), *ARGUMENTS.get(path, []), "--run-dir", run_dir,
                    *(["--json"] if as_json else []))
    assert result.exit_code == 3, result.output
    assert f"No lab is running from {run_dir}" in result.stderr
    if as_json:
        document = one_document(result)
        assert document["error"]["kind"] == "unreachable"
        assert document["exit_status"] == 3
    else:
        assert result.stdout == ""


@pytest.mark.parametrize("path", [p for p in NEED_A_LAB if p != "logs"])
def test_a_lab_whose_processes_are_gone_is_no_lab(path: str, tmp_path: Path) -> None:
    """After a reboot or a kill, state.json outlives the lab: every command that
    needs a lab says so (exit 3) instead of failing on dead ports with a
    traceback; `logs` still reads why it died and `down` clears it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_dir = tmp_path / "dead-lab"
    run_dir.mkdir()
    (run_dir / "state.json").write_text(json.dumps(
        {"ports": {}, "services": {"engine": {"pid": dead.pid, "log": str(run_dir / "e.log")}}}))
    result = invoke(*path.split(), *ARGUMENTS.get(path, []), "--run-dir", str(run_dir),
                    "--json")
    assert result.exit_code == 3, result.output
    assert one_document(result)["error"]["message"].startswith(
        f"The lab in {run_dir} is not running")
    assert invoke("logs", "--run-dir", str(run_dir), "--json").exit_code == 0
    assert invoke("down", "--run-dir", str(run_dir)).exit_code == 0
    assert not (run_dir / "state.json").exists()


def test_an_error_nobody_turned_into_a_failure_is_one_line_not_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refuse(_: Path) -> None:
        raise StartError("toxiproxy was not ready within 20 s")

    monkeypatch.setattr(lab_commands, "attached", refuse)
    for as_json in (True, False):
        result = invoke("status", "--run-dir", str(tmp_path), *(["--json"] if as_json else []))
        assert result.exit_code == 1
        assert "StartError: toxiproxy was not ready within 20 s" in result.stderr
        assert "Traceback" not in result.output
        if as_json:
            assert one_document(result)["error"]["kind"] == "failed"


@pytest.fixture
def lab(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeLab:
    """A lab every lab command attaches to: in memory, lab.env's addresses,
    two log files."""
    fake = FakeLab(ports=Ports.load(), capabilities=frozenset(Capability))
    for name in ("engine", "gateway"):
        log = tmp_path / f"{name}.log"
        log.write_text("".join(f"{name} line {i}\n" for i in range(1, 6)))
        fake.fake_logs[name] = log
    for module in (lab_commands, toxic_commands, logs_commands):
        monkeypatch.setattr(module, "attached", lambda run_dir, running=True: fake)
    return fake


def with_a_toxic(lab: FakeLab) -> FakeLab:
    with lab.toxiproxy() as client:
        client.add_toxic("edge", Toxic("latency", {"latency": 100}))
    return lab


# Each command's --json success path, run here; the others' are in the test
# files named (they need a lab's edge, or a run of their own).
SUCCESS: dict[str, list[str]] = {
    "status": [],
    "down": ["--run-dir", "{tmp}/none"],
    "logs": ["gateway"],
    "toxic types": [],
    "toxic list": [],
    "toxic where": [],
    "toxic add": ["upstream", "latency", "-a", "latency=100,jitter=5"],
    "toxic update": ["edge", "latency_downstream", "-a", "latency=50"],
    "toxic remove": ["edge", "latency_downstream"],
    "toxic reset": [],
    "toxic cli": ["edge"],
    "proxy enable": ["edge"],
    "proxy disable": ["edge"],
    "scenario list": [],
    "scenario show": ["buffering"],
    "compose tls": ["--dir", "{tmp}/tls"],
    "console": [],
}
ELSEWHERE = {
    "up": "tests/integration/test_toxiproxy_cli.py (up_json), test_cli_up.py",
    "chat": "tests/integration/test_toxiproxy_cli.py",
    "check": "tests/integration/test_check_command.py",
    "soak": "tests/unit/streamlab/commands/test_experiment_exits.py",
    "scenario run": "tests/unit/streamlab/commands/test_scenario_run_all.py",
    "scenario matrix": "tests/integration/test_proxy_matrix.py",
    "compose config": "test_compose_config_check_is_one_document below",
    "install toxiproxy": "its own tests (a Go build: minutes)",
    "trace": "tests/integration/test_tracing.py (a lab up with --tracing, Jaeger)",
    **{path: "tests/integration/test_bench_*.py, test_experiment_exits.py"
       for path in COMMANDS if path.startswith("bench ")},
}


def test_every_command_s_json_result_is_tested_somewhere() -> None:
    assert set(SUCCESS) | set(ELSEWHERE) >= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(SUCCESS))
def test_a_json_result_is_one_document(path: str, lab: FakeLab, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import uvicorn

    with_a_toxic(lab)
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: None)  # the console's server
    monkeypatch.setattr(toxic_commands, "find_toxiproxy", lambda name: "echo")
    args = [a.replace("{tmp}", str(tmp_path)) for a in SUCCESS[path]]
    result = invoke(*path.split(), *args, "--json")
    assert result.exit_code == 0, result.output
    assert one_document(result)


def test_the_json_results_say_what_happened(lab: FakeLab) -> None:
    with_a_toxic(lab)
    removed = one_document(invoke("toxic", "remove", "edge", "latency_downstream", "--json"))
    assert removed["proxies"]["edge"]["toxics"] == []
    disabled = one_document(invoke("proxy", "disable", "upstream", "--json"))
    assert disabled["proxies"]["upstream"]["enabled"] is False
    reset = one_document(invoke("toxic", "reset", "--json"))
    assert all(proxy["enabled"] and not proxy["toxics"] for proxy in reset["proxies"].values())
    logs = one_document(invoke("logs", "--tail", "2", "--json"))
    assert logs["logs"]["gateway"]["lines"] == ["gateway line 4", "gateway line 5"]


def test_compose_config_check_is_one_document() -> None:
    """Up to date (0) or drifted (1, the drift as the error): one document either way."""
    result = invoke("compose", "config", "--check", "--json")
    assert result.exit_code in (0, 1), result.output
    document = one_document(result)
    assert document == {"up_to_date": True} or document["error"]["kind"] == "failed"


def test_a_refusing_toxiproxy_is_exit_1_with_its_words(lab: FakeLab) -> None:
    result = invoke("toxic", "update", "edge", "no-such-toxic", "--json")
    assert result.exit_code == 1, result.output
    assert "no toxic 'no-such-toxic' on edge" in one_document(result)["error"]["message"]


def test_an_interrupted_command_under_json_is_a_document_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(toxic_commands, "print_json", interrupted)
    result = invoke("toxic", "types", "--json")
    assert result.exit_code == 130
    assert one_document(result)["error"]["kind"] == "interrupted"


# ---- scenario list, piped or on a terminal ------------------------------------------------
def test_scenario_list_piped_is_every_summary_whole() -> None:
    result = invoke("scenario", "list")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(names())
    for line, name in zip(lines, names(), strict=True):
        assert line.endswith(get(name).summary), line
    assert "…" not in result.stdout


def test_scenario_list_on_a_terminal_fits_its_width(monkeypatch: pytest.MonkeyPatch) -> None:
    from rich.console import Console

    monkeypatch.setattr(scenario_commands, "console",
                        Console(force_terminal=True, width=WIDTH, color_system=None))
    result = invoke("scenario", "list")
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == list(names())
    assert max(len(line) for line in lines) <= WIDTH
    assert any(line.endswith("…") for line in lines)


# ---- completion -----------------------------------------------------------------------------
def complete(words: str) -> list[str]:
    result = CliRunner().invoke(app, [], prog_name="streamlab", env={
        "_STREAMLAB_COMPLETE": "complete_bash", "COMP_WORDS": words,
        "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))})
    assert result.exit_code == 0, result.output
    return result.stdout.split()


@pytest.mark.parametrize(("words", "offered"), [
    ("streamlab scenario run bu", {"buffering", "buffering-header"}),
    ("streamlab scenario run al", {"all"}),
    ("streamlab scenario show idle", {"idle-cut"}),
    ("streamlab toxic add ed", {"edge", "edge-h2"}),
    ("streamlab toxic add edge la", {"latency"}),
    ("streamlab proxy disable up", {"upstream"}),
    ("streamlab up --proxy ha", {"haproxy"}),
    ("streamlab scenario matrix --proxy tr", {"traefik"}),
    ("streamlab check http://127.0.0.1:8000/v1 --only heart", {"heartbeat"}),
    ("streamlab soak --broken rel", {"relay=detached_unbounded"}),
    ("streamlab logs gat", {"gateway"}),
    ("streamlab bench transports --rep", {"--repeat"}),  # not its old name --reps
    ("streamlab bench engine-death --bli", {"--blip-s"}),
])
def test_completion_offers_the_registries_names(words: str, offered: set[str]) -> None:
    assert set(complete(words)) == offered


def test_completion_of_a_toxic_name_asks_the_lab(lab: FakeLab,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import streamlab.commands.completion as completion

    with_a_toxic(lab)
    monkeypatch.setattr(completion, "_local_lab", lambda ctx: lab)
    assert complete("streamlab toxic remove edge lat") == ["latency_downstream"]


# ---- streamlab logs -------------------------------------------------------------------------
def test_logs_prints_each_service_s_last_lines_after_its_name(lab: FakeLab) -> None:
    result = invoke("logs", "--tail", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "engine  | engine line 4", "engine  | engine line 5",
        "gateway | gateway line 4", "gateway | gateway line 5"]
    one = invoke("logs", "engine", "--tail", "0")
    assert one.stdout.splitlines() == [f"engine line {i}" for i in range(1, 6)]


def test_logs_of_the_edge_proxy_by_its_own_name(lab: FakeLab, tmp_path: Path) -> None:
    """`status` names the proxy in nginx's slot (haproxy); `logs haproxy` reads it."""
    lab.edge_proxy = "haproxy"
    log = tmp_path / "nginx.log"
    log.write_text("haproxy line 1\n")
    lab.fake_logs["nginx"] = log
    result = invoke("logs", "haproxy", "--tail", "0")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["haproxy line 1"]


def test_logs_of_a_service_the_lab_lacks_is_a_usage_error(lab: FakeLab) -> None:
    result = invoke("logs", "nginx-9")
    assert result.exit_code == 2
    assert "no service 'nginx-9' in this lab; it has: engine, gateway" in result.stderr
    assert invoke("logs", "--follow", "--json").exit_code == 2


def test_tail_reads_the_last_lines_of_a_long_log(tmp_path: Path) -> None:
    log = tmp_path / "long.log"
    log.write_text("".join(f"line {i} {'x' * 100}\n" for i in range(5000)))
    last = logs_commands.tail_lines(log, 3)
    assert [line.split()[1] for line in last] == ["4997", "4998", "4999"]
    assert len(logs_commands.tail_lines(log, 0)) == 5000
    assert logs_commands.tail_lines(tmp_path / "missing.log", 3) == []


def test_follow_prints_new_lines_until_the_lab_stops(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    log.write_text("before\n")
    follower = logs_commands.Follower({"gateway": log})
    written: list[tuple[str, str]] = []
    polls = iter(range(4))

    def going() -> bool:
        step = next(polls, None)
        if step == 0:
            with log.open("a") as out:
                out.write("one\ntw")  # a line half written: printed once whole
        elif step == 1:
            with log.open("a") as out:
                out.write("o\n")
        elif step == 2:
            log.write_text("rotated\n")  # shorter: read again from its start
        return step is not None

    logs_commands.follow(follower, lambda name, line: written.append((name, line)), going,
                         poll_s=0)
    assert written == [("gateway", "one"), ("gateway", "two"), ("gateway", "rotated")]


def wide_table() -> Table:
    table = Table("wire", "window s", "blip whole", "resumed p50 s", "resumed p99 s",
                  "told retry", "terminal p50 s", "terminal p99 s", "others whole")
    table.add_row("multiplexed", "6", "60/60", "3.05", "3.17", "30/30", "6.01", "6.02", "30/30")
    return table


@pytest.mark.parametrize(("columns", "cut"), [(None, False), ("80", True)])
def test_a_table_is_not_cut_to_80_columns_without_a_terminal(
    monkeypatch: pytest.MonkeyPatch, columns: str | None, cut: bool
) -> None:
    """In CI or a script's pipe (no terminal) a table is data: whole. COLUMNS,
    when the user sets it, is the width, as rich does."""
    monkeypatch.setattr(conventions, "any_terminal", lambda: False)
    out = io.StringIO()
    env = {} if columns is None else {"COLUMNS": columns}
    OutputConsole(file=out, _environ=env).print(wide_table())
    text = out.getvalue()
    assert ("…" in text) is cut
    assert ("multiplexed" in text) is not cut
    plain = io.StringIO()
    Console(file=plain, _environ={}).print(wide_table())  # rich's own: cut at 80
    assert "…" in plain.getvalue()


@pytest.mark.parametrize("args", [["compose", "config"], ["compose", "tls"], ["status"]])
def test_the_compose_lab_from_a_wheel_says_it_needs_a_clone(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    """Installed without a clone there is no compose.yaml: exit 2 and why, not a
    FileNotFoundError, nor a CA key written into site-packages."""
    import streamlab.commands.compose as compose_commands

    for module in (compose_commands, lab_commands):
        monkeypatch.setattr(module, "clone", lambda: None)
    result = invoke(*args, "--json", env={"STREAMLAB_TARGET": "compose"})
    assert result.exit_code == 2, result.output
    assert "clone of streamlab's repository" in one_document(result)["error"]["message"]


def test_bench_load_against_nothing_is_unreachable_not_as_expected() -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = invoke("bench", "load", f"http://127.0.0.1:{port}/v1/chat/completions",
                    "--concurrency", "3", "--json")
    assert result.exit_code == 3, result.output
    assert "no stream connected" in one_document(result)["error"]["message"]


def test_compose_logs_are_grouped_by_service_as_the_local_labs() -> None:
    from streamlab.commands.logs import by_service

    lines = ["Attaching to x_gateway_1, x_gateway-2_1",  # compose's own words
             "gateway_1    | started", "gateway-2_1  | ready | yes", "gateway-2-1  | v2 line",
             "engine-1  |  indented"]
    assert by_service(lines) == {"gateway": ["started"],
                                 "gateway-2": ["ready | yes", "v2 line"],
                                 "engine": [" indented"]}


def test_a_console_on_a_port_in_use_is_one_failure_document() -> None:
    """Not the "serving" document and then uvicorn's exit 3 (the CLI's "no lab")."""
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result = invoke("console", "--host", "127.0.0.1", "--port", str(port), "--json")
    assert result.exit_code == 1, result.output
    document = one_document(result)
    assert f"cannot listen on 127.0.0.1:{port}" in document["error"]["message"]
