"""Scripted soak streams for the tests of the soak's judge."""

from __future__ import annotations

from streamlab.experiments.soak_verdict import StreamRun


def stream(i: int, behaviour: str, outcome: str, start: float = 0.0, end: float = 1.0,
           left_at: float | None = None, engine_state: str = "") -> StreamRun:
    """One client of a soak as its run recorded it (leave bound 2 s)."""
    return StreamRun(i, behaviour, started_at=start, ended_at=end, outcome=outcome,
                     request_id=f"soak-{i}", left_at=left_at, leave_bound_s=2.0,
                     engine_state=engine_state)
