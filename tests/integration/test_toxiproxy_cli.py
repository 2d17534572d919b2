"""Toxiproxy's own CLI reaches every hop through what the lab says: the hops live
in two Toxiproxy processes, so `toxiproxy-cli` pointed at the default API (the
client-side one) finds no `upstream`; `streamlab toxic where` names the right
`-h` and `streamlab toxic cli` uses it. And `chat --json` against the real chain."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from streamlab.cli import app
from streamlab.commands.lab import up_json
from streamlab.lab.local import Lab, find_toxiproxy
from streamlab.lab.toxiproxy import Toxic, Toxiproxy

pytestmark = pytest.mark.integration

STREAMLAB = Path(sys.executable).parent / "streamlab"


def where(lab: Lab) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["toxic", "where", "--json", "--run-dir", str(lab.run_dir)])
    assert result.exit_code == 0, result.output
    answer: dict[str, Any] = json.loads(result.output)
    return answer


def official(api: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_toxiproxy("toxiproxy-cli"), "-h", api, *args],
                          capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize("hop", ["upstream", "engine", "edge"])
def test_toxiproxy_cli_inspects_each_hop_at_the_api_the_lab_names(
        lab: Lab, toxiproxy: Toxiproxy, hop: str) -> None:
    toxiproxy.add_toxic(hop, Toxic("latency", {"latency": 7}, name="seen_by_official"))
    api = where(lab)[hop]["api"]

    done = official(api, "inspect", hop)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "proxy not found" not in done.stdout + done.stderr
    assert "seen_by_official" in done.stdout  # the toxic we put on that hop


def test_the_default_api_does_not_serve_the_backend_hops(lab: Lab) -> None:
    """Why `toxic where` exists: the client-side process knows no `upstream`."""
    hops = where(lab)
    assert hops["upstream"]["api"] != hops["edge"]["api"]
    done = official(hops["edge"]["api"], "inspect", "upstream")
    assert "proxy not found" in (done.stdout + done.stderr).lower()


def test_toxic_cli_runs_toxiproxy_cli_against_the_hop_s_process(
        lab: Lab, toxiproxy: Toxiproxy) -> None:
    run_dir = ["--run-dir", str(lab.run_dir)]
    done = subprocess.run(
        [str(STREAMLAB), "toxic", "cli", "engine", *run_dir, "--",
         "toxic", "add", "-t", "latency", "-a", "latency=31", "-n", "through_ours", "engine"],
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    assert toxiproxy.toxics("engine")[0]["attributes"]["latency"] == 31
    # Without ARGS it inspects the hop.
    inspected = subprocess.run([str(STREAMLAB), "toxic", "cli", "engine", *run_dir],
                               capture_output=True, text=True, timeout=30)
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    assert "through_ours" in inspected.stdout


def test_chat_json_is_the_reply_and_its_timings(lab: Lab) -> None:
    result = CliRunner().invoke(app, ["chat", "hello", "--json", "--tokens", "5", "--gap-ms",
                                      "5", "--request-id", "cli-json-1",
                                      "--run-dir", str(lab.run_dir)])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.output)
    assert reply["tokens"] == 5
    assert reply["text"]
    assert reply["request_id"] == "cli-json-1"
    assert reply["finish_reason"] in ("length", "stop")
    assert reply["done"] is True
    assert 0 < reply["ttft_s"] <= reply["total_s"]
    assert reply["error"] is None


def testup_json_names_every_service_and_the_urls_up_prints(lab: Lab) -> None:
    """`up --json`'s document, from the lab the fixture started (`up` itself
    would start a second lab on lab.env's ports)."""
    shown = json.loads(json.dumps(up_json(lab, True, lab.run_dir)))
    assert shown["services"] == json.loads(json.dumps(lab.status()))
    assert all(service["healthy"] for service in shown["services"].values())
    assert shown["urls"]["edge"] == lab.edge_url
    assert shown["urls"]["gateway"] == lab.gateway_url
    assert shown["urls"]["console"].startswith("http://")
    assert shown["ca_cert"] == str(lab.tls.ca_cert)
