"""`streamlab check` as a user runs it, against servers that would hang or
exhaust a naive client: each run ends by itself with what it met, its memory
bounded, `--json` one parseable document in every case (usage errors and an
unreachable target included), and a SIGTERM stops every process it started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from streamlab.lab.processes import free_ports
from tests.integration.check_servers import MODEL, Hostile, MisbehavingServer, serve

pytestmark = [pytest.mark.integration,
              pytest.mark.local_only("the command against servers the test runs in-process")]

# The child's peak RSS, printed by a wrapper that runs it (RUSAGE_CHILDREN:
# the check and the Toxiproxy it starts, the larger of the two).
PEAK_RSS = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
            "print(f'peak_rss_kib {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', "
            "file=sys.stderr); sys.exit(done.returncode)")
STREAM_DEADLINE_S, READ_TIMEOUT_S = 5, 3
# What a hostile server may cost: one stream deadline (the checks after the
# first that meets it are not run) plus the read timeout and start-up.
BOUND_S = STREAM_DEADLINE_S + READ_TIMEOUT_S + 30
MAX_RSS_KIB = 300 * 1024


def streamlab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, "-m",
                           "streamlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def peak_rss_kib(done: subprocess.CompletedProcess[str]) -> int:
    line = next(ln for ln in done.stderr.splitlines() if ln.startswith("peak_rss_kib "))
    return int(line.split()[1])


def verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["verdict"] for c in doc["checks"]}


@pytest.mark.parametrize(("hostile", "met"), [
    ("endless", "deadline: the stream was still open after 5 s"),
    ("hugeline", "oversized_event: an event grew past 1048576 characters"),
    ("noheaders", "no response headers within the 3 s read timeout"),
])
def test_a_hostile_server_ends_the_check_within_its_bound_and_says_what_it_met(
        hostile: Hostile, met: str) -> None:
    with serve(MisbehavingServer("good", hostile=hostile)) as url:
        began = time.monotonic()
        done = streamlab("check", url, "--model", MODEL, "--json",
                         "--stream-deadline-s", str(STREAM_DEADLINE_S),
                         "--timeout-s", str(READ_TIMEOUT_S), timeout=BOUND_S + 60)
        took = time.monotonic() - began
    assert took < BOUND_S, f"took {took:.1f} s\n{done.stderr}"
    assert peak_rss_kib(done) < MAX_RSS_KIB
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    framing = doc["checks"][0]
    assert (framing["name"], framing["verdict"]) == ("framing", "fail")
    # Every later check says why it did not run: what the first stream met.
    later = doc["checks"][1:]
    assert {c["verdict"] for c in later} == {"error"}
    assert all(c["evidence"].startswith("not run: an earlier check met") for c in later)
    assert all(met in c["evidence"] for c in later), later[0]["evidence"]


def test_invalid_utf8_fails_framing_and_the_other_checks_still_run() -> None:
    with serve(MisbehavingServer("good", hostile="badutf8")) as url:
        done = streamlab("check", url, "--model", MODEL, "--json", "--only", "framing",
                         "--only", "shape")
    doc = json.loads(done.stdout)
    assert verdicts(doc) == {"framing": "fail", "shape": "pass"}, done.stdout
    assert "invalid_utf8 == 0 (measured 5)" in doc["checks"][0]["evidence"]


def test_json_is_one_document_for_usage_errors_and_an_unreachable_target() -> None:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/v1"
    bad_option = streamlab("check", url, "--json", "--concurrency", "many")
    assert bad_option.returncode == 2
    doc = json.loads(bad_option.stdout)
    assert doc["error"]["kind"] == "usage"
    assert "--concurrency" in doc["error"]["message"]
    assert doc["exit_status"] == 2
    unreachable = streamlab("check", url, "--json")
    assert unreachable.returncode == 3
    doc = json.loads(unreachable.stdout)
    assert doc["error"]["kind"] == "unreachable"
    assert doc["checks"] == []
    assert doc["schema"].startswith("streamlab.check/")
    assert "does not answer" in unreachable.stderr  # errors on stderr, never only in the JSON


def test_without_model_the_first_listed_is_used_and_progress_goes_to_stderr() -> None:
    with serve(MisbehavingServer("good")) as url:
        done = streamlab("check", url, "--json", "--only", "framing", "--only", "shape")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["model"] == MODEL
    assert verdicts(doc) == {"framing": "pass", "shape": "pass"}
    assert f"model {MODEL} (the first of /v1/models)" in done.stderr
    assert "[1/2] framing: pass" in done.stderr
    assert "[2/2] shape: pass" in done.stderr


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def test_sigterm_stops_the_check_and_every_process_it_started() -> None:
    # A server that pauses 30 s mid-answer without pings: the heartbeat's stream
    # is still open when the signal comes.
    with serve(MisbehavingServer("good", pause_s=30.0)) as url, subprocess.Popen(
            [sys.executable, "-m", "streamlab.cli", "check", url, "--only", "heartbeat"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as check:
        assert check.stderr is not None
        deadline = time.monotonic() + 60
        for line in check.stderr:  # progress: the hop is up once a check has begun
            if "[1/1] heartbeat ..." in line or time.monotonic() > deadline:
                break
        started = children_of(check.pid)
        assert started, "the check started no hop of its own"
        check.send_signal(signal.SIGTERM)
        code, said = check.wait(timeout=30), check.stderr.read()
        assert code == 130, said
        assert "interrupted: every check stopped" in said
    for pid in started:
        assert not Path(f"/proc/{pid}").exists() or \
            (Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"), \
            f"process {pid} the check started outlived it"
