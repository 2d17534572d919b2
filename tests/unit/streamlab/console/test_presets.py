"""The console's presets are the catalogue, turned into what a page can send."""

from __future__ import annotations

import pytest

from services.gateway.openai_api import StreamlabOptions
from streamlab.console import presets
from streamlab.experiments.scenarios import MODES, Timing, names
from streamlab.lab.toxiproxy import TOXIC_TYPES


def test_every_scenario_has_a_broken_and_a_fixed_preset() -> None:
    listed = [(p["scenario"], p["mode"]) for p in presets.presets()]
    assert listed == [(name, mode) for name in names() for mode in MODES]


@pytest.mark.parametrize("preset", presets.presets(), ids=lambda p: f"{p['scenario']}-{p['mode']}")
def test_a_preset_sends_what_the_gateway_accepts(preset: dict[str, object]) -> None:
    # The gateway's own model of the `streamlab` field: a preset the gateway
    # would refuse with 400 fails here instead of in the browser.
    StreamlabOptions.model_validate(preset["streamlab"])
    transports = preset["transports"]
    assert isinstance(transports, list)
    assert transports
    assert set(transports) <= set(presets.TRANSPORTS)


def test_toxics_are_the_setups_own() -> None:
    for preset in presets.presets():
        setup = presets.setup_of(str(preset["scenario"]), preset["mode"])
        assert preset["toxics"] == [{"hop": hop, **toxic.as_json()}
                                    for hop, toxic in setup.toxics]


def test_think_pause_and_heartbeat_follow_the_setup() -> None:
    by_key = {(p["scenario"], p["mode"]): p for p in presets.presets(Timing(think_s=3.0))}
    broken, fixed = by_key["idle-cut", "broken"], by_key["idle-cut", "fixed"]
    assert broken["streamlab"]["pauses"] == [{"after_token": 2, "pause_ms": 3000}]
    assert broken["streamlab"]["heartbeat_s"] == 0
    assert fixed["streamlab"]["heartbeat_s"] == Timing().heartbeat_s
    assert by_key["poll-leak", "broken"]["streamlab"]["job_ttl_s"] == 0


def test_mid_stream_faults_are_toxiproxy_operations() -> None:
    faults = [p["fault"] for p in presets.presets() if p["fault"] is not None]
    assert faults, "the engine-hop and resume scenarios break the hop mid-stream"
    for fault in faults:
        assert isinstance(fault, dict)
        assert fault["disable"] or fault["toxics"]
        for toxic in fault["toxics"]:
            assert set(toxic["attributes"]) <= set(TOXIC_TYPES[toxic["type"]])


def test_an_unknown_scenario_is_named() -> None:
    with pytest.raises(KeyError, match="no-such"):
        presets.setup_of("no-such", "broken")


def test_press_stop_presets_leave_a_person_time_to_press_it() -> None:
    by_key = {(p["scenario"], p["mode"]): p for p in presets.presets()}
    prefill = by_key["abandoned-prefill", "broken"]
    assert prefill["stop_after_tokens"] == 0  # Stop during the prefill
    assert prefill["streamlab"]["prefill_ms"] >= 3000
    assert prefill["streamlab"]["heartbeat_s"] == 0  # no write to fail before the first token
    tab = by_key["abandoned-tab", "broken"]
    assert tab["stop_after_tokens"] == 3
    assert tab["streamlab"]["answer_tokens"] >= 100
