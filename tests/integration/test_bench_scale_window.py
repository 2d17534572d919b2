"""`bench scale`'s cadence cell on the real lab: beside CPU per token over the
whole cell (each token also carrying its share of its stream's set-up), the
steady window's (every stream running, none starting or ending), read from
each process at the window's two edges. The paced target judges the latter."""

from __future__ import annotations

import pytest

from streamlab.experiments.bench.probes import PROCESSES
from streamlab.experiments.bench.scale import cadence_cell
from streamlab.experiments.bench.targets import LAB_PROCESSES
from streamlab.lab.target import LabTarget

pytestmark = pytest.mark.integration

STREAMS, TOKENS, STEP_MS = 20, 60, 20  # under the suite's per-client cap


def test_the_steady_window_prices_a_running_token_without_its_set_up(lab: LabTarget) -> None:
    if lab.pids is None:
        pytest.skip("reads each process's CPU by host pid; on the compose target they run "
                    "in containers (STREAMLAB_TARGET=compose)")
    cell = cadence_cell(lab, "batched", STREAMS, TOKENS, STEP_MS)
    figures = cell.figures()
    print({k: v for k, v in figures.items() if "token" in k or k.startswith("running")})
    assert cell.load.completed == STREAMS, cell.load.errors
    assert cell.load.tokens == STREAMS * TOKENS
    # The window: after the last stream's first token (streams open over
    # 0.5 s), before the first one's end (1.2 s of tokens each): the middle of
    # the run, not all of it and not none of it.
    assert cell.running_tokens is not None
    assert cell.running_s is not None
    assert 0.2 * cell.load.tokens < cell.running_tokens < 0.9 * cell.load.tokens
    assert 0 < cell.running_s < cell.load.wall_s
    running = cell.us_per_running_token()
    assert set(running) == set(PROCESSES)
    assert all(running[name] is not None for name in PROCESSES), running
    # No set-up or end in it: the lab's CPU per running token is below its
    # whole-cell figure, where each 60-token stream's set-up (a few ms across
    # the chain) adds tens of µs to every token.
    whole = cell.us_per_token()
    lab_running = sum(running[name] or 0.0 for name in LAB_PROCESSES)
    lab_whole = sum(whole[name] or 0.0 for name in LAB_PROCESSES)
    assert lab_running < lab_whole, (running, whole)
