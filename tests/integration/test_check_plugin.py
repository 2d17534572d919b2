"""The pytest plugin as a user's suite meets it: a separate pytest run (in a
directory of its own, so this repo's conftest is not in it) that uses the
fixtures against the running lab, and one that runs the check suite as tests
with --streamlab-target."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamlab.lab.target import LabTarget
from tests.integration.check_servers import MODEL, MisbehavingServer, serve

pytestmark = pytest.mark.integration

USER_TESTS = '''
import time

import httpx
import pytest

BODY = {"model": "streamlab-fake", "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "streamlab": {"prefill_ms": 0, "token_gap_ms": 10, "answer_tokens": 4,
                      "request_id": "plugin-test-1"}}

def test_a_stream_through_latency(streamlab_edge_url, streamlab_toxics, streamlab_engine_record):
    with streamlab_toxics.latency("edge", ms=300):
        response = httpx.post(streamlab_edge_url + "/v1/chat/completions", json=BODY, timeout=10)
        assert response.elapsed.total_seconds() >= 0.3
    assert "data: [DONE]" in response.text
    stats = streamlab_engine_record("plugin-test-1")
    assert stats.generations_started >= 1

def test_a_cut_hop_refuses(streamlab_edge_url, streamlab_toxics):
    with streamlab_toxics.cut("edge"), pytest.raises(httpx.TransportError):
        httpx.post(streamlab_edge_url + "/v1/chat/completions", json=BODY, timeout=5)

# A 2.5 s silence before the first token, with the gateway's `: ping` every
# 0.3 s or none: an idle cut of 1 s must cut the one and spare the other.
def silent_for(heartbeat_s):
    return {**BODY, "streamlab": {"prefill_ms": 2500, "token_gap_ms": 10, "answer_tokens": 4,
                                  "heartbeat_s": heartbeat_s}}

def timed_post(url, body):
    started = time.monotonic()
    try:
        return httpx.post(url + "/v1/chat/completions", json=body, timeout=10), \
            time.monotonic() - started
    except httpx.TransportError as exc:
        return exc, time.monotonic() - started

def test_an_idle_cut_cuts_a_silent_stream_and_spares_a_heartbeating_one(
        streamlab_edge_url, streamlab_toxics):
    upstream = streamlab_toxics.client.proxy("edge")["upstream"]
    with streamlab_toxics.idle_cut("edge", seconds=1):
        silent, silent_s = timed_post(streamlab_edge_url, silent_for(0))
        pinged, pinged_s = timed_post(streamlab_edge_url, silent_for(0.3))
    assert isinstance(silent, httpx.TransportError), silent
    assert 1.0 <= silent_s < 2.5  # cut after the idle second, before the first token
    assert not isinstance(pinged, Exception), pinged
    assert "data: [DONE]" in pinged.text and ": ping" in pinged.text
    assert pinged_s >= 2.5  # it outlived the cut: the timer restarts on each byte
    # The hop is back as it was, and streams through it again.
    assert streamlab_toxics.client.proxy("edge")["upstream"] == upstream
    assert "data: [DONE]" in timed_post(streamlab_edge_url, BODY)[0].text

def test_toxiproxys_timeout_toxic_is_no_idle_cut(streamlab_edge_url, streamlab_toxics):
    """Why idle_cut brings its own relay: the `timeout` toxic cuts after a fixed
    time, bytes or none, so the heartbeating stream dies as well."""
    with streamlab_toxics._toxic("edge", "timeout", {"timeout": 1000}):
        pinged, _ = timed_post(streamlab_edge_url, silent_for(0.3))
    assert isinstance(pinged, httpx.TransportError), pinged
'''


def pytest_in(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           *args], cwd=directory, capture_output=True, text=True, timeout=180,
                          check=False)


def test_the_fixtures_drive_the_running_lab(lab: LabTarget, tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    done = pytest_in(tmp_path, "--streamlab-run-dir", str(lab.run_dir))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout


def test_the_check_suite_runs_as_tests(tmp_path: Path) -> None:
    with serve(MisbehavingServer("leak")) as url:
        done = pytest_in(tmp_path, "--streamlab-target", url, "--streamlab-model", MODEL,
                         "--streamlab-metrics-url", url.removesuffix("/v1") + "/metrics")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert "PASSED ::streamlab_check[framing]" in done.stdout, done.stdout[-4000:]
    assert "FAILED ::streamlab_check[cancel]" in done.stdout, done.stdout[-4000:]
    assert "fail  cancel: stopped_after_s <= 5" in done.stdout  # the evidence, no traceback
    assert "SKIPPED" in done.stdout  # heartbeat: the server answers too soon to need one
