"""The shared judge of resuming readers' histories (scenarios/history.py):
each failure it exists to catch, and the histories it must accept."""

from __future__ import annotations

import json

from streamlab.experiments.scenarios.history import History, judge, judge_one

TOKENS = 5
STREAM = "s1"


Event = tuple[str, int | None] | tuple[str, int | None, dict[str, str]]


def history(*events: Event) -> History:
    h = History()
    for k, event in enumerate(events):
        kind, seq, *data = event
        h.saw(kind, seq, float(k), json.dumps(data[0]) if data else b"")
    return h


def tokens(*seqs: int) -> list[tuple[str, int | None]]:
    return [("token", s) for s in seqs]


def test_a_whole_history_is_every_token_once_in_order_then_done() -> None:
    verdict = judge_one(history(*tokens(1, 2, 3, 4, 5), ("done", 6)), TOKENS)
    assert verdict.whole
    assert not verdict.hung
    assert verdict.end == "done"


def test_a_reconnect_that_replays_a_token_is_a_duplicate() -> None:
    verdict = judge_one(history(*tokens(1, 2, 3, 3, 4, 5), ("done", 6)), TOKENS)
    assert not verdict.whole
    assert verdict.duplicates == 1


def test_a_token_before_its_predecessor_is_out_of_order() -> None:
    verdict = judge_one(history(*tokens(1, 3, 2, 4, 5), ("done", 6)), TOKENS)
    assert not verdict.whole
    assert verdict.out_of_order == 1


def test_skipped_tokens_without_a_gap_event_are_a_silent_gap() -> None:
    verdict = judge_one(history(*tokens(1, 2, 5), ("done", 6)), TOKENS)
    assert verdict.silent_gaps == 2
    assert verdict.told_gaps == 0
    assert not verdict.whole


def test_skipped_tokens_a_gap_event_names_are_told_not_silent() -> None:
    gap = ("gap", None, {"missed_from": f"{STREAM}:3", "missed_to": f"{STREAM}:4"})
    verdict = judge_one(history(*tokens(1, 2), gap, *tokens(5), ("done", 6)), TOKENS)
    assert verdict.silent_gaps == 0
    assert verdict.told_gaps == 2
    assert not verdict.whole


def test_no_terminal_event_is_a_hung_reader() -> None:
    verdict = judge_one(history(*tokens(1, 2), ("retry", None)), TOKENS)
    assert verdict.hung
    assert verdict.end == "none"


def test_an_explicit_error_after_some_tokens_is_told_with_its_reason() -> None:
    verdict = judge_one(history(*tokens(1, 2), ("error", 3, {"code": "unavailable"})), TOKENS)
    assert not verdict.hung
    assert verdict.silent_gaps == 0
    assert verdict.end == "error unavailable"


def test_an_error_that_skipped_tokens_before_it_is_still_a_silent_gap() -> None:
    verdict = judge_one(history(*tokens(1, 3), ("error", 4, {"code": "x"})), TOKENS)
    assert verdict.silent_gaps == 1


def test_judge_sums_readers_and_says_whether_every_history_is_sound() -> None:
    whole = history(*tokens(1, 2, 3, 4, 5), ("done", 6))
    told = history(*tokens(1), ("cancelled", 2, {"reason": "owner_lost"}))
    hung = history(*tokens(1, 2))
    figures = judge([whole, told], TOKENS)
    assert figures["readers_whole"] == 1
    assert figures["readers_told"] == 1
    assert figures["histories_sound"] is True
    assert figures["ends_other_than_done"] == "cancelled owner_lost 1"
    figures = judge([whole, told, hung], TOKENS)
    assert figures["readers_hung"] == 1
    assert figures["histories_sound"] is False


def test_retries_told_are_counted_by_why_and_are_no_end() -> None:
    store = ("retry", None, {"code": "resume_store_unavailable"})
    h = history(*tokens(1, 2), store, store, *tokens(3, 4, 5), ("done", 6))
    figures = judge([h], TOKENS)
    assert figures["readers_whole"] == 1
    assert figures["retries_told"] == "resume_store_unavailable 2"
