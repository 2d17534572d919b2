"""The proxy matrix's rendering (edge_matrix.py) and the config edits its
reload and ceiling probes make (edge_probes.py), without a lab: the probes
themselves run in tests/integration/test_proxy_matrix.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamlab.cli import app
from streamlab.experiments.scenarios.edge_matrix import (
    Matrix,
    ProxyRow,
    grid,
    headline,
    markdown,
    plot,
    rows_for_table,
    verdict,
)
from streamlab.experiments.scenarios.edge_probes import (
    DRAIN_DIRECTIVE,
    FIXES,
    LIMIT_DIRECTIVE,
    PROBES,
    Cell,
    Timed,
    default_path,
    has_content,
)
from streamlab.lab.proxies import PROXY_NAMES, ProxySetup, edge_proxy
from streamlab.lab.topology import Ports


def sample() -> Matrix:
    nginx = ProxyRow("nginx", "nginx/1.22.1", ("default", "ready"), {
        "compression": {
            "default": Cell(True, {"content_encoding": "gzip", "first_byte_s": 1.4,
                                   "total_s": 1.4, "token_spread_s": 0.0}),
            "ready": Cell(False, {"content_encoding": "gzip", "first_byte_s": 0.5,
                                  "total_s": 1.45, "token_spread_s": 0.95}),
        },
        "ceiling": {"default": Cell(True, {"admitted": 339, "refused": 61, "queued": 0}),
                    "ready": Cell(None, {}, "probe crashed: boom")},
    })
    haproxy = ProxyRow("haproxy", "2.6.12", ("default", "ready"), error="port in use")
    return Matrix([nginx, haproxy], ["compression", "ceiling"], "2026-12-02T06:00:00Z", 12.0)


def test_a_cell_reads_broken_ok_or_not_measured() -> None:
    assert verdict(Cell(True)) == "broken"
    assert verdict(Cell(False)) == "ok"
    assert verdict(Cell(None, note="crashed")) == "-"
    assert verdict(None) == "-"


def test_the_table_has_a_row_per_failure_and_proxy_with_figures_and_the_fix() -> None:
    rows = rows_for_table(sample())
    assert [(probe, proxy) for probe, proxy, *_ in rows] == [
        ("compression", "nginx"), ("compression", "haproxy"),
        ("ceiling", "nginx"), ("ceiling", "haproxy")]
    _, _, default, ready, fix = rows[0]
    assert default.startswith("broken (content_encoding gzip, first_byte_s 1.4")
    assert ready.startswith("ok (")
    assert fix == FIXES["compression"]["nginx"]
    # A lab that did not come up, and a probe that crashed, say so.
    assert "port in use" in rows[1][2]
    assert rows[2][3] == "- ; probe crashed: boom".replace(" ;", ";")


# What `ProxyRow.error` holds for a config the proxy refused: streamlab's line
# naming the command, then the proxy's own words (HAProxy's notices first).
HAPROXY_REFUSAL = """haproxy refused the config /tmp/mine.cfg (run as: haproxy -c -f x; exit 1):
[NOTICE]   (14861) : haproxy version is 2.6.12-1+deb12u4
[ALERT]    (14861) : config : parsing [/tmp/run/haproxy.cfg:3] : 'timeout' supports (got 'sever')
[ALERT]    (14861) : config : Fatal errors found in configuration."""


def test_a_refused_config_is_kept_whole_and_its_cell_quotes_the_proxys_error() -> None:
    row = ProxyRow("haproxy", "2.6.12", ("yours",), error=HAPROXY_REFUSAL)
    matrix = Matrix([row], ["compression"], "2026-12-02T06:00:00Z", 1.0)
    (_, _, cell, _, _), = rows_for_table(matrix)
    assert cell == "- ([ALERT]    (14861) : config : parsing [/tmp/run/haproxy.cfg:3] : " \
                   "'timeout' supports (got 'sever'))"
    assert Matrix.from_json(json.loads(json.dumps(matrix.as_json()))).rows[0].error == \
        HAPROXY_REFUSAL
    assert headline("port in use") == "port in use"
    assert headline("caddy refused it:\n{\"level\":\"info\"}\nError: bad duration") == \
        "Error: bad duration"


def test_markdown_is_a_section_per_failure_with_a_row_per_proxy() -> None:
    text = markdown(sample())
    sections = text.split("### ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["compression", "ceiling"]
    compression = sections[0].splitlines()
    assert compression[4] == "| proxy | out of the box | streaming-ready | fixing directive |"
    rows = [line for line in compression[6:] if line]
    assert [row.split(" | ")[0] for row in rows] == ["| nginx", "| haproxy"]
    assert all(row.count(" | ") == 3 for row in rows)


def test_a_user_config_is_one_column() -> None:
    row = ProxyRow("caddy", "2.6.2", ("yours",),
                   {"idle-cut": {"yours": Cell(True, {"pause_s": 2.0},
                                               "cut by `read_timeout` 1 s (line 7)")}},
                   config="mine.Caddyfile")
    text = markdown(Matrix([row], ["idle-cut"]))
    assert "| proxy | your config | fixing directive |" in text.splitlines()
    assert "cut by `read_timeout` 1 s (line 7)" in text


def test_json_round_trips() -> None:
    matrix = sample()
    again = Matrix.from_json(json.loads(json.dumps(matrix.as_json())))
    assert again.as_json() == matrix.as_json()
    assert not again.measured  # a crashed probe and a lab that never came up


def test_a_matrix_is_measured_only_when_every_cell_is() -> None:
    row = ProxyRow("nginx", "", ("default",), {"buffering": {"default": Cell(False)}})
    assert Matrix([row], ["buffering"]).measured
    row.cells["buffering"]["default"] = Cell(None)
    assert not Matrix([row], ["buffering"]).measured


def test_the_grid_has_a_column_per_proxy_and_form() -> None:
    probes, labels, verdicts = grid(sample())
    assert probes == ["compression", "ceiling"]
    assert labels == ["nginx\nout of the box", "nginx\nready", "haproxy\nout of the box",
                      "haproxy\nready"]
    assert verdicts == [["broken", "ok", "-", "-"], ["broken", "-", "-", "-"]]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot(sample(), tmp_path / "matrix.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_probe_names_a_fix_for_every_proxy() -> None:
    assert len(PROBES) >= 10
    for probe in PROBES:
        assert set(probe.fix) == set(PROXY_NAMES), probe.name


def test_a_lump_is_a_late_first_byte_and_bunched_tokens() -> None:
    streamed = Timed(first_byte_s=0.4, token_times=[0.4 + 0.05 * i for i in range(20)],
                     total_s=1.4, done=True)
    lump = Timed(first_byte_s=1.35, token_times=[1.35] * 20, total_s=1.4, done=True)
    assert not streamed.lump
    assert lump.lump


def test_only_a_chunk_with_text_is_a_token() -> None:
    assert has_content('{"choices":[{"delta":{"content":"hi"}}]}')
    assert not has_content('{"choices":[{"delta":{"role":"assistant","content":""}}]}')
    assert not has_content('{"choices":[{"delta":{},"finish_reason":"stop"}]}')
    assert not has_content("[DONE]")


def test_nginx_client_address_probe_uses_the_location_without_the_header() -> None:
    assert default_path("client-address", "nginx") == "/no-forwarded-for/"
    assert default_path("client-address", "haproxy") == "/buffered/"
    assert default_path("buffering", "nginx") == "/buffered/"


def lab_config(name: str, run_dir: Path) -> str:
    """The lab's own config for a proxy as the lab writes it (nginx's rendered)."""
    setup = ProxySetup(Ports(), run_dir)
    return edge_proxy(name).write_config(setup).read_text()


@pytest.mark.parametrize("name", sorted(DRAIN_DIRECTIVE))
def test_the_reload_bound_is_in_the_lab_config_once(name: str, tmp_path: Path) -> None:
    """The reload probe removes it (default) or shortens it (a hard stop):
    a pattern that missed would measure the lab's config twice."""
    pattern, line = DRAIN_DIRECTIVE[name]
    text = lab_config(name, tmp_path)
    assert len(pattern.findall(text)) == 1
    shortened = pattern.sub(line(1), text)
    assert pattern.findall(shortened) == [line(1)]
    assert not pattern.findall(pattern.sub("", text))


@pytest.mark.parametrize("name", sorted(LIMIT_DIRECTIVE))
def test_the_connection_limit_is_in_the_lab_config_once(name: str, tmp_path: Path) -> None:
    text = lab_config(name, tmp_path)
    assert len(LIMIT_DIRECTIVE[name].findall(text)) == 1


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def test_matrix_refuses_an_unknown_proxy_or_probe() -> None:
    assert invoke("scenario", "matrix", "--proxy", "envoy").exit_code == 2
    assert invoke("scenario", "matrix", "--probe", "nothing").exit_code == 2


def test_a_user_config_needs_exactly_one_proxy(tmp_path: Path) -> None:
    config = tmp_path / "mine.cfg"
    config.write_text("defaults\n  mode http\n")
    result = invoke("scenario", "matrix", "--proxy", "nginx", "--proxy", "haproxy",
                    "--proxy-config", str(config))
    assert result.exit_code == 2
    assert "exactly one --proxy" in result.output


def test_a_saved_matrix_renders_without_running_anything(tmp_path: Path) -> None:
    saved = tmp_path / "matrix.json"
    saved.write_text(json.dumps(sample().as_json()))
    result = invoke("scenario", "matrix", "--from-json", str(saved), "--probe", "compression",
                    "--proxy", "nginx", "--markdown")
    assert "### compression" in result.output
    assert "### ceiling" not in result.output
    assert "| haproxy |" not in result.output
    assert result.exit_code == 0  # the rows left are all measured
