"""Payloads read from outside (a chat chunk, a browser tab's state) are
narrowed to what the measures use: a payload of another shape gives nothing,
never a crash in the middle of a measure."""

from __future__ import annotations

from streamlab.experiments.report import JSON
from streamlab.experiments.scenarios.measures import _content
from streamlab.experiments.scenarios.seventh_tab import TabState


def test_a_chat_chunk_gives_its_deltas_content() -> None:
    chunk: JSON = {"choices": [{"delta": {"content": "to"}}, {"delta": {"content": "ken"}},
                         {"delta": {"role": "assistant"}}, {"delta": {"content": ""}}]}
    assert _content(chunk) == ["to", "ken"]


def test_a_payload_of_another_shape_gives_no_content() -> None:
    assert _content(None) == []
    assert _content(["choices"]) == []
    assert _content({"choices": "none"}) == []
    assert _content({"choices": [None, {"delta": "text"}, {"delta": {"content": 3}}]}) == []


def test_a_tab_s_state_keeps_the_fields_of_their_type() -> None:
    state = TabState.of({"t0": 1000, "first": 1250.5, "events": 3, "errors": 0,
                         "opened": 1100, "protocol": "h2"})
    assert state == TabState(t0=1000.0, first=1250.5, errors=0, protocol="h2")


def test_a_tab_before_its_script_ran_has_no_state() -> None:
    assert TabState.of(None) == TabState()
    assert TabState.of({"first": "soon", "protocol": 2}) == TabState()
