"""Capacity: over a thousand streams at once through the whole chain.

    raw-socket client ─▶ edge ─▶ nginx ─▶ upstream ─▶ gateway ─gRPC─▶ engine hop ─▶ engine

Every stream is open at the same time (each answer lasts longer than the ramp
that opens them), so each hop holds them all at once: nginx two connections per
stream, each Toxiproxy process two sockets per stream per HTTP hop, the gateway
one socket and one gRPC call per stream. Any cap below that (nginx's old
`worker_connections 1024`, the gateway's 512 streams, the engine's 64 running
generations, a file limit) cuts or refuses streams, and the test names how many.
The lab is this test's own: the suite's shared lab keeps small caps so that
tests/integration/test_limits.py can reach them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.client.openai_stream import chat_body
from services.engine.backends.fake import token_text
from streamlab.experiments.bench.load import run_load
from streamlab.lab.local import Lab, LabOptions
from tests.integration.conftest import free_lab_ports

STREAMS = 1200
TOKENS = 8
# Each answer lasts ~TOKENS x GAP (8 s), longer than the ramp that opens the
# streams (4 s): all of them are open together for a while. The ramp is not
# shorter because a stream's set-up costs the gateway 2-4 ms of CPU: 1,200 in
# one second is seconds of work for one event loop on a 2-core machine, and the
# streams queued behind it pass the engine-accept deadline (504), which is
# load, not capacity (docs/benchmarks.md, cell c).
GAP_MS = 1000
RAMP_S = 4.0
# A bound on the whole run, so a lost stream fails the test instead of hanging it.
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def big_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    run_dir: Path = tmp_path_factory.mktemp("capacity-lab")
    # The services' own defaults carry the capacity; only the per-client cap
    # (a fairness limit: every stream here comes from one address) is lifted.
    lab = Lab(free_lab_ports(), LabOptions(
        run_dir=run_dir, console=False,
        gateway_env={"STREAMLAB_GATEWAY_MAX_STREAMS_PER_CLIENT": str(STREAMS + 100),
                     # Capacity, not latency: on a starved machine the gateway's
                     # loop lags the set-ups past the 5 s engine-accept deadline
                     # (a 504 is then CPU, not a cap). A cap still cuts streams.
                     "STREAMLAB_GATEWAY_ENGINE_ACCEPT_TIMEOUT_S": "60"}))
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


def test_over_a_thousand_concurrent_streams_all_complete_with_the_whole_text(
        big_lab: Lab) -> None:
    body = chat_body("capacity", max_tokens=TOKENS, prefill_ms=0, token_gap_ms=GAP_MS,
                     answer_tokens=TOKENS)
    host, port = big_lab.ports.host, big_lab.ports.edge_port
    load = asyncio.run(run_load(host, port, "/v1/chat/completions", body, streams=STREAMS,
                                ramp_s=RAMP_S, timeout_s=DEADLINE_S, keep_text=True))

    assert load.errors == {}, f"{load.completed}/{STREAMS} completed; failures: {load.errors}"
    assert load.completed == STREAMS
    expected = "".join(token_text(i) for i in range(TOKENS))
    wrong = [text for text in load.texts if text != expected]
    assert len(load.texts) == STREAMS
    assert not wrong, \
        f"{len(wrong)} streams with another text, e.g. {wrong[:1]!r} (expected {expected!r})"
