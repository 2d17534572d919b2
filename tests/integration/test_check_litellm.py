"""LiteLLM's proxy, an AI gateway people put between their clients and vLLM,
in front of the lab's gateway: does it pass a leaving client on to its
upstream, keep the upstream's heartbeats, send its headers before the first
token? `streamlab check` through it answers, on the lab engine's own gauge.

LiteLLM lives in a venv of its own (scripts/install_litellm.sh; `make
test-check-servers`): without it the test skips, saying so.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from streamlab.experiments.check.runner import check_url
from streamlab.experiments.check.target import CheckTarget
from streamlab.experiments.check.verdict import line, verdict
from streamlab.experiments.report import Report
from streamlab.lab import processes
from streamlab.lab.processes import ServiceSpec, free_ports
from streamlab.lab.target import LabTarget
from tests.integration.check_servers import keep

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.slow]

LITELLM = Path(__file__).resolve().parents[2] / ".tools" / "litellm" / "bin" / "litellm"
SILENCE_S, IDLE_CUT_S = 3.0, 1.5


@pytest.fixture
def litellm(lab: LabTarget, tmp_path: Path) -> Iterator[str]:
    if not LITELLM.exists():
        pytest.skip("LiteLLM is not installed: bash scripts/install_litellm.sh")
    (port,) = free_ports(1)
    config = tmp_path / "litellm.yaml"
    config.write_text(f"""model_list:
  - model_name: streamlab-fake
    litellm_params:
      model: openai/streamlab-fake
      api_base: {lab.gateway_url}/v1
      api_key: none
""")
    base = f"http://127.0.0.1:{port}"
    spec = ServiceSpec("litellm", [str(LITELLM), "--config", str(config), "--host",
                                   "127.0.0.1", "--port", str(port)],
                       ready=lambda: httpx.get(base + "/v1/models", timeout=1.0).is_success,
                       ready_timeout_s=120.0)
    with processes.serving(spec, tmp_path):
        yield base + "/v1"


def explained(report: Report) -> str:
    return "\n".join(f"{line(part)}\n    {part.figures}" for part in report.parts)


@pytest.mark.local_only("LiteLLM runs as a local process in front of the local gateway")
async def test_litellm_passes_a_leaving_client_on_but_swallows_heartbeats(
        lab: LabTarget, litellm: str) -> None:
    # LiteLLM forwards the request's `streamlab` object upstream: the fake
    # model's 3 s silence, through which the lab's gateway pings every 0.5 s.
    target = CheckTarget(litellm, "", metrics_url=lab.engine_metrics_url_of("engine"),
                         silence_s=SILENCE_S, idle_cut_s=IDLE_CUT_S, streams=4,
                         timeout_s=20.0, answer_tokens=1000,
                         extra_body={"streamlab": {"prefill_ms": int(SILENCE_S * 1000)}})
    report = await check_url(target, only=("framing", "shape", "first-byte", "heartbeat",
                                           "idle-cut", "cancel"))
    keep(report, "litellm-proxy")
    got = {p.variant: verdict(p) for p in report.parts}
    assert got == {"framing": "pass", "shape": "pass", "first-byte": "fail",
                   "heartbeat": "fail", "idle-cut": "fail", "cancel": "pass"}, explained(report)
    parts = {p.variant: p for p in report.parts}
    # It holds its headers until the upstream's first token, and drops the
    # upstream's `: ping` comments: its client sees the whole silence.
    assert parts["first-byte"].figures["headers_held"] is True
    assert parts["heartbeat"].figures["comments"] == 0
    assert parts["heartbeat"].figures["silence_where"] == "before the first token"
    assert parts["idle-cut"].figures["cut_where"] == "before the headers"
    # A client that leaves LiteLLM leaves the lab's engine too.
    assert parts["cancel"].figures["observed_by"] == "metrics (streamlab_engine_running)"
    assert parts["cancel"].figures["stopped_after_s"] <= 5.0  # type: ignore[operator]
