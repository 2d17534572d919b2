"""Stop sequences over a token stream: held back across tokens, never sent."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from services.engine.stop import StopMatcher


def run(stops: tuple[str, ...], tokens: list[str]) -> tuple[str, bool]:
    matcher, out = StopMatcher(stops), []
    for token in tokens:
        fed = matcher.feed(token)
        out.append(fed.text)
        if fed.stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_a_stop_inside_one_token_cuts_before_it() -> None:
    assert run(("fox",), ["the ", "quick ", "brown ", "fox ", "jumps "]) == ("the quick brown ",
                                                                              True)


def test_a_stop_across_tokens_is_held_back_until_it_is_sure() -> None:
    matcher = StopMatcher(("brown fox",))
    assert matcher.feed("the quick ").text == "the quick "
    held = matcher.feed("brown ")
    assert (held.text, held.stopped) == ("", False)  # might be the stop: wait
    assert matcher.feed("fox ").stopped


def test_held_text_that_was_no_stop_comes_out_with_the_next_token_or_at_the_end() -> None:
    assert run(("brown fox",), ["the ", "brown ", "dog"]) == ("the brown dog", False)
    assert run(("brown fox",), ["the ", "brown "]) == ("the brown ", False)


def test_the_stop_that_completes_first_wins_however_the_text_is_split() -> None:
    assert run(("dog", "quick"), ["the quick brown dog"]) == ("the ", True)
    # "abcd" starts first but "bc" completes first, in one token or in four.
    assert run(("abcd", "bc"), ["abcd"]) == ("a", True)
    assert run(("abcd", "bc"), list("abcd")) == ("a", True)


@given(text=st.text(alphabet="ab c", max_size=40),
       cuts=st.lists(st.integers(0, 40), max_size=8),
       stops=st.lists(st.text(alphabet="ab c", min_size=1, max_size=4), min_size=1,
                      max_size=4))
def test_output_is_the_text_up_to_the_first_stop_however_it_is_split(
    text: str, cuts: list[int], stops: list[str]
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    tokens = [text[a:b] for a, b in itertools.pairwise(bounds)]
    found = [(i + len(stop), i) for stop in stops if (i := text.find(stop)) >= 0]
    expected = (text[: min(found)[1]], True) if found else (text, False)
    assert run(tuple(stops), tokens) == expected
