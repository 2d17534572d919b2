"""Stop sequences over a token stream (OpenAI's `stop`), for every backend.

A stop sequence may span tokens ("brown" + " fox"), so text that could be the
start of one is held back until the next token says whether it was: nothing
of a stop sequence, and nothing after it, ever reaches the client. What comes
out, joined, is exactly the model's text up to the stop sequence that
completes first (or all of it, when none occurs), however it was tokenized.
"""

from __future__ import annotations

from dataclasses import dataclass

# OpenAI's limits: up to 4 sequences. The length bound keeps the hold-back small.
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256


@dataclass(frozen=True)
class Fed:
    text: str  # safe to send now (may be empty: all of it is held back)
    stopped: bool  # a stop sequence was found: send `text`, then finish


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> Fed:
        if not self._stops:  # the common case, once per token: nothing to look for
            return Fed(text, stopped=False)
        pending = self._held + text
        # The stop that *completes* first is the one a token-by-token model
        # would hit first, whichever starts first: the cut does not depend on
        # how the text was split into tokens.
        hits = [(i + len(stop), i) for stop in self._stops if (i := pending.find(stop)) >= 0]
        if hits:
            self._held = ""
            return Fed(pending[: min(hits)[1]], stopped=True)
        keep = self._partial_suffix(pending)
        self._held = pending[len(pending) - keep:] if keep else ""
        return Fed(pending[: len(pending) - keep], stopped=False)

    def flush(self) -> str:
        """At the end of the generation: what was held back was no stop after all."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """The length of the longest end of `text` that begins some stop sequence."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
