"""`streamlab check`: the lab's own gateway passes every check, and each
misbehaving server (tests/integration/check_servers.py) is flagged by the
matching check and not by the others."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from streamlab.experiments.check.runner import CHECKS, check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import line, table, verdict
from streamlab.experiments.report import Report
from streamlab.lab.processes import free_ports
from streamlab.lab.target import LabTarget
from tests.integration.check_servers import MODEL, MisbehavingServer, Resume, keep, serve

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

# Short enough for a test, and long against the lab's test heartbeat (0.5 s).
SILENCE_S, IDLE_CUT_S = 3.0, 1.5


def verdicts(report: Report) -> dict[str, str]:
    return {part.variant: verdict(part) for part in report.parts}


def target(url: str, model: str = MODEL, metrics_url: str | None = None) -> CheckTarget:
    return CheckTarget(url, model, metrics_url=metrics_url, silence_s=SILENCE_S,
                       idle_cut_s=IDLE_CUT_S, streams=6, stop_within_s=2.0, timeout_s=20.0)


def part(report: Report, name: str) -> Report:
    return next(p for p in report.parts if p.variant == name)


def explained(report: Report) -> str:
    return "\n".join(f"{line(part)}\n    {part.figures}" for part in report.parts)


@pytest.mark.local_only("the check runs the local Toxiproxy binary in front of the gateway, "
                        "and its subject is the gateway's own code, the same in containers")
async def test_the_lab_gateway_passes_every_check(lab: LabTarget) -> None:
    metrics = lab.engine_metrics_url_of("engine")
    report = await check_url(target(lab.edge_url + "/v1", "streamlab-fake", metrics),
                             only=tuple(c for c in CHECKS if c != "slow-reader"))
    # The slow reader straight at the gateway: the edge's hops (Toxiproxy, nginx)
    # hold megabytes on loopback, and the check would judge their buffers.
    straight = await check_url(target(lab.gateway_url + "/v1", "streamlab-fake", metrics),
                               only=("slow-reader",))
    every = report.parts + straight.parts
    keep(replace(report, parts=every, tables=(table(every),)), "streamlab-gateway")
    assert set(verdicts(report).values()) == {"pass"}, explained(report)
    assert verdicts(straight) == {"slow-reader": "pass"}, explained(straight)
    heartbeat = part(report, "heartbeat")
    assert heartbeat.figures["comments"] >= 2  # type: ignore[operator]  # pings, not luck
    # Both of the gateway's resumable surfaces were tried, each exactly once.
    assert part(report, "resume").figures["surfaces"] == "streams,responses"
    # The test gateway's send timeout (3 s) is as long as the shortest pause:
    # the stopped reader finds its generation held (paused) or, past the
    # timeout, cut; never made whole for nobody.
    assert part(straight, "slow-reader").figures["behaviour"] in ("paused", "cut")


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


def metrics_of(url: str) -> str:
    return url.removesuffix("/v1") + "/metrics"


async def test_a_server_that_buffers_for_a_stopped_reader_is_flagged_by_slow_reader() -> None:
    with serve(MisbehavingServer("grow")) as url:
        grows = await check_url(target(url, metrics_url=metrics_of(url)), only=("slow-reader",))
    with serve(MisbehavingServer("good")) as url:
        waits = await check_url(target(url, metrics_url=metrics_of(url)), only=("slow-reader",))
    (bad,), (good,) = grows.parts, waits.parts
    assert verdict(bad) == "fail", explained(grows)
    assert line(bad).startswith("fail  slow-reader: behaviour != 'buffered' (measured buffered)")
    assert bad.figures["running_at_pause_end"] == 0  # done while the reader held 5 tokens
    # The same answer from a server whose generation waits for its reader.
    assert verdict(good) == "pass", explained(waits)
    assert good.figures["behaviour"] == "paused"
    assert good.figures["answer_bytes"] == bad.figures["answer_bytes"]


@pytest.mark.slow  # 40 s on 2 cores: `make test-slow`
async def test_an_answer_the_buffers_hold_whole_cannot_judge_a_slow_reader() -> None:
    with serve(MisbehavingServer("grow", max_tokens=2000)) as url:
        report = await check_url(target(url, metrics_url=metrics_of(url)), only=("slow-reader",))
    (only,) = report.parts
    assert verdict(only) == "n/a", explained(report)
    assert only.reason.startswith("needs long: the whole answer (")
    assert only.figures["answer_tokens"] == 2000


@pytest.mark.parametrize(("resume", "duplicates", "missing"),
                         [("replay", 5, 0), ("skip", 0, 2)])
async def test_a_resume_that_replays_or_skips_is_flagged(
        resume: Resume, duplicates: int, missing: int) -> None:
    with serve(MisbehavingServer("good", resume=resume)) as url:
        report = await check_url(target(url), only=("resume",))
    (only,) = report.parts
    assert verdict(only) == "fail", explained(report)
    assert only.figures["streams_duplicates"] == duplicates
    assert only.figures["streams_missing"] == missing
    assert line(only).startswith("fail  resume: streams_exactly_once == True (measured no)")


async def test_a_resume_after_the_last_id_passes_and_no_surface_is_na() -> None:
    with serve(MisbehavingServer("good", resume="exact")) as url:
        exact = await check_url(target(url), only=("resume",))
    with serve(MisbehavingServer("good")) as url:
        none = await check_url(target(url), only=("resume",))
    assert verdicts(exact) == {"resume": "pass"}, explained(exact)
    assert exact.parts[0].figures["surfaces"] == "streams"
    (na,) = none.parts
    assert verdict(na) == "n/a"
    assert na.reason.startswith("needs resumable: streams: POST /streams answered 404")


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
