"""`streamlab check` on servers nobody here wrote the check for:

    llm-mock-api   a mock LLM server from PyPI (the `check-servers` extra,
                   scripts/install_check_servers.sh), run as its own process
                   with its own command line
    the chain      the lab whose engine runs the openai-upstream backend
                   against a second streamlab gateway (upstream_fixtures.py):
                   every check crosses two gateways and two engines

Each test asserts every verdict the server gets, and for each one that is
not a pass, its evidence line: what docs/check.md shows for the server.
With STREAMLAB_CHECK_RESULTS=DIR each also writes its report there as
check-<server>.json, the shape `streamlab check --json` prints: how the
committed runs in docs/results/ were made.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from streamlab.experiments.check.runner import CHECKS, check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import line, table, verdict
from streamlab.experiments.report import Report
from streamlab.lab import processes
from streamlab.lab.local import Lab
from streamlab.lab.processes import ServiceSpec, free_ports
from tests.integration.check_servers import keep
from tests.integration.upstream_fixtures import UPSTREAM_MAX_TOKENS

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

MOCK = Path(sys.executable).parent / "llm-mock-api"
# A reply streamed 3 characters a chunk, 20 ms apart: a server that paces its
# tokens, as a model does (at its defaults the mock sends one chunk at once).
MOCK_LATENCY_MS, MOCK_CHUNK_CHARS = 20, 3
SILENCE_S, IDLE_CUT_S = 3.0, 1.5


def lines(report: Report) -> dict[str, str]:
    return {part.variant: line(part) for part in report.parts}


def explained(report: Report) -> str:
    return "\n".join(f"{line(part)}\n    {part.figures}" for part in report.parts)


@pytest.fixture(scope="module")
def llm_mock_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not MOCK.exists():
        pytest.skip("llm-mock-api is not installed: bash scripts/install_check_servers.sh")
    (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    spec = ServiceSpec(
        "llm-mock-api",
        # --config: a file that is not there, so a config.json in the working
        # directory cannot change what is measured (the mock reads ./config.json).
        [str(MOCK), "start", "-H", "127.0.0.1", "-p", str(port), "-l", str(MOCK_LATENCY_MS),
         "-c", str(MOCK_CHUNK_CHARS), "--log-level", "error",
         "--config", str(tmp_path_factory.mktemp("mock") / "no-config.json")],
        # Any HTTP answer is up: the mock has no health route (404 on /v1/models).
        ready=lambda: httpx.get(base + "/v1/models", timeout=1.0).status_code > 0)
    with processes.serving(spec, tmp_path_factory.mktemp("mock-logs")):
        yield base + "/v1"


async def test_llm_mock_api_frames_well_and_answers_bad_input_with_a_5xx(
        llm_mock_api: str) -> None:
    report = await check_url(CheckTarget(llm_mock_api, "gpt-4o-mini", silence_s=SILENCE_S,
                                         idle_cut_s=IDLE_CUT_S, streams=6, timeout_s=20.0))
    keep(report, "llm-mock-api")
    got = lines(report)
    assert {name: verdict(part) for name, part in zip(got, report.parts, strict=True)} == {
        "framing": "pass", "errors": "fail", "shape": "fail", "tool-calls": "n/a",
        "responses": "pass", "first-byte": "pass", "heartbeat": "n/a",
        "idle-cut": "n/a", "cancel": "n/a", "slow-reader": "n/a", "resume": "n/a",
        "concurrency": "pass"}, explained(report)
    # The evidence, as the command prints it.
    assert got["errors"].startswith(
        "fail  errors: answered_5xx == 0 (measured 1); not_4xx == 0 (measured 4)"), got
    errors = next(p for p in report.parts if p.variant == "errors")
    # It streams an answer to a string max_tokens (and, not shown, to an unknown
    # role and a negative max_tokens), and a body that is not JSON gets its 500.
    assert errors.figures["first_not_4xx"] == "max_tokens is a string: 200"
    # Its finish_reason comes one chunk early: the last chunk with a choice is an
    # unasked usage chunk whose finish_reason is null (a client that keeps the
    # last chunk's finish_reason reads None).
    assert got["shape"].startswith(
        "fail  shape: finish_last == True (measured no); unasked_usage_chunks == 0 (measured 1)")
    assert got["heartbeat"].startswith("n/a   heartbeat: needs silence: the longest wait for a "
                                       "token was")
    # No /metrics, and requests run side by side: nothing shows a generation left running.
    assert got["cancel"].startswith("n/a   cancel: not observable by timing: a fresh stream "
                                    "beside 2 running ones got its first token")
    assert "(the server's root) gave no Prometheus text" in got["cancel"]
    # It answers in a few KB whatever max_tokens asks: nothing a stopped reader can feel.
    assert got["slow-reader"].startswith("n/a   slow-reader: needs long: the whole answer (")
    assert got["resume"] == (
        "n/a   resume: needs resumable: streams: POST /streams answered 404; responses: "
        "POST /responses did not keep the response in the background")


async def test_the_openai_upstream_chain_passes_every_check(openai_lab: Lab) -> None:
    """client → edge → nginx → gateway → engine (openai backend) → gateway →
    engine (fake): the outer engine's gauge is what the metrics checks read."""
    metrics = openai_lab.engine_metrics_url_of("engine")

    def target(url: str) -> CheckTarget:
        # --answer-tokens at the inner engine's limit (UPSTREAM_MAX_TOKENS).
        return CheckTarget(url + "/v1", "streamlab-fake", metrics_url=metrics,
                           silence_s=SILENCE_S, idle_cut_s=IDLE_CUT_S, streams=6,
                           stop_within_s=2.0, timeout_s=20.0,
                           answer_tokens=UPSTREAM_MAX_TOKENS)

    report = await check_url(target(openai_lab.edge_url),
                             only=tuple(c for c in CHECKS if c != "slow-reader"))
    # Straight at the outer gateway: the edge's hops would be judged instead.
    straight = await check_url(target(openai_lab.gateway_url), only=("slow-reader",))
    every = report.parts + straight.parts
    keep(replace(report, parts=every, tables=(table(every),)), "openai-upstream-chain")
    assert {p.variant: verdict(p) for p in report.parts} == dict.fromkeys(
        (c for c in CHECKS if c != "slow-reader"), "pass") | {"tool-calls": "n/a"}, \
        explained(report)
    tools = next(p for p in report.parts if p.variant == "tool-calls")
    assert "the openai backend does not call tools" in tools.reason
    # The inner engine allows 1,000 tokens (UPSTREAM_MAX_TOKENS): too few for the
    # megabytes a slow reader needs, and the check says so.
    (slow,) = straight.parts
    assert verdict(slow) == "n/a", explained(straight)
    assert slow.reason.startswith("needs long: the whole answer (")
    assert report.variant == openai_lab.edge_url + "/v1"
