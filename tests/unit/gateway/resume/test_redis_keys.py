"""The shared resume log's key layout and metadata encoding (pure logic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.resume.redis_keys import (
    StreamMeta,
    control_channel,
    entry_id,
    entry_seq,
    stream_keys,
)
from services.gateway.resume.store import FoundStream
from streamlab_protocol.generation import GenerationState

ID = "0123456789abcdef0123456789abcdef"


def test_one_streams_keys_share_a_hash_tag_so_a_cluster_keeps_them_together() -> None:
    keys = stream_keys("streamlab:resume", ID)
    for key in (keys.events, keys.meta, keys.followers, keys.gone):
        assert f"{{{ID}}}" in key
    assert len({keys.events, keys.meta, keys.followers, keys.gone}) == 4
    assert control_channel("streamlab:resume", "gw-1:8090") == "streamlab:resume:control:gw-1:8090"


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_an_entry_id_carries_the_events_sequence_number(seq: int) -> None:
    assert entry_seq(entry_id(seq)) == seq
    assert entry_seq(entry_id(seq).encode()) == seq


@pytest.mark.parametrize("raw", ["1-5", "0-", "0-x", "5", "1700000000000-0"])
def test_an_entry_id_not_written_by_the_log_is_refused(raw: str) -> None:
    with pytest.raises(ValueError, match="not a resume log entry id"):
        entry_seq(raw)


META = StreamMeta(owner=None, replica="a", state=GenerationState.CANCELLED,
                  cancel_reason="client_cancelled", last_seq=31, grace_s=0.5, ttl_s=120.0,
                  retry_ms=50, max_events=10_000, created=1_700_000_000.125)


@pytest.mark.parametrize("owner", [None, "ip:127.0.0.1"])
def test_metadata_survives_a_round_trip_through_a_hash(owner: str | None) -> None:
    meta = StreamMeta(**{**META.__dict__, "owner": owner})
    as_str = meta.to_hash()
    as_bytes = {k.encode(): v.encode() for k, v in as_str.items()}
    assert StreamMeta.from_hash(as_str) == meta
    assert StreamMeta.from_hash(as_bytes) == meta
    assert meta.ended


def test_metadata_missing_a_field_is_an_error_naming_it() -> None:
    partial = {k: v for k, v in META.to_hash().items() if k != "replica"}
    with pytest.raises(ValueError, match="'replica'"):
        StreamMeta.from_hash(partial)


def test_a_found_stream_names_what_a_resume_asks_for_that_is_gone() -> None:
    found = FoundStream(id=ID, last_seq=40, first_seq=11, ended=False, retry_ms=1, age_s=0)
    assert found.missed(0) == (1, 10)
    assert found.missed(9) == (10, 10)
    assert found.missed(10) is None
    assert found.missed(40) is None


def test_metadata_written_before_incarnations_reads_as_an_unknown_incarnation() -> None:
    """A stream written by a gateway that did not record its incarnation: the
    take-over then falls back to "is the alive key there at all"."""
    older = {k: v for k, v in META.to_hash().items() if k != "incarnation"}
    assert StreamMeta.from_hash(older).incarnation == ""
    meta = StreamMeta(**{**META.__dict__, "incarnation": "f00d"})
    assert StreamMeta.from_hash(meta.to_hash()).incarnation == "f00d"
