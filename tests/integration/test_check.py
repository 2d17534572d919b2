"""`streamlab check`: the lab's own gateway passes every check, and each
misbehaving server (tests/integration/check_servers.py) is flagged by the
matching check and not by the others."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from streamlab.experiments.check.runner import check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import line, verdict
from streamlab.experiments.report import Report
from streamlab.lab.processes import free_ports
from streamlab.lab.target import LabTarget
from tests.integration.check_servers import MODEL, MisbehavingServer, serve

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# Short enough for a test, and long against the lab's test heartbeat (0.5 s).
SILENCE_S, IDLE_CUT_S = 3.0, 1.5


def verdicts(report: Report) -> dict[str, str]:
    return {part.variant: verdict(part) for part in report.parts}


def target(url: str, model: str = MODEL, metrics_url: str | None = None) -> CheckTarget:
    return CheckTarget(url, model, metrics_url=metrics_url, silence_s=SILENCE_S,
                       idle_cut_s=IDLE_CUT_S, streams=6, stop_within_s=2.0, timeout_s=20.0)


def explained(report: Report) -> str:
    return "\n".join(f"{line(part)}\n    {part.figures}" for part in report.parts)


@pytest.mark.local_only("the check runs the local Toxiproxy binary in front of the gateway, "
                        "and its subject is the gateway's own code, the same in containers")
async def test_the_lab_gateway_passes_every_check(lab: LabTarget) -> None:
    report = await check_url(target(lab.edge_url + "/v1", "streamlab-fake",
                                    lab.engine_metrics_url_of("engine")))
    assert set(verdicts(report).values()) == {"pass"}, explained(report)
    heartbeat = next(p for p in report.parts if p.variant == "heartbeat")
    assert heartbeat.figures["comments"] >= 2  # type: ignore[operator]  # pings, not luck


async def test_a_buffering_server_is_flagged_by_first_byte_only() -> None:
    with serve(MisbehavingServer("buffer")) as url:
        report = await check_url(target(url))
    got = verdicts(report)
    assert got["first-byte"] == "fail", explained(report)
    assert got["framing"] == got["errors"] == "pass", explained(report)
    # Nothing else can judge a server that sends everything at once: n/a, never pass or fail.
    assert {got[n] for n in ("heartbeat", "idle-cut", "cancel", "concurrency")} == {"n/a"}, \
        explained(report)


async def test_a_server_without_heartbeat_is_flagged_by_heartbeat_and_idle_cut() -> None:
    server = MisbehavingServer("silent", silence_s=SILENCE_S)
    with serve(server) as url:
        report = await check_url(target(url, metrics_url=url.removesuffix("/v1") + "/metrics"))
    got = verdicts(report)
    assert got["heartbeat"] == got["idle-cut"] == "fail", explained(report)
    assert {got[n] for n in ("framing", "errors", "first-byte", "cancel", "concurrency")} == {
        "pass"}, explained(report)
    idle_cut = next(p for p in report.parts if p.variant == "idle-cut")
    assert idle_cut.figures["reached_done"] is False


async def test_a_server_that_generates_for_nobody_is_flagged_by_cancel() -> None:
    server = MisbehavingServer("leak")
    with serve(server) as url:
        report = await check_url(target(url, metrics_url=url.removesuffix("/v1") + "/metrics"))
    got = verdicts(report)
    assert got["cancel"] == "fail", explained(report)
    assert {got[n] for n in ("framing", "errors", "first-byte", "concurrency")} == {"pass"}, \
        explained(report)
    cancel = next(p for p in report.parts if p.variant == "cancel")
    assert cancel.figures["gauge"] == "vllm:num_requests_running"


async def test_without_metrics_the_cancel_check_says_not_observable() -> None:
    with serve(MisbehavingServer("leak")) as url:
        report = await check_url(target(url), only=("cancel",))
    (part,) = report.parts
    assert verdict(part) == "n/a"
    assert "not observable" in part.reason


def streamlab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamlab.cli", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_the_command_exits_1_on_a_failure_and_writes_junit(tmp_path: Path) -> None:
    junit = tmp_path / "check.xml"
    with serve(MisbehavingServer("silent", silence_s=SILENCE_S)) as url:
        done = streamlab("check", url, "--model", MODEL, "--only", "heartbeat", "--only",
                         "framing", "--idle-cut-s", str(IDLE_CUT_S), "--junit", str(junit))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "fail  heartbeat: longest_silence_s" in done.stdout
    assert "pass  framing" in done.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("tests") == "2"
    assert suite.get("failures") == "1"
    failure = suite.find("testcase[@name='heartbeat']/failure")
    assert failure is not None
    assert "longest_silence_s" in failure.get("message", "")


def test_the_command_exits_3_when_nothing_answers_and_2_on_usage() -> None:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/v1"
    assert streamlab("check", url, "--model", "m").returncode == 3
    assert streamlab("check", "ftp://example/v1", "--model", "m").returncode == 2
    assert streamlab("check", url, "--model", "m", "--only", "nonsense").returncode == 2
    unset = streamlab("check", url, "--model", "m", "--api-key-env", "STREAMLAB_NO_SUCH_VAR")
    assert unset.returncode == 2
    assert "STREAMLAB_NO_SUCH_VAR is not set" in unset.stdout
