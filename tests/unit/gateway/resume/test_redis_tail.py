"""What a Redis tail reads in an event's data (redis_tail.py); the tail itself
runs against real Redis in tests/integration/test_engine_death.py."""

from __future__ import annotations

import json

import pytest

from services.gateway.resume.redis_tail import lost_after_reattaching


@pytest.mark.parametrize(("data", "lost"), [
    (json.dumps({"error": {"code": "generation_lost", "message": "generation lost: ..."}}),
     True),
    (json.dumps({"error": {"code": "unavailable", "message": "engine: Socket closed"}}), False),
    (json.dumps({"reason": "owner_lost"}), False),
    ("not json", False),
    (json.dumps(["a list"]), False),
])
def test_only_a_lost_generation_is_told_as_a_re_attach_tried(data: str, lost: bool) -> None:
    assert lost_after_reattaching(data) is lost
