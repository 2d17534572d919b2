"""`streamlab check`: the lab's own gateway passes every check, and each
misbehaving server (tests/integration/check_servers.py) is flagged by the
matching check and not by the others."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

from streamlab.experiments.check.runner import CHECKS, check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import line, table, verdict
from streamlab.experiments.report import JSON, Report
from streamlab.lab.processes import free_ports
from streamlab.lab.target import LabTarget
from tests.integration.check_servers import (
    MODEL,
    PAUSE_AFTER,
    MisbehavingServer,
    Resume,
    keep,
    serve,
)

pytestmark = [
    pytest.mark.integration, pytest.mark.anyio,
    # Their subject is the check against servers the tests run themselves: the
    # container topology adds nothing (the lab gateway's test says its own reason).
    pytest.mark.local_only("the check against servers the test runs in-process"),
]

# Short enough for a test, and long against the lab's test heartbeat (0.5 s).
SILENCE_S, IDLE_CUT_S = 3.0, 1.5
# Paced long answers (the test servers pace up to 4,000 tokens, 20 ms apart:
# 20 s), so a generation left running outlasts the time the check gives the
# server to stop it; a longer one is made at full speed (the slow reader's).
PACED_ANSWER = 1000


def verdicts(report: Report) -> dict[str, str]:
    return {part.variant: verdict(part) for part in report.parts}


def target(url: str, model: str = MODEL, metrics_url: str | None = None,
           answer_tokens: int = 12000) -> CheckTarget:
    return CheckTarget(url, model, metrics_url=metrics_url, silence_s=SILENCE_S,
                       idle_cut_s=IDLE_CUT_S, streams=6, stop_within_s=2.0, timeout_s=20.0,
                       answer_tokens=answer_tokens)


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
        report = await check_url(target(url, metrics_url=url.removesuffix("/v1") + "/metrics",
                                        answer_tokens=PACED_ANSWER),
                                 only=("framing", "errors", "first-byte", "cancel",
                                       "concurrency"))
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


async def test_an_answer_the_buffers_hold_whole_cannot_judge_a_slow_reader() -> None:
    # --answer-tokens 5000: ~0.9 MB, made at full speed, under what a path can hold.
    with serve(MisbehavingServer("grow")) as url:
        report = await check_url(target(url, answer_tokens=5000), only=("slow-reader",))
    (only,) = report.parts
    assert verdict(only) == "n/a", explained(report)
    assert only.reason.startswith("needs long: the whole answer (")
    assert only.figures["answer_tokens"] == 5000


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


async def test_the_running_gauge_is_found_at_the_servers_root() -> None:
    with serve(MisbehavingServer("leak")) as url:
        report = await check_url(target(url, answer_tokens=PACED_ANSWER),  # no metrics_url
                                 only=("cancel",))
    (part,) = report.parts
    assert verdict(part) == "fail", explained(report)
    assert part.figures["observed_by"] == "metrics (vllm:num_requests_running)"
    assert part.figures["metrics_found"] is True
    assert part.figures["metrics_url"] == url.removesuffix("/v1") + "/metrics"


@pytest.mark.parametrize(("mode", "shown"), [("leak", "fail"), ("good", "pass")])
async def test_without_metrics_cancel_is_felt_by_timing_on_a_server_with_one_slot(
        mode: Literal["leak", "good"], shown: str) -> None:
    # One slot, as an engine whose batch is full: a fresh request waits behind
    # a generation its client left unless the server stops it.
    with serve(MisbehavingServer(mode, slots=1, metrics=False)) as url:
        report = await check_url(target(url, answer_tokens=PACED_ANSWER), only=("cancel",))
    (part,) = report.parts
    assert verdict(part) == shown, explained(report)
    assert part.figures["observed_by"] == "timing (no running gauge)"
    assert part.figures["ttft_beside_s"] is None  # the control: it waited beside them
    if shown == "fail":
        assert part.figures["stopped_after_s"] is None
        assert "inferred by timing" in line(part)
    else:
        assert part.figures["stopped_after_s"] <= 2.0  # type: ignore[operator]


async def test_without_metrics_a_server_with_slots_to_spare_cannot_be_judged() -> None:
    with serve(MisbehavingServer("leak", metrics=False)) as url:
        report = await check_url(target(url, answer_tokens=PACED_ANSWER), only=("cancel",))
    (part,) = report.parts
    assert verdict(part) == "n/a", explained(report)
    assert part.reason.startswith("not observable by timing: a fresh stream beside 2 running")
    assert "--leave-streams" in part.reason  # what the user can do about it


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
    assert "STREAMLAB_NO_SUCH_VAR is not set" in unset.stderr


@pytest.mark.parametrize(("ping_s", "shown"), [(None, "fail"), (0.5, "pass")])
async def test_a_silence_mid_answer_is_judged_like_one_before_the_first_token(
        ping_s: float | None, shown: str) -> None:
    # A model that thinks for 3 s after its fifth token (a reasoning model that
    # hides its thinking): its first token comes at once.
    with serve(MisbehavingServer("good", pause_s=SILENCE_S, ping_s=ping_s)) as url:
        report = await check_url(target(url), only=("heartbeat", "idle-cut", "concurrency"))
    got = verdicts(report)
    assert got["heartbeat"] == got["idle-cut"] == shown, explained(report)
    heartbeat = part(report, "heartbeat")
    assert heartbeat.figures["wait_where"] == f"after token read {PAUSE_AFTER}"
    assert heartbeat.figures["longest_wait_s"] >= SILENCE_S  # type: ignore[operator]
    if shown == "fail":
        assert heartbeat.figures["silence_where"] == f"after token read {PAUSE_AFTER}"
        assert "no byte for that long (after token read 5)" in line(heartbeat)
        assert part(report, "idle-cut").figures["cut_where"] == f"after token read {PAUSE_AFTER}"
    # The pause is one stream's own: several at once have it too, and it is no
    # concurrency stall (the false alarm this guards against).
    assert got["concurrency"] == "pass", explained(report)
    assert part(report, "concurrency").figures["lone_max_gap_s"] >= SILENCE_S  # type: ignore[operator]


async def test_streams_that_stall_in_turns_fail_concurrency_though_one_alone_does_not() -> None:
    with serve(MisbehavingServer("good", turns=True)) as url:
        report = await check_url(target(url), only=("concurrency",))
    (only,) = report.parts
    assert verdict(only) == "fail", explained(report)
    assert only.figures["lone_max_gap_s"] < 0.5  # type: ignore[operator]
    assert only.figures["gap_p99_s"] > 0.5  # type: ignore[operator]


@pytest.mark.parametrize(("fault", "figure"), [({"role": False}, "role_first"),
                                               ({"finish": False}, "finish_last")])
async def test_a_stream_without_its_role_or_finish_fails_shape_and_passes_once_fixed(
        fault: dict[str, bool], figure: str) -> None:
    with serve(MisbehavingServer("good", **fault)) as url:  # type: ignore[arg-type]
        broken = await check_url(target(url), only=("shape",))
    with serve(MisbehavingServer("good")) as url:
        fixed = await check_url(target(url), only=("shape",))
    assert verdicts(broken) == {"shape": "fail"}, explained(broken)
    assert line(broken.parts[0]).startswith(f"fail  shape: {figure} == True (measured no)")
    assert verdicts(fixed) == {"shape": "pass"}, explained(fixed)
    assert fixed.parts[0].figures["unasked_usage_chunks"] == 0


async def test_tool_call_deltas_are_judged_as_the_sdks_accumulate_them() -> None:
    with serve(MisbehavingServer("good", tools="bad")) as url:
        broken = await check_url(target(url), only=("tool-calls",))
    with serve(MisbehavingServer("good", tools="good")) as url:
        fixed = await check_url(target(url), only=("tool-calls",))
    with serve(MisbehavingServer("good")) as url:
        none = await check_url(target(url), only=("tool-calls",))
    (bad,), (good,), (na,) = broken.parts, fixed.parts, none.parts
    assert verdict(bad) == "fail", explained(broken)
    assert bad.figures["deltas_without_index"] == 3
    assert bad.figures["repeated_id_or_name"] == 2  # the id and name on every delta
    assert verdict(good) == "pass", explained(fixed)
    assert good.figures["calls"] == 1
    assert verdict(na) == "n/a"
    assert na.reason.startswith("told to call get_weather, the server answered without")


@pytest.mark.parametrize(("mode", "shown"), [("grow", "fail"), ("good", "pass")])
async def test_without_metrics_a_slow_reader_is_judged_by_how_the_rest_of_the_answer_comes(
        mode: Literal["grow", "good"], shown: str) -> None:
    # 8,000 tokens (1.5 MB) made at 4,000 a second, no /metrics: after the
    # pause, a server that buffered sends the rest at once, one that paused
    # goes on at its pace.
    with serve(MisbehavingServer(mode, metrics=False, fast_tps=4000)) as url:
        report = await check_url(target(url, answer_tokens=8000), only=("slow-reader",))
    (only,) = report.parts
    assert verdict(only) == shown, explained(report)
    assert only.figures["observed_by"] == "timing (no running gauge)"
    assert only.figures["behaviour"] == ("buffered" if shown == "fail" else "paused")
    if shown == "fail":
        assert only.figures["drain_ratio"] < 0.25  # type: ignore[operator]
        assert "(inferred by timing, no running gauge)" in line(only)
    else:
        assert only.figures["drain_ratio"] > 0.5  # type: ignore[operator]


@pytest.mark.local_only("the check runs the local Toxiproxy binary in front of the gateway")
@pytest.mark.parametrize(("heartbeat_s", "shown"), [(0.5, "pass"), (0, "fail")])
async def test_the_lab_gateway_pausing_mid_answer_is_judged_by_its_pings_alone(
        lab: LabTarget, heartbeat_s: float, shown: str) -> None:
    # A server nobody wrote for this check, behaving unusually: the fake model
    # pauses 3 s after its fourth token (and starts at once). With the gateway's
    # pings the pause is no fault: no heartbeat, idle-cut or concurrency alarm.
    # With its pings off (heartbeat_s 0) the same pause fails heartbeat.
    pause: dict[str, JSON] = {"pauses": [{"after_token": 3, "pause_ms": int(SILENCE_S * 1000)}],
                              "heartbeat_s": heartbeat_s}
    checked = replace(target(lab.edge_url + "/v1", "streamlab-fake"), silence_s=0.05,
                      extra_body={"streamlab": pause})
    report = await check_url(checked, only=("heartbeat", "idle-cut", "concurrency"))
    got = verdicts(report)
    assert got["heartbeat"] == got["idle-cut"] == shown, explained(report)
    assert got["concurrency"] == "pass", explained(report)
    heartbeat = part(report, "heartbeat")
    # `after_token` counts from 0: the pause follows the fourth token read.
    assert heartbeat.figures["wait_where"] == "after token read 4"
    assert heartbeat.figures["longest_wait_s"] >= SILENCE_S  # type: ignore[operator]
    if shown == "pass":
        assert heartbeat.figures["comments"] >= 4  # type: ignore[operator]
