"""The soak's verdict: what each stream did, the figures of a run, the checks
on them, and the broken things each check is shown failing on.

    StreamRun      one client: its behaviour, its outcome, when it left, and what
                   the engine's record says happened to its generation
    Fault          one fault the soak injected (a toxic, an engine kill), with its window
    figures(...)   the run's figures, from the streams and the faults
    CHECKS         Check(figure, op, bound): every one must hold for a pass
    report(...)    the run as the one Report, CHECKS judged by the one judge
    SELF_TEST      each broken thing the soak is meant to catch, and the figures
                   whose checks must fail on it (`streamlab soak --self-test`,
                   self_test_part: the same judge, the other way round)

The verdict follows the scenarios' rule (streamlab/experiments/scenarios/runner.py): a
check that has never been seen failing on the thing it guards against proves
nothing, so every check here is named by a SELF_TEST entry, and the suite runs
them (tests/integration/test_soak.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from streamlab.experiments.report import JSON, Check, Figures, Report, Table, judge

# Streams whose behaviour is to read the answer to its end, one way or another.
COMPLETING = frozenset({"full", "think", "resume"})
# Clients that leave on purpose: their generation must be *cancelled*, never
# run to its end for nobody (a cut one may also have ended by itself).
LEAVING = frozenset({"abandon", "stall", "poll"})
COMPLETE_OUTCOMES = frozenset({"complete", "resumed_complete"})

# Of the streams that no injected fault touched, at least this share must
# complete (the rest: a slow machine's bad luck, e.g. a retry budget spent).
MIN_SURVIVOR_COMPLETION = 0.9
# With fewer untouched streams than this the run cannot judge completion at
# all, and says so by failing.
MIN_SURVIVORS = 3
# What the gateway's RSS may end at, relative to its start.
MAX_RSS_GROWTH = 1.2


@dataclass
class StreamRun:
    index: int
    behaviour: str
    started_at: float  # time.monotonic(), the clock the engine's records use too
    ended_at: float = 0.0
    outcome: str = ""
    request_id: str = ""  # the engine's record of this generation
    # When the client left (on purpose) or saw its stream end without a finish,
    # and how long its generation may run on after that; None: it did not leave.
    left_at: float | None = None
    leave_bound_s: float = 0.0
    # What the engine's record says: cancelled | failed | completed | running |
    # unseen (never reached the engine, or the engine restarted since).
    engine_state: str = ""
    engine_end_after_leave_s: float | None = None

    @property
    def left_on_purpose(self) -> bool:
        return self.behaviour in LEAVING

    @property
    def leaked(self) -> bool:
        """Its client left, and its generation did not end as it should have
        within the bound: still running, or (client gone on purpose) run to the end."""
        if self.left_at is None or self.engine_state in ("", "unseen"):
            return False
        if self.engine_state == "running":
            return True
        return self.left_on_purpose and self.engine_state == "completed"


@dataclass(frozen=True)
class Fault:
    kind: str  # a toxic's type on a hop ("edge:reset_peer"), or "engine_kill"
    start: float
    end: float
    # Destructive faults may cut a stream (reset, black hole, data limit, a
    # dead engine); the others (latency, bandwidth, slicer, slow close) only
    # slow it, so a stream they touch must still complete.
    destructive: bool

    def overlaps(self, start: float, end: float) -> bool:
        return self.start <= end and start <= self.end


@dataclass
class SoakRun:
    """Everything a soak observed; the figures are computed from it."""

    streams: list[StreamRun] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    engine_kills_asked: int = 0
    not_started: int = 0
    engine_left_running: int | None = None
    gateway_rss_start_mb: float | None = None
    gateway_rss_end_mb: float | None = None
    nginx_idle_cuts: int | None = None  # None: this lab has no nginx log to count in
    duration_s: float = 0.0

    def survivors(self) -> list[StreamRun]:
        """Streams meant to read to the end that no destructive fault overlapped."""
        return [s for s in self.streams if s.behaviour in COMPLETING
                and not any(f.destructive and f.overlaps(s.started_at, s.ended_at)
                            for f in self.faults)]


def figures(run: SoakRun) -> Figures:
    outcomes = Counter(s.outcome for s in run.streams)
    survivors = run.survivors()
    completed = sum(1 for s in survivors if s.outcome in COMPLETE_OUTCOMES)
    stalls = [s for s in run.streams if s.behaviour == "stall"]
    rss_growth = (run.gateway_rss_end_mb / run.gateway_rss_start_mb
                  if run.gateway_rss_start_mb and run.gateway_rss_end_mb is not None else None)
    kills = sum(1 for f in run.faults if f.kind == "engine_kill")
    result: Figures = {f"streams_{outcome}": count for outcome, count in sorted(outcomes.items())}
    result.update(
        streams=len(run.streams),
        not_started=run.not_started,
        hangs=outcomes["hang"],
        corrupt=outcomes["corrupt"],
        survivors=len(survivors),
        survivors_completed=completed,
        survivor_completion=round(completed / len(survivors), 3) if survivors else None,
        left=sum(1 for s in run.streams if s.left_at is not None),
        leaked_generations=sum(1 for s in run.streams if s.leaked),
        generations_unseen=sum(1 for s in run.streams
                               if s.left_at is not None and s.engine_state == "unseen"),
        stalls=len(stalls),
        stalls_cancelled=sum(1 for s in stalls if s.engine_state == "cancelled"),
        toxics_applied=sum(1 for f in run.faults if f.kind != "engine_kill"),
        engine_kills=kills,
        engine_kills_missed=run.engine_kills_asked - kills,
        engine_left_running=run.engine_left_running,
        nginx_idle_cuts=run.nginx_idle_cuts,
        gateway_rss_start_mb=_round(run.gateway_rss_start_mb),
        gateway_rss_end_mb=_round(run.gateway_rss_end_mb),
        gateway_rss_growth=_round(rss_growth, 3),
        duration_s=round(run.duration_s, 1),
    )
    return result


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


CHECKS: tuple[Check, ...] = (
    Check("hangs", "==", 0, "no client went a whole watchdog without a byte (the watchdog "
          "is longer than any legitimate silence); an error is not a hang"),
    Check("corrupt", "==", 0, "every text is the reference, or a prefix of it when cut: "
          "nothing lost in the middle, duplicated, or passed off as whole"),
    Check("survivors", ">=", MIN_SURVIVORS, "enough streams that no destructive fault "
          "touched to judge completion at all"),
    Check("survivor_completion", ">=", MIN_SURVIVOR_COMPLETION, "streams that no destructive "
          "fault touched complete, text exact"),
    Check("leaked_generations", "==", 0, "every generation whose client left is cancelled "
          "(or, cut, has ended) within its bound of the leave, by the engine's own record"),
    Check("engine_left_running", "==", 0, "nothing runs at the engine once the soak is over"),
    Check("nginx_idle_cuts", "==", 0, "heartbeats keep an idle-cutting hop open through "
          "a think pause longer than its timeout"),
    Check("gateway_rss_growth", "<=", MAX_RSS_GROWTH, "the gateway gives its memory back"),
    Check("engine_kills_missed", "==", 0, "every engine kill asked for happened"),
)


def report(run: SoakRun, knobs: Mapping[str, object], lab_fault: str = "",
           variant: str = "") -> Report:
    """The soak's Report: its figures judged by CHECKS (the one judge: every
    bound here is a plain number). `variant` names the broken thing it ran
    against, if any."""
    values = figures(run)
    values["knobs"] = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()))
    values["lab_fault"] = lab_fault
    return Report("soak", variant, story="clients of every behaviour against the lab, with "
                  "the faults asked for", figures=values, checks=judge(CHECKS, values))


def failed(soak: Report) -> list[str]:
    """The figures whose checks failed."""
    return [c.check.figure for c in soak.failures]


@dataclass(frozen=True)
class BrokenThing:
    """One thing the soak must catch, how a run is broken with it, and the
    checks that must fail on it."""

    name: str
    story: str
    guarded_by: tuple[str, ...]  # figures whose checks must fail
    knobs: Mapping[str, JSON] = field(default_factory=dict)  # every request's `streamlab`
    lab_fault: str = ""  # "engine_disabled" | "edge_black_hole", after the reference runs
    engine_kills: int = 0


SELF_TEST: tuple[BrokenThing, ...] = (
    BrokenThing("relay=detached_unbounded",
                "a background task drains each call into an unbounded queue: clients that "
                "leave or stop reading do not stop the engine",
                ("leaked_generations",), knobs={"relay": "detached_unbounded"}),
    BrokenThing("engine_errors=swallow",
                "an engine-hop failure ends the stream like a whole answer ([DONE]): "
                "the engine is killed mid-run",
                ("corrupt",), knobs={"engine_errors": "swallow"}, engine_kills=1),
    BrokenThing("job_ttl_s=0",
                "polling jobs never expire: a poller that walks away leaves its job "
                "generating to the end",
                ("leaked_generations",), knobs={"job_ttl_s": 0}),
    BrokenThing("heartbeat_s=0",
                "no `: ping` during a think pause longer than nginx's idle timeout "
                "(/short-timeout/)",
                ("nginx_idle_cuts",), knobs={"heartbeat_s": 0}),
    BrokenThing("engine hop disabled",
                "the engine hop is down for the whole run (after the reference runs)",
                ("survivor_completion",), lab_fault="engine_disabled"),
    BrokenThing("edge black-holed",
                "the edge accepts connections and never answers (timeout toxic, 0 = forever)",
                ("hangs",), lab_fault="edge_black_hole"),
)
BROKEN = {thing.name: thing for thing in SELF_TEST}


def self_test_part(thing: BrokenThing, soak: Report) -> Report:
    """A soak run against `thing`, judged the other way round: each check that
    guards against it must fail (the soak's own checks on the same figures are
    kept as `other_checks`; they must not all hold)."""
    held = {c.check.figure: c.holds for c in soak.checks}
    values: Figures = {**soak.figures, **{f"check_{g}_holds": held.get(g) for g in
                                          thing.guarded_by}}
    guards = tuple(Check(f"check_{g}_holds", "==", False,
                         f"the soak's check on {g} fails on {thing.name}")
                   for g in thing.guarded_by)
    return Report("soak", thing.name, story=thing.story, figures=values,
                  checks=judge(guards, values), other_checks=soak.checks)


SELF_TEST_COLUMNS = ("broken", "must fail", "failed", "verdict")


def self_test_report(parts: list[Report]) -> Report:
    """Every broken thing's run (self_test_part) and the lab as it is (must pass)."""
    rows = tuple((p.variant or "(none: the lab as it is)",
                  ", ".join(BROKEN[p.variant].guarded_by) if p.variant in BROKEN else "nothing",
                  ", ".join(failed(p) if p.variant not in BROKEN else
                            [c.check.figure for c in p.other_checks if not c.holds]) or "nothing",
                  "as expected" if p.as_expected else "UNEXPECTED") for p in parts)
    return Report("soak self-test", story="each broken thing fails the checks that guard "
                  "against it, and the lab as it is passes them all",
                  tables=(Table("soak self-test", SELF_TEST_COLUMNS, rows),), parts=tuple(parts))
