"""The lab's broken modes: which request knobs select one, and the gateway
setting that refuses them (services/gateway/broken_modes.py)."""

from __future__ import annotations

import pytest

from services.gateway.broken_modes import BrokenModes, selected
from services.gateway.errors import BadRequest
from services.gateway.openai_api import StreamlabOptions


@pytest.mark.parametrize(("knobs", "modes"), [
    ({}, []),
    ({"relay": "direct", "engine_errors": "report", "job_ttl_s": 1.0}, []),
    ({"relay": "detached_unbounded"}, ["relay=detached_unbounded"]),
    ({"engine_errors": "swallow"}, ["engine_errors=swallow"]),
    ({"job_ttl_s": 0}, ["job_ttl_s=0"]),
])
def test_each_broken_knob_selects_its_registered_mode(knobs: dict[str, object],
                                                      modes: list[str]) -> None:
    options = StreamlabOptions.model_validate(knobs)
    assert [mode.name for mode in selected(options)] == modes


def test_a_gateway_that_refuses_broken_modes_names_them() -> None:
    options = StreamlabOptions(relay="detached_unbounded", engine_errors="swallow")
    with pytest.raises(BadRequest) as refused:
        BrokenModes(allowed=False).admit(options)
    assert refused.value.status_code == 400
    assert refused.value.code == "broken_mode_disabled"
    assert "relay=detached_unbounded, engine_errors=swallow" in refused.value.message


def test_the_lab_gateway_allows_them_and_fixed_knobs_always_pass() -> None:
    BrokenModes(allowed=True).admit(StreamlabOptions(engine_errors="swallow"))
    BrokenModes(allowed=False).admit(StreamlabOptions(job_ttl_s=2.0))
    BrokenModes(allowed=False).admit(None)
