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

from streamlab.exit_codes import EXIT_AS_EXPECTED, EXIT_UNEXPECTED, EXIT_UNREACHABLE, EXIT_USAGE
from streamlab.experiments.check.registry import REGISTRY
from streamlab.experiments.report import JSON, Check, Figure, Report, Table, figure_text, judge

Verdict = Literal["pass", "fail", "n/a", "error"]
EXPERIMENT = "check"
# The --json document's shape: raised when a field changes meaning or goes.
SCHEMA = "streamlab.check/2"


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
    return "; ".join(f"{c.description} (measured {figure_text(c.measured)})" for c in failed)


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


def headline(part: Report) -> str:
    """The figures the check's row shows (registry.CheckSpec.headline; all of
    them are in --json and the JUnit)."""
    spec = REGISTRY.get(part.variant)
    names = spec.headline if spec is not None else ()
    return ", ".join(f"{name} {figure_text(part.figures[name])}" for name in names
                     if name in part.figures)


def table(parts: Iterable[Report]) -> Table:
    rows = tuple((p.variant, verdict(p), headline(p),
                  evidence(p) if verdict(p) != "pass" else p.story) for p in parts)
    return Table("streamlab check", ("check", "verdict", "figures", "evidence / why"), rows,
                 caption="fails: the fix is in the lines below")


def exit_status(report: Report) -> int:
    """0 when every check passed or is n/a, 1 when one failed or errored."""
    return (EXIT_AS_EXPECTED if all(verdict(p) in ("pass", "n/a") for p in report.parts)
            else EXIT_UNEXPECTED)


def document(report: Report | None, *, url: str, model: str = "",
             error: tuple[str, str] | None = None) -> dict[str, JSON]:
    """What `streamlab check --json` prints, whatever happened: every check with
    its verdict in the words the text uses, its evidence and fix, its figures;
    or the error (kind, message) that kept the checks from running."""
    checks: list[JSON] = []
    for part in report.parts if report is not None else ():
        checks.append({
            "name": part.variant, "verdict": verdict(part), "story": part.story,
            "evidence": evidence(part) if verdict(part) != "pass" else "",
            "fix": fix(part) if verdict(part) == "fail" else "",
            "figures": dict(part.figures), "checks": [c.as_json() for c in part.checks]})
    exit_code = (EXIT_USAGE if error and error[0] == "usage" else
                 EXIT_UNREACHABLE if error else exit_status(report) if report else EXIT_UNEXPECTED)
    counts = {v: sum(c["verdict"] == v for c in checks if isinstance(c, dict))
              for v in ("pass", "fail", "n/a", "error")}
    hop = report.figures.get("hop") if report is not None else None
    return {"schema": SCHEMA, "url": url, "model": model, "hop": hop, "exit_status": exit_code,
            "summary": dict(counts), "checks": checks,
            "error": {"kind": error[0], "message": error[1]} if error else None}
