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

def test_an_idle_cut_ends_the_stream(streamlab_edge_url, streamlab_toxics):
    with streamlab_toxics.idle_cut("edge", seconds=1), pytest.raises(httpx.TransportError):
        httpx.post(streamlab_edge_url + "/v1/chat/completions", json=BODY, timeout=5)
'''


def pytest_in(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA",
                           *args], cwd=directory, capture_output=True, text=True, timeout=180,
                          check=False)


def test_the_fixtures_drive_the_running_lab(lab: LabTarget, tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    done = pytest_in(tmp_path, "--streamlab-run-dir", str(lab.run_dir))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout


def test_the_check_suite_runs_as_tests(tmp_path: Path) -> None:
    with serve(MisbehavingServer("leak")) as url:
        done = pytest_in(tmp_path, "--streamlab-target", url, "--streamlab-model", MODEL,
                         "--streamlab-metrics-url", url.removesuffix("/v1") + "/metrics")
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-2000:]
    assert "PASSED ::streamlab_check[framing]" in done.stdout, done.stdout[-4000:]
    assert "FAILED ::streamlab_check[cancel]" in done.stdout, done.stdout[-4000:]
    assert "fail  cancel: stopped_after_s <= 5" in done.stdout  # the evidence, no traceback
    assert "SKIPPED" in done.stdout  # heartbeat: the server answers too soon to need one
