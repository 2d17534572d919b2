"""The reconnect storm says why a stream did not end whole (a fixed run's
`all_complete no` came with no reason once)."""

from __future__ import annotations

import pytest

from streamlab.experiments.scenarios.reconnect_storm import TOKENS, Client, why_incomplete


@pytest.mark.parametrize(("client", "why"), [
    (Client(), "not created"),
    (Client(stream_id="s"), "gave up (no end by the deadline)"),
    (Client(stream_id="s", terminal="cancelled"), "ended cancelled"),
    (Client(stream_id="s", terminal="cancelled", terminal_data=b'{"reason":"owner_lost"}'),
     "ended cancelled owner_lost"),
    (Client(stream_id="s", terminal="done", tokens=TOKENS - 1), "done short"),
    (Client(stream_id="s", terminal="done", tokens=TOKENS), "out of order"),
])
def test_each_way_of_not_ending_whole_is_named(client: Client, why: str) -> None:
    assert why_incomplete(client) == why
