"""Each check's verdict, its one line, and the run's exit status.

A check family's result is one part of the run's Report (experiment "check",
variant the check's name): it ran and its Checks were judged on its figures
(pass when every one holds, fail otherwise), or it was skipped with why (n/a:
the target lacks what the check needs), or it errored. A Check's `why` says
what a failure means and, where known, the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

from streamlab.experiments.render import cell
from streamlab.experiments.report import Check, Figure, Report, Table, judge

Verdict = Literal["pass", "fail", "n/a", "error"]
EXPERIMENT = "check"

# Exit statuses of `streamlab check`.
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def judged(name: str, story: str, figures: Mapping[str, Figure], checks: Iterable[Check]) -> Report:
    return Report(EXPERIMENT, name, story, dict(figures), judge(checks, figures))


def not_applicable(name: str, story: str, why: str,
                   figures: Mapping[str, Figure] | None = None) -> Report:
    return Report(EXPERIMENT, name, story, dict(figures or {}), status="skipped", reason=why)


def errored(name: str, story: str, why: str) -> Report:
    return Report(EXPERIMENT, name, story, status="error", reason=why)


def verdict(part: Report) -> Verdict:
    if part.status == "skipped":
        return "n/a"
    if part.status == "error":
        return "error"
    return "pass" if part.as_expected else "fail"


def evidence(part: Report) -> str:
    """What a failure rests on: each check that did not hold, with what was measured."""
    if part.status != "ran":
        return part.reason
    failed = [c for c in part.checks if not c.holds]
    return "; ".join(f"{c.description} (measured {cell(c.measured)})" for c in failed)


def fix(part: Report) -> str:
    return "; ".join(dict.fromkeys(c.check.why for c in part.checks if not c.holds and c.check.why))


def line(part: Report) -> str:
    """One line: `pass framing`, `fail heartbeat: <evidence> — <fix>`, `n/a cancel: <why>`."""
    shown = verdict(part)
    out = f"{shown:<5} {part.variant}"
    if shown == "pass":
        return out
    detail = evidence(part)
    remedy = fix(part) if shown == "fail" else ""
    return out + (f": {detail}" if detail else "") + (f" — {remedy}" if remedy else "")


# The figures each check's row shows (all of them are in --json and the JUnit).
HEADLINE: dict[str, tuple[str, ...]] = {
    "framing": ("events", "tokens"), "errors": ("bad_requests", "answered_5xx"),
    "first-byte": ("ttfb_s", "ttft_s"), "heartbeat": ("longest_silence_s", "comments"),
    "idle-cut": ("reached_done",), "cancel": ("gauge", "stopped_after_s"),
    "slow-reader": ("behaviour", "answer_bytes"), "resume": ("surfaces",),
    "concurrency": ("streams", "gap_p50_s", "gap_p99_s"),
}


def headline(part: Report) -> str:
    return ", ".join(f"{name} {cell(part.figures[name])}"
                     for name in HEADLINE.get(part.variant, ()) if name in part.figures)


def table(parts: Iterable[Report]) -> Table:
    rows = tuple((p.variant, verdict(p), headline(p),
                  evidence(p) if verdict(p) != "pass" else p.story) for p in parts)
    return Table("streamlab check", ("check", "verdict", "figures", "evidence / why"), rows,
                 caption="fails: the fix is in the lines below")


def exit_status(report: Report) -> int:
    """0 when every check passed or is n/a, 1 when one failed or errored."""
    return EXIT_OK if all(verdict(p) in ("pass", "n/a") for p in report.parts) else EXIT_FAILED
