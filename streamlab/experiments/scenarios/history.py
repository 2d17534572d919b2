"""One judge of what resuming readers saw, shared by every scenario that cuts
them (the storms, the Redis restart, the store partition): each reader's
events in the order they arrived, across all its connections, checked the way
a user reading the text would check it.

    history = History()            # one per reader; its client appends as it parses
    history.saw("token", seq=7, at=time.monotonic())
    figures = judge(histories, tokens=100)

A reader's history is *whole* when it holds every token once, in order, and
ends with `done`. Anything else must be *said*: a missing stretch is fine
only after a `gap` event that names it (the log lost it and the reader was
told), and a stream that ends early is fine only with a terminal `error` or
`cancelled` (the reader knows nothing more will come). What the judge counts
against a run:

    duplicates     a seq seen twice (a resume that replayed what it had), or
                   a token's index seen twice under new seqs (a generation
                   replayed from its start)
    out_of_order   a seq not above the one before it
    misplaced      an event where none belongs: a token whose index is not
                   its seq - 1, a seq past the answer's end (N+1), a `done`
                   anywhere but N+1
    silent_gaps    seqs skipped with no `gap` event naming them
    hung           no terminal event by the reader's deadline: the hang this
                   module exists to catch (a reader waiting on a stream that
                   nobody will advance)

Sequences are the events' `id:` seqs (`<stream>:<seq>`): tokens are 1..N and
the terminal event N+1, so a whole history is exactly 1..N+1.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from streamlab.experiments.report import Figures

TERMINAL = frozenset({"done", "error", "cancelled"})


@dataclass(frozen=True)
class Seen:
    kind: str  # token, gap, retry, done, error, cancelled
    seq: int | None  # the event's id seq (None: no id, as `gap` and `retry`)
    at: float  # when it arrived (monotonic or perf_counter: one clock per run)
    # A gap: the seqs it names (first, last); a terminal event: its reason.
    missed: tuple[int, int] | None = None
    reason: str = ""
    index: int | None = None  # a token: the engine's index of it (its seq is index + 1)


@dataclass
class History:
    seen: list[Seen] = field(default_factory=list)

    def saw(self, kind: str, seq: int | None, at: float, data: str | bytes = b"") -> None:
        missed, reason, index = None, "", None
        if kind in ("gap", "retry", "token") or kind in TERMINAL:
            try:
                parsed = json.loads(data or b"{}")
            except ValueError:
                parsed = {}
            if not isinstance(parsed, dict):
                parsed = {}
            if kind == "gap":
                missed = (_seq(parsed.get("missed_from")), _seq(parsed.get("missed_to")))
            elif kind == "token":
                found = parsed.get("index")
                index = found if isinstance(found, int) else None
            else:
                reason = str(parsed.get("reason") or parsed.get("code") or "")
        self.seen.append(Seen(kind, seq, at, missed, reason, index))

    @property
    def terminal(self) -> Seen | None:
        return next((s for s in reversed(self.seen) if s.kind in TERMINAL), None)


def _seq(event_id: object) -> int:
    try:
        return int(str(event_id).rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return -1


@dataclass(frozen=True)
class Verdict:
    """One reader's history, judged."""

    whole: bool
    duplicates: int
    out_of_order: int
    misplaced: int
    silent_gaps: int  # seqs skipped without a gap event naming them
    told_gaps: int  # seqs skipped that a gap event named
    hung: bool
    end: str  # "done", "error <reason>", "cancelled <reason>", "none"


def judge_one(history: History, tokens: int) -> Verdict:
    seqs = [s.seq for s in history.seen if s.seq is not None]
    told: set[int] = set()
    for s in history.seen:
        if s.missed is not None and s.missed[0] > 0:
            told.update(range(s.missed[0], s.missed[1] + 1))
    counts = Counter(seqs)
    # A repeat: its seq came before, or (a token) its index did under another seq.
    duplicates = 0
    seqs_seen: set[int] = set()
    indexes_seen: set[int] = set()
    for s in history.seen:
        if s.seq is None:
            continue
        index = s.index if s.kind == "token" else None
        duplicates += s.seq in seqs_seen or (index is not None and index in indexes_seen)
        seqs_seen.add(s.seq)
        if index is not None:
            indexes_seen.add(index)
    misplaced = sum(1 for s in history.seen if s.seq is not None and (
        s.seq > tokens + 1
        or (s.kind == "token" and (s.seq > tokens or (s.index is not None
                                                      and s.index != s.seq - 1)))
        or (s.kind == "done" and s.seq != tokens + 1)))
    out_of_order = sum(1 for a, b in itertools.pairwise(seqs) if b < a)
    terminal = history.terminal
    # What should have come: every token, up to the last seq seen, or all N
    # of them when the stream says it is done.
    last = max(seqs, default=0)
    due = range(1, tokens + 2) if terminal is not None and terminal.kind == "done" \
        else range(1, last + 1)
    skipped = [seq for seq in due if seq not in counts]
    silent = sum(1 for seq in skipped if seq not in told)
    end = "none" if terminal is None else f"{terminal.kind} {terminal.reason}".strip()
    whole = (terminal is not None and terminal.kind == "done" and not skipped
             and duplicates == 0 and out_of_order == 0 and misplaced == 0
             and len(seqs) == tokens + 1)
    return Verdict(whole=whole, duplicates=duplicates, out_of_order=out_of_order,
                   misplaced=misplaced,
                   silent_gaps=silent, told_gaps=len(skipped) - silent,
                   hung=terminal is None, end=end)


def judge(histories: Sequence[History], tokens: int | Sequence[int]) -> Figures:
    """The figures every resume scenario shows and checks, for all readers
    (`tokens`: every stream's length, or each reader's)."""
    lengths = [tokens] * len(histories) if isinstance(tokens, int) else list(tokens)
    verdicts = [judge_one(h, n) for h, n in zip(histories, lengths, strict=True)]
    ends = Counter(v.end for v in verdicts if v.end != "done")
    retries = Counter(s.reason or "retry" for h in histories for s in h.seen if s.kind == "retry")
    return {
        "readers": len(verdicts),
        "readers_whole": sum(v.whole for v in verdicts),
        # Not whole, but said: a gap named, or an explicit terminal error/cancel.
        "readers_told": sum(not v.whole and not v.hung and v.silent_gaps == 0
                            and v.duplicates == 0 and v.out_of_order == 0
                            and v.misplaced == 0 for v in verdicts),
        "readers_hung": sum(v.hung for v in verdicts),
        "duplicates": sum(v.duplicates for v in verdicts),
        "out_of_order": sum(v.out_of_order for v in verdicts),
        "misplaced": sum(v.misplaced for v in verdicts),
        "silent_gaps": sum(v.silent_gaps for v in verdicts),
        "told_gaps": sum(v.told_gaps for v in verdicts),
        # Every reader ended whole or was told why not, none waited for nothing.
        "histories_sound": all(not v.hung and v.silent_gaps == 0 and v.duplicates == 0
                               and v.out_of_order == 0 and v.misplaced == 0
                               for v in verdicts),
        "ends_other_than_done": ", ".join(f"{k} {n}" for k, n in ends.most_common(4))
                                or "none",
        # `event: retry` told to readers, by why (the store unreachable, an
        # engine re-attach): trouble that passed, said and not an end.
        "retries_told": ", ".join(f"{k} {n}" for k, n in retries.most_common(3)) or "none",
    }
