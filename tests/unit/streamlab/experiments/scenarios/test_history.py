"""The shared judge of resuming readers' histories (scenarios/history.py):
each failure it exists to catch, and the histories it must accept."""

from __future__ import annotations

import json
from collections.abc import Mapping

from streamlab.experiments.scenarios.history import History, judge, judge_one

TOKENS = 5
STREAM = "s1"


Event = tuple[str, int | None] | tuple[str, int | None, Mapping[str, object]]


def history(*events: Event) -> History:
    h = History()
    for k, event in enumerate(events):
        kind, seq, *data = event
        h.saw(kind, seq, float(k), json.dumps(data[0]) if data else b"")
    return h


def tokens(*seqs: int) -> list[tuple[str, int | None]]:
    return [("token", s) for s in seqs]


def indexed(*pairs: tuple[int, int]) -> list[Event]:
    """Tokens as the gateway sends them: (seq, the engine's index)."""
    return [("token", seq, {"index": index, "text": f"t{index} "}) for seq, index in pairs]


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


def test_a_whole_history_with_indexes_is_whole() -> None:
    verdict = judge_one(history(*indexed(*((seq, seq - 1) for seq in range(1, 6))),
                                ("done", 6)), TOKENS)
    assert verdict.whole
    assert verdict.misplaced == 0


def test_a_generation_replayed_from_its_start_under_new_ids_is_caught() -> None:
    """A taken-over stream that attached "from the first" again: tokens 0..2
    come back as seqs 4..6, then the rest; every seq is new, so only the
    indexes show the text twice."""
    replayed = history(*indexed((1, 0), (2, 1), (3, 2), (4, 0), (5, 1), (6, 2), (7, 3),
                                (8, 4)), ("done", 9))
    verdict = judge_one(replayed, TOKENS)
    assert not verdict.whole
    assert verdict.duplicates == 3
    assert verdict.misplaced >= 3
    figures = judge([replayed], TOKENS)
    assert figures["histories_sound"] is False
    assert figures["readers_told"] == 0


def test_tokens_past_the_answers_end_and_an_early_done_are_misplaced() -> None:
    extra = judge_one(history(*tokens(1, 2, 3, 4, 5, 6, 7), ("done", 8)), TOKENS)
    assert extra.misplaced == 3  # seqs 6 and 7 are past token N, done is not at N + 1
    assert not extra.whole
    ended_early = history(*tokens(1, 2, 3), ("done", 4))
    early = judge_one(ended_early, TOKENS)
    assert early.misplaced == 1
    assert not early.whole
    assert judge([ended_early], TOKENS)["histories_sound"] is False
