"""One report for every experiment: a scenario's mode, the soak, each bench.

    Report
      ├── figures        name → number, flag or word: what was measured
      ├── checks         each Check judged on the figures (CheckResult): the verdict
      ├── other_checks   the opposite mode's checks on the same figures: whether
      │                  the checks discriminate (they must fail on the broken thing)
      ├── tables         rows of figures (a bench's cells, a soak's streams by kind)
      ├── artifacts      files the run wrote (plots, timelines), named and titled
      ├── parts          sub-reports (a bench's steps, a catalogue run's modes)
      └── status         ran | skipped | error, with the reason

A check names a figure, a comparison and a bound; a bound may follow the
(scaled) timing, so "TTFT ≤ prefill + 2 gaps + tolerance" stays true when the
time constants change. One judge (`judge`) turns checks and figures into
results for every experiment; one renderer (render.py) draws any report as a
table, JSON or a plot. No experiment hands a dict of unknown shape to another.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from streamlab.experiments.timing import Timing

JSON: TypeAlias = "str | int | float | bool | list[JSON] | dict[str, JSON] | None"
Figure: TypeAlias = float | int | bool | str | None
Figures: TypeAlias = dict[str, Figure]


def figure_text(value: Figure) -> str:
    """One figure as plain text: '-' for nothing measured, a whole number without
    decimals, few digits for small numbers, thousands separated from 10,000.
    Here, not in render.py: a check's reason and the verdicts' words in --json
    and the JUnit use it, below the renderer."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if abs(value) >= 10_000:
            return f"{value:,.0f}"
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return value


Op = Literal["<", "<=", ">", ">=", "==", "!="]
# Comparisons of figures whose types the check cannot know in advance: a
# mismatch (a word against a number) is a check that does not hold.
_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
}
Bound: TypeAlias = float | int | bool | str | Callable[[Timing], float] | None
Status = Literal["ran", "skipped", "error"]


@dataclass(frozen=True)
class Check:
    figure: str
    op: Op
    bound: Bound
    why: str = ""

    def limit(self, timing: Timing | None = None) -> Figure:
        """The bound's value; one that follows the timing needs the timing (the
        benches' and the soak's bounds are plain numbers and need none)."""
        if callable(self.bound):
            if timing is None:
                raise ValueError(f"{self.figure}'s bound follows the timing: judge it with one")
            return self.bound(timing)
        return self.bound

    def describe(self, timing: Timing | None = None) -> str:
        limit = self.limit(timing)
        shown = f"{limit:.3g}" if isinstance(limit, float) else repr(limit)
        return f"{self.figure} {self.op} {shown}"

    def as_json(self, timing: Timing | None = None) -> dict[str, JSON]:
        """The check as data; a bound that follows the timing shows its value at `timing`."""
        return {"figure": self.figure, "op": self.op, "bound": self.limit(timing),
                "bound_follows_timing": callable(self.bound), "check": self.describe(timing),
                "why": self.why}

    def holds(self, figures: Mapping[str, Figure], timing: Timing | None = None) -> bool:
        if self.figure not in figures:
            return False
        value, limit = figures[self.figure], self.limit(timing)
        if value is None and self.op not in ("==", "!="):
            return False  # e.g. no TTFT at all: no ordering claim can hold
        try:
            return bool(_OPS[self.op](value, limit))
        except TypeError:
            return False


@dataclass(frozen=True)
class CheckResult:
    check: Check
    description: str  # the check with its bound as judged ("ttft_s <= 0.45")
    holds: bool
    measured: Figure  # the figure's value (None when it was not measured)

    def as_json(self) -> dict[str, JSON]:
        return {"check": self.description, "figure": self.check.figure,
                "measured": self.measured, "holds": self.holds, "why": self.check.why}


def judge(checks: Iterable[Check], figures: Mapping[str, Figure], timing: Timing | None = None
          ) -> tuple[CheckResult, ...]:
    """The one judge: every check on the same figures, in order."""
    return tuple(CheckResult(c, c.describe(timing), c.holds(figures, timing),
                             figures.get(c.figure)) for c in checks)


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Figure, ...], ...]
    caption: str = ""

    def as_json(self) -> dict[str, JSON]:
        return {"title": self.title, "columns": list(self.columns),
                "rows": [list(row) for row in self.rows], "caption": self.caption}


@dataclass(frozen=True)
class Artifact:
    kind: Literal["plot", "timeline", "data"]
    path: str
    title: str

    def as_json(self) -> dict[str, JSON]:
        return {"kind": self.kind, "path": self.path, "title": self.title}


@dataclass(frozen=True)
class Report:
    experiment: str  # "buffering", "soak", "bench relay"
    variant: str = ""  # a scenario's mode, a bench's cell or step
    story: str = ""  # what this run shows, in a sentence
    figures: Figures = field(default_factory=dict)
    checks: tuple[CheckResult, ...] = ()
    other_checks: tuple[CheckResult, ...] = ()
    tables: tuple[Table, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    parts: tuple[Report, ...] = ()
    status: Status = "ran"
    reason: str = ""  # why it was skipped or errored

    @property
    def as_expected(self) -> bool:
        """Every check holds, here and in every part that ran."""
        return (self.status != "error" and all(c.holds for c in self.checks)
                and all(p.as_expected for p in self.parts))

    @property
    def discriminates(self) -> bool:
        """The opposite mode's checks do not all hold on these figures (vacuously
        true for a report with no opposite)."""
        return not self.other_checks or not all(c.holds for c in self.other_checks)

    @property
    def failures(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if not c.holds) + tuple(
            f for p in self.parts for f in p.failures)

    @property
    def verdict(self) -> str:
        if self.status != "ran":
            return self.status
        if not self.as_expected:
            return "UNEXPECTED"
        if self.variant == "broken":
            return "broke as expected"
        return "works as expected" if self.variant == "fixed" else "as expected"

    def explain(self) -> str:
        head = f"{self.experiment}" + (f" [{self.variant}]" if self.variant else "")
        lines = [f"{head} {self.verdict}" + (f": {self.story}" if self.story else "")
                 + (f" ({self.reason})" if self.reason else "")]
        lines += [f"  {'ok  ' if c.holds else 'FAIL'} {c.description}" for c in self.checks]
        if self.figures:
            lines += [f"  figures: {self.figures}"]
        lines += ["  " + line for p in self.parts for line in p.explain().splitlines()]
        return "\n".join(lines)

    def as_json(self) -> dict[str, JSON]:
        out: dict[str, JSON] = {
            "experiment": self.experiment, "variant": self.variant, "story": self.story,
            "status": self.status, "reason": self.reason, "verdict": self.verdict,
            "as_expected": self.as_expected, "figures": dict(self.figures),
            "checks": [c.as_json() for c in self.checks],
        }
        if self.other_checks:
            out["discriminates"] = self.discriminates
        if self.tables:
            out["tables"] = [t.as_json() for t in self.tables]
        if self.artifacts:
            out["artifacts"] = [a.as_json() for a in self.artifacts]
        if self.parts:
            out["parts"] = [p.as_json() for p in self.parts]
        return out
