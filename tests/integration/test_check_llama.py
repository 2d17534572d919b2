"""`streamlab check` on llama.cpp's server (llama-cpp-python's, built for the
CPU by scripts/install_llama_server.sh) on the tiny model the test writes
(tests/integration/llama_server.py): a real engine with a real prefill, one
slot and no /metrics, that nobody here wrote.

Run as a new user would: the command, no --model (the server's /v1/models
names it), no --metrics-url (there are none: cancel and slow-reader are judged
by timing). Every verdict is asserted, and the evidence of each that is not a
pass: what docs/check.md shows for the server. Slow (a minute and a half: the
slow reader's pause outlasts a 20 s answer), so `make test-check-servers`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.llama_server import MODEL_ALIAS, llama_server, write_tiny_gguf

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Its prefill of a long prompt (PROMPT_WORDS) takes seconds: an idle cut of
# 1.5 s makes it a silence to judge (its pings come every 15 s).
IDLE_CUT_S = 1.5
# 4,500 tokens: 1.1 MB, past what the path holds for a stopped reader, and
# within its context; its decode slows as the answer grows (~20 s for these).
ANSWER_TOKENS = 4500
N_CTX = 32768
# Its prefill of this many words takes ~4 s on 2 cores (~2 s for the default 3,000).
PROMPT_WORDS = 4000


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("llama") / "tiny.gguf", n_ctx_train=N_CTX)


@pytest.fixture
def queueing(tiny_model: Path, tmp_path: Path) -> Iterator[str]:
    """The server as llama.cpp's own serves: a request waits for the slot
    (`--interrupt_requests False`; llama-cpp-python's default cuts the
    running stream instead, the next test's subject)."""
    with llama_server(tiny_model, n_ctx=N_CTX, log_dir=tmp_path,
                      extra_args=("--interrupt_requests", "False")) as url:
        yield url


def check(url: str, *args: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-m", "streamlab.cli", "check", url, "--json",
                           "--idle-cut-s", str(IDLE_CUT_S), "--concurrency", "4", *args],
                          capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, json.loads(done.stdout), done.stderr


def test_every_check_judges_llama_cpps_server_with_no_model_and_no_metrics(
        queueing: str) -> None:
    code, doc, progress = check(queueing, "--answer-tokens", str(ANSWER_TOKENS),
                                "--prompt-words", str(PROMPT_WORDS))
    if os.environ.get("STREAMLAB_CHECK_RESULTS"):  # how docs/results/ was made
        (Path(os.environ["STREAMLAB_CHECK_RESULTS"]) / "check-llama-cpp-python.json"
         ).write_text(json.dumps(doc, indent=2) + "\n")
    got = {c["name"]: c for c in doc["checks"]}
    verdicts = {name: c["verdict"] for name, c in got.items()}
    assert verdicts == {
        "framing": "fail", "errors": "fail", "shape": "pass", "tool-calls": "fail",
        "responses": "n/a", "first-byte": "pass", "heartbeat": "fail", "idle-cut": "fail",
        "cancel": "pass", "slow-reader": "pass", "resume": "n/a", "concurrency": "pass",
    }, json.dumps(doc, indent=1)[:6000]
    assert code == 1
    assert doc["model"] == MODEL_ALIAS
    assert f"model {MODEL_ALIAS} (the first of /v1/models)" in progress
    # No usage chunk when include_usage asks; malformed requests get 500s (and
    # a 200 for no messages and a negative max_tokens).
    assert got["framing"]["evidence"] == "usage_on_last == True (measured no)"
    assert got["errors"]["figures"]["answered_5xx"] >= 3
    # Tool calls: the id and the name again on every delta.
    assert got["tool-calls"]["figures"]["repeated_id_or_name"] > 0
    # A prefill with no byte until its first token; pings come only every 15 s.
    heartbeat = got["heartbeat"]["figures"]
    assert heartbeat["silence_where"] == "before the first token"
    assert heartbeat["longest_silence_s"] > IDLE_CUT_S
    assert heartbeat["comments"] == 0
    assert got["idle-cut"]["figures"]["cut_where"] == "before the first token"
    # Cancel and the slow reader, with no metrics: by timing, and said so.
    cancel = got["cancel"]["figures"]
    assert cancel["observed_by"] == "timing (no running gauge)"
    assert cancel["ttft_beside_s"] is None  # a fresh stream waited beside the long ones
    assert cancel["stopped_after_s"] <= 5.0  # and not once they had left
    slow = got["slow-reader"]["figures"]
    assert slow["observed_by"] == "timing (no running gauge)"
    assert slow["behaviour"] == "paused"  # sse-starlette's bounded stream holds it
    assert slow["answer_bytes"] > 1 << 20
    # Every n/a says what the server lacks.
    assert got["responses"]["evidence"] == ("POST /responses (stream) answered 404: no "
                                            "Responses API here")
    assert got["resume"]["evidence"].startswith("needs resumable: streams: POST /streams "
                                                "answered 404")


def test_at_its_default_a_second_request_cuts_the_running_stream_without_a_word(
        tiny_model: Path, tmp_path: Path) -> None:
    # llama-cpp-python's default (--interrupt_requests True): each new request
    # ends the running stream with a bare [DONE], no finish_reason.
    with llama_server(tiny_model, n_ctx=4096, log_dir=tmp_path) as url:
        code, doc, _ = check(url, "--only", "concurrency")
    (concurrency,) = doc["checks"]
    assert concurrency["verdict"] == "fail", concurrency
    assert code == 1
    assert concurrency["figures"]["completed"] == 4  # each saw [DONE] ...
    assert concurrency["figures"]["finished"] < 4  # ... but not each a finish_reason
    assert concurrency["evidence"].startswith("finished == 4 (measured ")
