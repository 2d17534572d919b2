"""The lab's broken modes: which request knobs select one, and the gateway
setting that refuses them (services/gateway/admission.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from services.gateway.admission import check_new_stream
from services.gateway.drain import Drain
from services.gateway.errors import BadRequest
from services.gateway.openai_api import Message, StreamlabOptions
from services.gateway.settings import GatewaySettings

PROMPT = [Message(role="user", content="hi")]


def state(allow: bool) -> SimpleNamespace:
    return SimpleNamespace(settings=GatewaySettings(allow_broken_modes=allow), drain=Drain(1.0))


@pytest.mark.parametrize(("knobs", "modes"), [
    ({}, []),
    ({"relay": "direct", "engine_errors": "report", "job_ttl_s": 1.0}, []),
    ({"relay": "detached_unbounded"}, ["relay=detached_unbounded"]),
    ({"engine_errors": "swallow"}, ["engine_errors=swallow"]),
    ({"job_ttl_s": 0}, ["job_ttl_s=0"]),
])
def test_broken_modes_names_each_broken_knob(knobs: dict[str, object], modes: list[str]
                                             ) -> None:
    assert StreamlabOptions.model_validate(knobs).broken_modes() == modes


def test_a_gateway_that_refuses_broken_modes_names_them() -> None:
    options = StreamlabOptions(relay="detached_unbounded", engine_errors="swallow")
    with pytest.raises(BadRequest) as refused:
        check_new_stream(state(allow=False), PROMPT, options)
    assert refused.value.status_code == 400
    assert refused.value.code == "broken_mode_disabled"
    assert "relay=detached_unbounded, engine_errors=swallow" in refused.value.message


def test_the_lab_gateway_allows_them_and_fixed_knobs_always_pass() -> None:
    check_new_stream(state(allow=True), PROMPT, StreamlabOptions(engine_errors="swallow"))
    check_new_stream(state(allow=False), PROMPT, StreamlabOptions(job_ttl_s=2.0))
    check_new_stream(state(allow=False), PROMPT, None)
