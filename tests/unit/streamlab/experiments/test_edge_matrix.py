"""The proxy matrix's rendering (edge_matrix.py) and the config edits its
reload and ceiling probes make (edge_probes.py), without a lab: the probes
themselves run in tests/integration/test_proxy_matrix.py."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from services.client.openai_stream import StreamResult
from streamlab.cli import app
from streamlab.experiments.render import summary
from streamlab.experiments.report import Figures, Report
from streamlab.experiments.scenarios.edge_matrix import (
    Matrix,
    ProxyRow,
    grid,
    headline,
    markdown,
    names_a_fix,
    plot,
    proven,
    rows_for_table,
    shown,
)
from streamlab.experiments.scenarios.edge_probes import (
    PROBES,
    ProbeContext,
    default_path,
    fix_of,
    get_probe,
)
from streamlab.lab.proxies import PROXIES, PROXY_NAMES, ProxySetup, edge_proxy
from streamlab.lab.topology import Ports


def judged(probe: str, form: str, figures: Figures, story: str = "") -> Report:
    """A cell as Probe.run makes it: the probe's checks judged on `figures`."""
    async def measure(ctx: ProbeContext, form: str) -> tuple[Figures, str]:
        return figures, story

    return asyncio.run(dataclasses.replace(get_probe(probe), measure=measure).run(
        None, form))  # type: ignore[arg-type]  # the measure reads no lab


GZIP_LUMP: Figures = {"content_encoding": "gzip", "first_byte_s": 1.4, "total_s": 1.4,
                      "token_spread_s": 0.0, "lump": True, "done": True}
STREAMED: Figures = {"content_encoding": "gzip", "first_byte_s": 0.5, "total_s": 1.45,
                     "token_spread_s": 0.95, "lump": False, "done": True}


def sample() -> Matrix:
    crashed = Report("ceiling", "ready", status="error", reason="probe crashed: boom")
    nginx = ProxyRow("nginx", "nginx/1.22.1", ("default", "ready"), {
        "compression": proven(get_probe("compression"), {
            "default": judged("compression", "default", GZIP_LUMP),
            "ready": judged("compression", "ready", STREAMED)}),
        "ceiling": {"default": judged("ceiling", "default",
                                      {"admitted": 339, "refused": 61, "queued": 0}),
                    "ready": crashed},
    })
    haproxy = ProxyRow("haproxy", "2.6.12", ("default", "ready"), error="port in use")
    return Matrix([nginx, haproxy], ["compression", "ceiling"], "2026-12-02T06:00:00Z", 12.0)


def test_a_cell_is_the_probes_report_in_the_reports_words() -> None:
    lump = judged("compression", "default", GZIP_LUMP)
    assert lump.verdict == "UNEXPECTED"
    assert [c.description for c in lump.failures] == ["lump == False"]
    assert judged("compression", "ready", STREAMED).verdict == "as expected"
    assert summary(lump, ("content_encoding", "first_byte_s")) == \
        "UNEXPECTED (content_encoding gzip, first_byte_s 1.4)"


def test_a_probe_that_cannot_measure_or_crashes_is_an_error_with_its_reason() -> None:
    async def no_job(ctx: ProbeContext, form: str) -> tuple[Figures, str]:
        raise RuntimeError("no job to ask for (HTTP 500)")

    async def crash(ctx: ProbeContext, form: str) -> tuple[Figures, str]:
        raise ValueError("boom")

    probe = get_probe("client-address")
    for measure, reason in ((no_job, "RuntimeError: no job to ask for (HTTP 500)"),
                            (crash, "ValueError: boom")):
        report = asyncio.run(dataclasses.replace(probe, measure=measure).run(
            None, "default"))  # type: ignore[arg-type]
        assert (report.status, report.verdict, report.reason) == ("error", "error", reason)


# Per probe: the figures of a stream it breaks and of one it keeps whole.
BROKEN_AND_WHOLE: dict[str, tuple[Figures, Figures]] = {
    "buffering": ({"lump": True, "done": True}, {"lump": False, "done": True}),
    "compression": (GZIP_LUMP, STREAMED),
    "idle-cut": ({"done": False}, {"done": True}),
    "websocket": ({"handshake_status": 404, "done": False},
                  {"handshake_status": 101, "done": True}),
    "slow-reader": ({"cut_after_s": None}, {"cut_after_s": 3.57}),
    "client-leaves": ({"cancel_latency_ms": 2845.4}, {"cancel_latency_ms": 0.6}),
    "client-address": ({"other_client_reads_it": 200}, {"other_client_reads_it": 404}),
    "headers-held": ({"headers_held": True, "done": True}, {"headers_held": False, "done": True}),
    "reload": ({"cut": 8}, {"cut": 0}),
    "ceiling": ({"admitted": 239}, {"admitted": 1200}),
}


@pytest.mark.parametrize("probe", [p.name for p in PROBES])
def test_each_probes_checks_fail_on_a_broken_stream_and_hold_on_a_whole_one(probe: str) -> None:
    broken, whole = BROKEN_AND_WHOLE[probe]
    default, ready = judged(probe, "default", broken), judged(probe, "ready", whole)
    assert (default.as_expected, ready.as_expected) == (False, True)
    proved = proven(get_probe(probe), {"default": default, "ready": ready})["ready"]
    assert proved.discriminates
    assert proved.as_json()["discriminates"] is True


def test_a_ready_form_that_fails_what_failed_out_of_the_box_fails_the_run() -> None:
    """Where the proxy names a fix (nginx's send_timeout), its ready form must
    hold the checks that failed out of the box; where it names none (Caddy has
    no timeout per write), both failing is the fact the matrix records."""
    broken, _ = BROKEN_AND_WHOLE["slow-reader"]
    cells = proven(get_probe("slow-reader"), {"default": judged("slow-reader", "default", broken),
                                              "ready": judged("slow-reader", "ready", broken)})
    rows = [ProxyRow(name, "", ("default", "ready"), {"slow-reader": cells})
            for name in ("nginx", "caddy")]
    matrix = Matrix(rows, ["slow-reader"])
    assert not names_a_fix("slow-reader", "caddy")
    assert names_a_fix("slow-reader", "nginx")
    assert matrix.undiscriminating == [("nginx", "slow-reader")]
    assert matrix.as_json()["undiscriminating"] == ["nginx slow-reader"]
    assert sample().undiscriminating == []


def test_the_table_has_a_row_per_failure_and_proxy_with_figures_and_the_fix() -> None:
    rows = rows_for_table(sample())
    assert [(probe, proxy) for probe, proxy, *_ in rows] == [
        ("compression", "nginx"), ("compression", "haproxy"),
        ("ceiling", "nginx"), ("ceiling", "haproxy")]
    _, _, default, ready, fix = rows[0]
    assert summary(default, shown("compression")).startswith(
        "UNEXPECTED (content_encoding gzip, first_byte_s 1.4")
    assert ready is not None
    assert summary(ready, shown("compression")).startswith("as expected (")
    assert fix == fix_of("compression", "nginx") == PROXIES["nginx"].probe_fixes["compression"].text
    # A lab that did not come up, and a probe that crashed, say so.
    assert summary(rows[1][2]) == "error (port in use)"
    assert rows[2][3] is not None
    assert summary(rows[2][3]) == "error (probe crashed: boom)"


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
    assert summary(cell) == "error ([ALERT]    (14861) : config : parsing " \
                            "[/tmp/run/haproxy.cfg:3] : 'timeout' supports (got 'sever'))"
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
                   {"idle-cut": {"yours": judged("idle-cut", "yours",
                                                 {"pause_s": 2.0, "done": False},
                                                 "cut by `read_timeout` 1 s (line 7)")}},
                   config="mine.Caddyfile")
    text = markdown(Matrix([row], ["idle-cut"]))
    assert "| proxy | your config | fixing directive |" in text.splitlines()
    assert "| caddy | UNEXPECTED (pause_s 2, done no); cut by `read_timeout` 1 s (line 7) |" \
        in text
    assert Matrix([row], ["idle-cut"]).yours_broken


def test_json_round_trips() -> None:
    matrix = sample()
    again = Matrix.from_json(json.loads(json.dumps(matrix.as_json())))
    assert again.as_json() == matrix.as_json()
    assert not again.measured  # a crashed probe and a lab that never came up


def test_a_matrix_saved_before_its_cells_were_reports_is_judged_again() -> None:
    """The cells of docs/results/proxy-matrix.json as first written: `broken`
    and `note` beside the figures, which are judged again."""
    old = {"proxy": "nginx", "forms": ["default", "ready"], "cells": {"compression": {
        "default": {"broken": True, "figures": GZIP_LUMP, "note": ""},
        "ready": {"broken": False, "figures": STREAMED, "note": "a note"}}}}
    cells = ProxyRow.from_json(old).cells["compression"]  # type: ignore[arg-type]
    assert (cells["default"].verdict, cells["ready"].verdict) == ("UNEXPECTED", "as expected")
    assert cells["ready"].story == "a note"
    assert cells["ready"].discriminates


def test_a_matrix_is_measured_only_when_every_cell_is() -> None:
    whole = judged("buffering", "default", {"lump": False, "done": True})
    row = ProxyRow("nginx", "", ("default",), {"buffering": {"default": whole}})
    assert Matrix([row], ["buffering"]).measured
    row.cells["buffering"]["default"] = Report("buffering", "default", status="error")
    assert not Matrix([row], ["buffering"]).measured


def test_the_grid_has_a_column_per_proxy_and_form() -> None:
    probes, labels, reports = grid(sample())
    assert probes == ["compression", "ceiling"]
    assert labels == ["nginx\nout of the box", "nginx\nready", "haproxy\nout of the box",
                      "haproxy\nready"]
    assert [[r.verdict for r in line] for line in reports] == [
        ["UNEXPECTED", "as expected", "error", "error"], ["UNEXPECTED", "error", "error", "error"]]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = plot(sample(), tmp_path / "matrix.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_probe_names_a_fix_for_every_proxy() -> None:
    assert len(PROBES) >= 10
    for probe in PROBES:
        assert all(fix_of(probe.name, proxy) for proxy in PROXY_NAMES), probe.name


def test_whether_a_proxy_names_a_fix_is_said_not_read_from_its_wording() -> None:
    # Caddy's fix for a leaving client starts "no flush_interval -1": a directive
    # to leave out, still the ready form's; nginx fixes every probe it fails.
    assert names_a_fix("client-leaves", "caddy")
    assert all(names_a_fix(probe.name, "nginx") for probe in PROBES)
    assert not names_a_fix("buffering", "traefik")
    assert not names_a_fix("buffering", "no-such-proxy")


def test_a_lump_is_a_late_first_byte_and_bunched_tokens() -> None:
    streamed = StreamResult(first_byte_s=0.4, token_times=[0.4 + 0.05 * i for i in range(20)],
                            total_s=1.4, done=True)
    lump = StreamResult(first_byte_s=1.35, token_times=[1.35] * 20, total_s=1.4, done=True)
    assert not streamed.lump
    assert lump.lump


def test_nginx_client_address_probe_uses_the_location_without_the_header() -> None:
    assert default_path("client-address", "nginx") == "/no-forwarded-for/"
    assert default_path("client-address", "haproxy") == "/buffered/"
    assert default_path("buffering", "nginx") == "/buffered/"


def lab_config(name: str, run_dir: Path) -> str:
    """The lab's own config for a proxy as the lab writes it (nginx's rendered)."""
    setup = ProxySetup(Ports(), run_dir)
    return edge_proxy(name).write_config(setup).read_text()


@pytest.mark.parametrize("name", [n for n, p in PROXIES.items() if p.reload_bound])
def test_the_reload_bound_is_in_the_lab_config_once(name: str, tmp_path: Path) -> None:
    """The reload probe removes it (default) or shortens it (a hard stop):
    a pattern that missed would measure the lab's config twice."""
    bound = PROXIES[name].reload_bound
    assert bound is not None
    pattern, line = bound
    text = lab_config(name, tmp_path)
    assert len(pattern.findall(text)) == 1
    shortened = pattern.sub(line(1), text)
    assert pattern.findall(shortened) == [line(1)]
    assert not pattern.findall(pattern.sub("", text))


@pytest.mark.parametrize("name", [n for n, p in PROXIES.items() if p.ceiling_pattern])
def test_the_connection_limit_is_in_the_lab_config_once(name: str, tmp_path: Path) -> None:
    pattern = PROXIES[name].ceiling_pattern
    assert pattern is not None
    assert len(pattern.findall(lab_config(name, tmp_path))) == 1


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
