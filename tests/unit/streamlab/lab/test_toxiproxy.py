from __future__ import annotations

import pytest

from streamlab.lab.toxiproxy import TOXIC_TYPES, Toxic, ToxicSpecError, parse_attributes


def test_attributes_parse_to_integers() -> None:
    assert parse_attributes("latency", ["latency=500", "jitter=50"]) == {"latency": 500,
                                                                         "jitter": 50}
    assert parse_attributes("timeout", []) == {}


@pytest.mark.parametrize(("toxic_type", "pairs", "message"), [
    ("latncy", [], "unknown toxic type 'latncy'"),
    ("latency", ["latncy=5"], "latency has no attribute 'latncy'; it has: latency, jitter"),
    ("latency", ["latency"], "not key=value"),
    ("bandwidth", ["rate=fast"], "rate='fast' is not an integer"),
    ("limit_data", ["bytes=-1"], "must not be negative"),
])
def test_bad_attributes_name_the_key_and_value(toxic_type: str, pairs: list[str],
                                               message: str) -> None:
    with pytest.raises(ToxicSpecError, match=message):
        parse_attributes(toxic_type, pairs)


def test_every_toxiproxy_toxic_type_is_known() -> None:
    assert set(TOXIC_TYPES) == {"latency", "bandwidth", "slow_close", "timeout", "reset_peer",
                                "slicer", "limit_data"}


def test_toxic_json_defaults_its_name_to_type_and_direction() -> None:
    body = Toxic("slicer", {"average_size": 8}, "upstream", 0.5).as_json()
    assert body == {"name": "slicer_upstream", "type": "slicer", "stream": "upstream",
                    "toxicity": 0.5, "attributes": {"average_size": 8}}
